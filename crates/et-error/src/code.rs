//! ExecuTorch's numeric error codes (`runtime/core/error.h`) and [`HasErrorCode`], the trait every typed error
//! implements.
//!
//! The numeric values are part of the ABI: they never change, and codes this build does not know survive a
//! round trip through [`ErrorCode::from_u32`] as [`ErrorCode::Unknown`].

use std::fmt;

/// An ExecuTorch error code, as `executorch::runtime::Error` numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// 0x00: success.
    Ok,
    /// 0x01: an internal error, e.g. a bug or a panic caught at the ABI boundary.
    Internal,
    /// 0x02: the object is not in a state that allows this call (e.g. a poisoned plugin).
    InvalidState,
    /// 0x10: the operation is not supported by this build, device or backend.
    NotSupported,
    /// 0x11: the operation is not implemented yet.
    NotImplemented,
    /// 0x12: an argument of the call is invalid (count, dtype, shape, memory kind).
    InvalidArgument,
    /// 0x13: an object has the wrong type.
    InvalidType,
    /// 0x20: something named was not found.
    NotFound,
    /// 0x21: a memory allocation failed.
    MemoryAllocationFailed,
    /// 0x22: reading or writing a resource failed.
    AccessFailed,
    /// 0x23: the program (blob, manifest, alias table) is malformed or inconsistent.
    InvalidProgram,
    /// 0x25: a resource (device memory, handles) ran out.
    OutOfResources,
    /// 0x30: the delegate cannot read this blob (format or engine version).
    DelegateInvalidCompatibility,
    /// 0x31: the delegate could not allocate memory.
    DelegateMemoryAllocationFailed,
    /// 0x32: the delegate handle is invalid (destroyed, or from another plugin).
    DelegateInvalidHandle,
    /// A code this build does not know, kept verbatim.
    Unknown(u32),
}

impl ErrorCode {
    /// Every code this build knows, in numeric order.
    pub const KNOWN: [ErrorCode; 15] = [
        ErrorCode::Ok,
        ErrorCode::Internal,
        ErrorCode::InvalidState,
        ErrorCode::NotSupported,
        ErrorCode::NotImplemented,
        ErrorCode::InvalidArgument,
        ErrorCode::InvalidType,
        ErrorCode::NotFound,
        ErrorCode::MemoryAllocationFailed,
        ErrorCode::AccessFailed,
        ErrorCode::InvalidProgram,
        ErrorCode::OutOfResources,
        ErrorCode::DelegateInvalidCompatibility,
        ErrorCode::DelegateMemoryAllocationFailed,
        ErrorCode::DelegateInvalidHandle,
    ];

    /// The numeric value ExecuTorch uses.
    pub const fn as_u32(self) -> u32 {
        match self {
            ErrorCode::Ok => 0x00,
            ErrorCode::Internal => 0x01,
            ErrorCode::InvalidState => 0x02,
            ErrorCode::NotSupported => 0x10,
            ErrorCode::NotImplemented => 0x11,
            ErrorCode::InvalidArgument => 0x12,
            ErrorCode::InvalidType => 0x13,
            ErrorCode::NotFound => 0x20,
            ErrorCode::MemoryAllocationFailed => 0x21,
            ErrorCode::AccessFailed => 0x22,
            ErrorCode::InvalidProgram => 0x23,
            ErrorCode::OutOfResources => 0x25,
            ErrorCode::DelegateInvalidCompatibility => 0x30,
            ErrorCode::DelegateMemoryAllocationFailed => 0x31,
            ErrorCode::DelegateInvalidHandle => 0x32,
            ErrorCode::Unknown(code) => code,
        }
    }

    /// The code for a numeric value; values this build does not know become [`ErrorCode::Unknown`].
    pub fn from_u32(value: u32) -> ErrorCode {
        Self::KNOWN.into_iter().find(|code| code.as_u32() == value).unwrap_or(ErrorCode::Unknown(value))
    }

    /// ExecuTorch's name for the code (`"InvalidProgram"`), or `"Unknown"`.
    pub const fn name(self) -> &'static str {
        match self {
            ErrorCode::Ok => "Ok",
            ErrorCode::Internal => "Internal",
            ErrorCode::InvalidState => "InvalidState",
            ErrorCode::NotSupported => "NotSupported",
            ErrorCode::NotImplemented => "NotImplemented",
            ErrorCode::InvalidArgument => "InvalidArgument",
            ErrorCode::InvalidType => "InvalidType",
            ErrorCode::NotFound => "NotFound",
            ErrorCode::MemoryAllocationFailed => "MemoryAllocationFailed",
            ErrorCode::AccessFailed => "AccessFailed",
            ErrorCode::InvalidProgram => "InvalidProgram",
            ErrorCode::OutOfResources => "OutOfResources",
            ErrorCode::DelegateInvalidCompatibility => "DelegateInvalidCompatibility",
            ErrorCode::DelegateMemoryAllocationFailed => "DelegateMemoryAllocationFailed",
            ErrorCode::DelegateInvalidHandle => "DelegateInvalidHandle",
            ErrorCode::Unknown(_) => "Unknown",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (0x{:02x})", self.name(), self.as_u32())
    }
}

/// Implemented by every error type in the workspace that can reach a user or cross the ABI.
pub trait HasErrorCode {
    /// The ExecuTorch code this error is reported with.
    fn error_code(&self) -> ErrorCode;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numeric_values_match_executorch() {
        let expected: [(ErrorCode, u32); 15] = [
            (ErrorCode::Ok, 0x00),
            (ErrorCode::Internal, 0x01),
            (ErrorCode::InvalidState, 0x02),
            (ErrorCode::NotSupported, 0x10),
            (ErrorCode::NotImplemented, 0x11),
            (ErrorCode::InvalidArgument, 0x12),
            (ErrorCode::InvalidType, 0x13),
            (ErrorCode::NotFound, 0x20),
            (ErrorCode::MemoryAllocationFailed, 0x21),
            (ErrorCode::AccessFailed, 0x22),
            (ErrorCode::InvalidProgram, 0x23),
            (ErrorCode::OutOfResources, 0x25),
            (ErrorCode::DelegateInvalidCompatibility, 0x30),
            (ErrorCode::DelegateMemoryAllocationFailed, 0x31),
            (ErrorCode::DelegateInvalidHandle, 0x32),
        ];
        for (code, value) in expected {
            assert_eq!(code.as_u32(), value, "{code:?}");
            assert_eq!(ErrorCode::from_u32(value), code);
        }
    }

    #[test]
    fn unknown_codes_round_trip() {
        assert_eq!(ErrorCode::from_u32(0x24), ErrorCode::Unknown(0x24));
        assert_eq!(ErrorCode::Unknown(0x24).as_u32(), 0x24);
        assert_eq!(ErrorCode::Unknown(0x99).to_string(), "Unknown (0x99)");
    }
}
