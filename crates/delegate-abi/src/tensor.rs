//! Tensor views as they cross the boundary: `#[repr(C)]`, fixed size, no allocation per call.
//!
//! # Codes on the wire
//!
//! [`DTypeCode`] and [`MemoryKind`] (the workspace's vocabulary, et-error's) are Rust enums: a byte outside their variants, read as one of them, is
//! undefined behaviour. So they cross as one-byte integer newtypes, [`RawDType`] and [`RawMemoryKind`], that
//! any byte may occupy, and are decoded with `TryFrom` (an unknown byte is an [`UnknownCode`]).
//!
//! A raw code can only be made from a known variant (`From<DTypeCode>`, `From<MemoryKind>`), so every
//! [`TensorArg`] built in Rust holds known codes. One read from the other side of the ABI may not: every
//! place where such an arg enters is checked once, before anything reads it (the plugin's `execute` entry,
//! which answers `InvalidArgument` naming the argument position and the byte without calling the delegate;
//! [`crate::host::ArgList::push_raw`]). That is why [`TensorArg::dtype`] and [`TensorArg::memory`] are
//! infallible for a delegate: one byte comparison per code per call buys it.

use std::ffi::c_void;
use std::fmt;

use abi_stable::StableAbi;

/// Largest rank a [`TensorArg`] carries inline.
pub const MAX_RANK: usize = 8;

/// Where a tensor's bytes live: the workspace's one memory-kind vocabulary, [`et_error::MemoryKind`]. Crosses
/// the ABI as a [`RawMemoryKind`], its `repr(C)` mirror.
pub use et_error::MemoryKind;

/// Element types, with stable numbers on the wire of the ABI (independent of `blob-format`'s enum order).
/// Crosses the ABI as a [`RawDType`].
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DTypeCode {
    /// 32-bit float.
    F32 = 0,
    /// 16-bit IEEE float.
    F16 = 1,
    /// bfloat16.
    BF16 = 2,
    /// 64-bit float.
    F64 = 3,
    /// Signed 8-bit integer.
    I8 = 4,
    /// Unsigned 8-bit integer.
    U8 = 5,
    /// Signed 32-bit integer.
    I32 = 6,
    /// Signed 64-bit integer.
    I64 = 7,
    /// Boolean, one byte.
    Bool = 8,
}

impl DTypeCode {
    /// Every code.
    pub const ALL: [DTypeCode; 9] = [
        DTypeCode::F32,
        DTypeCode::F16,
        DTypeCode::BF16,
        DTypeCode::F64,
        DTypeCode::I8,
        DTypeCode::U8,
        DTypeCode::I32,
        DTypeCode::I64,
        DTypeCode::Bool,
    ];

    /// Size of one element in bytes.
    pub const fn size_bytes(self) -> usize {
        match self {
            DTypeCode::F32 | DTypeCode::I32 => 4,
            DTypeCode::F16 | DTypeCode::BF16 => 2,
            DTypeCode::F64 | DTypeCode::I64 => 8,
            DTypeCode::I8 | DTypeCode::U8 | DTypeCode::Bool => 1,
        }
    }

    /// `"f32"`, `"i64"`, ... (the same spelling as `blob-format`).
    pub const fn name(self) -> &'static str {
        match self {
            DTypeCode::F32 => "f32",
            DTypeCode::F16 => "f16",
            DTypeCode::BF16 => "bf16",
            DTypeCode::F64 => "f64",
            DTypeCode::I8 => "i8",
            DTypeCode::U8 => "u8",
            DTypeCode::I32 => "i32",
            DTypeCode::I64 => "i64",
            DTypeCode::Bool => "bool",
        }
    }

    /// Parses a [`DTypeCode::name`].
    pub fn from_name(name: &str) -> Option<DTypeCode> {
        Self::ALL.into_iter().find(|code| code.name() == name)
    }
}

impl fmt::Display for DTypeCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which code an [`UnknownCode`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CodeKind {
    /// A [`RawDType`].
    DType,
    /// A [`RawMemoryKind`].
    Memory,
}

impl fmt::Display for CodeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CodeKind::DType => "dtype",
            CodeKind::Memory => "memory kind",
        })
    }
}

/// A byte on the wire that is not a code this build knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{kind} code {byte} is not one this build knows (0..={max})", max = self.max_known())]
pub struct UnknownCode {
    /// Which code.
    pub kind: CodeKind,
    /// The byte as it crossed.
    pub byte: u8,
}

impl UnknownCode {
    fn max_known(&self) -> usize {
        match self.kind {
            CodeKind::DType => DTypeCode::ALL.len() - 1,
            CodeKind::Memory => MemoryKind::ALL.len() - 1,
        }
    }
}

impl et_error::HasErrorCode for UnknownCode {
    fn error_code(&self) -> et_error::ErrorCode {
        et_error::ErrorCode::InvalidArgument
    }
}

/// A [`DTypeCode`] as it crosses: one byte that may hold any value, so reading it from the other side is
/// never undefined behaviour. Made only from a [`DTypeCode`]; decoded with `DTypeCode::try_from`.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, StableAbi)]
pub struct RawDType(u8);

/// A [`MemoryKind`] as it crosses: one byte that may hold any value, so reading it from the other side is
/// never undefined behaviour. Made only from a [`MemoryKind`]; decoded with `MemoryKind::try_from`.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, StableAbi)]
pub struct RawMemoryKind(u8);

/// The conversions of a one-byte wire code `$raw` for the enum `$code` (whose `ALL` lists it in code order):
/// made only from a `$code`, decoded with `TryFrom`, printed as the value or as the unknown byte.
macro_rules! raw_code {
    ($raw:ident, $code:ident, $kind:expr, $what:literal) => {
        impl $raw {
            /// The byte.
            pub const fn get(self) -> u8 {
                self.0
            }
        }

        impl From<$code> for $raw {
            fn from(code: $code) -> $raw {
                $raw(code as u8)
            }
        }

        impl TryFrom<$raw> for $code {
            type Error = UnknownCode;

            fn try_from(raw: $raw) -> Result<$code, UnknownCode> {
                $code::ALL.get(usize::from(raw.0)).copied().ok_or(UnknownCode { kind: $kind, byte: raw.0 })
            }
        }

        impl fmt::Debug for $raw {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match $code::try_from(*self) {
                    Ok(code) => write!(f, "{code}"),
                    Err(_) => write!(f, concat!("unknown ", $what, " code {}"), self.0),
                }
            }
        }
    };
}

raw_code!(RawDType, DTypeCode, CodeKind::DType, "dtype");
// The one conversion pair between the vocabulary's memory kinds and their mirror on the wire: a kind's byte is
// its stable number (`et_error::MemoryKind`'s discriminant, `ALL` in that order).
raw_code!(RawMemoryKind, MemoryKind, CodeKind::Memory, "memory kind");

impl TryFrom<u8> for DTypeCode {
    type Error = UnknownCode;

    fn try_from(byte: u8) -> Result<DTypeCode, UnknownCode> {
        DTypeCode::try_from(RawDType(byte))
    }
}

/// [`TensorArg::flags`] bit: the delegate may write the bytes (outputs, and inputs that an output aliases).
pub const ARG_WRITABLE: u32 = 1 << 0;

/// [`TensorArg::flags`] bit: a writable input, i.e. caller-owned state (a KV cache) the delegate reads and
/// updates in place. Always set together with [`ARG_WRITABLE`]; an in-place output shares its storage.
pub const ARG_INOUT: u32 = 1 << 1;

/// One delegate argument: a view of caller memory plus its metadata. Plain data, `Copy`, no destructor.
#[repr(C)]
#[derive(Clone, Copy, StableAbi)]
pub struct TensorArg {
    /// First byte (host or device address); may be null when `nbytes` is 0.
    pub data: *mut c_void,
    /// Size in bytes.
    pub nbytes: u64,
    /// Number of valid entries in `shape`.
    pub rank: u32,
    /// Flags, see [`ARG_WRITABLE`] and [`ARG_INOUT`].
    pub flags: u32,
    /// Extents, the first `rank` valid.
    pub shape: [i64; MAX_RANK],
    /// CUDA device ordinal for device and managed memory; 0 otherwise.
    pub device_id: i32,
    /// Element type, as it crosses (read it with [`TensorArg::dtype`]).
    pub dtype: RawDType,
    /// Where the bytes live, as it crosses (read it with [`TensorArg::memory`]).
    pub memory: RawMemoryKind,
    /// Reserved, zero.
    pub reserved: [u8; 2],
}

impl TensorArg {
    /// Metadata without memory, e.g. to describe what a call expects.
    pub fn describe(dtype: DTypeCode, shape: &[i64], memory: MemoryKind) -> Option<TensorArg> {
        if shape.len() > MAX_RANK {
            return None;
        }
        let mut dims = [0i64; MAX_RANK];
        dims[..shape.len()].copy_from_slice(shape);
        Some(TensorArg {
            data: std::ptr::null_mut(),
            nbytes: 0,
            rank: shape.len() as u32,
            flags: 0,
            shape: dims,
            device_id: 0,
            dtype: dtype.into(),
            memory: memory.into(),
            reserved: [0; 2],
        })
    }

    /// The valid extents.
    pub fn dims(&self) -> &[i64] {
        &self.shape[..(self.rank as usize).min(MAX_RANK)]
    }

    /// Product of the extents (1 for a scalar), or `None` if an extent is negative or it overflows.
    pub fn numel(&self) -> Option<u64> {
        self.dims().iter().try_fold(1u64, |acc, &d| u64::try_from(d).ok().and_then(|d| acc.checked_mul(d)))
    }

    /// Element type.
    ///
    /// # Panics
    /// Never for an arg built in Rust or handed to a delegate by delegate-abi (see the module docs); only for
    /// one read from foreign memory by other code without [`TensorArg::check_codes`].
    pub fn dtype(&self) -> DTypeCode {
        DTypeCode::try_from(self.dtype).expect("a TensorArg's codes are checked where it enters from the ABI")
    }

    /// Where the bytes live.
    ///
    /// # Panics
    /// As [`TensorArg::dtype`].
    pub fn memory(&self) -> MemoryKind {
        MemoryKind::try_from(self.memory)
            .expect("a TensorArg's codes are checked where it enters from the ABI")
    }

    /// Checks that both codes are ones this build knows: what delegate-abi does wherever an arg enters from
    /// the other side of the ABI, before anything reads it.
    pub fn check_codes(&self) -> Result<(), UnknownCode> {
        DTypeCode::try_from(self.dtype)?;
        MemoryKind::try_from(self.memory)?;
        Ok(())
    }

    /// Whether the delegate may write it.
    pub fn is_writable(&self) -> bool {
        self.flags & ARG_WRITABLE != 0
    }

    /// Whether the two args' byte ranges intersect (an empty range intersects nothing).
    pub fn overlaps(&self, other: &TensorArg) -> bool {
        if self.nbytes == 0 || other.nbytes == 0 {
            return false;
        }
        let (a, b) = (self.data as usize as u128, other.data as usize as u128);
        a < b + u128::from(other.nbytes) && b < a + u128::from(self.nbytes)
    }

    /// Whether it is a writable input (caller-owned state updated in place).
    pub fn is_inout(&self) -> bool {
        self.flags & ARG_INOUT != 0
    }

    /// Whether both args are the same storage: same address and size (an input and its in-place output).
    pub fn same_storage(&self, other: &TensorArg) -> bool {
        self.data == other.data && self.nbytes == other.nbytes
    }

    /// # Safety
    /// The arg must be host-visible and valid for reads of `nbytes` for `'a`.
    pub(crate) unsafe fn host_bytes<'a>(&self) -> &'a [u8] {
        if self.nbytes == 0 || self.data.is_null() {
            return &[];
        }
        // SAFETY: the caller guarantees `data` is valid for reads of `nbytes` for 'a; nbytes fits in memory
        // because the storage exists.
        unsafe { std::slice::from_raw_parts(self.data as *const u8, self.nbytes as usize) }
    }

    /// # Safety
    /// The arg must be host-visible, writable and valid for writes of `nbytes` for `'a`, and no other
    /// reference to its bytes may live during `'a`.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn host_bytes_mut<'a>(&self) -> &'a mut [u8] {
        if self.nbytes == 0 || self.data.is_null() {
            return &mut [];
        }
        // SAFETY: the caller guarantees exclusive, writable access to `nbytes` bytes at `data` for 'a.
        unsafe { std::slice::from_raw_parts_mut(self.data as *mut u8, self.nbytes as usize) }
    }
}

impl fmt::Debug for TensorArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TensorArg")
            .field("data", &self.data)
            .field("nbytes", &self.nbytes)
            .field("dtype", &self.dtype)
            .field("shape", &self.dims())
            .field("memory", &self.memory)
            .field("device_id", &self.device_id)
            .field("writable", &self.is_writable())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_numbers_are_the_positions_in_all_and_round_trip() {
        for (index, code) in DTypeCode::ALL.into_iter().enumerate() {
            assert_eq!(usize::from(RawDType::from(code).get()), index, "{code}");
            assert_eq!(DTypeCode::try_from(RawDType::from(code)), Ok(code));
        }
        // The vocabulary's numbers are the wire's: host 0, device 1, managed 2, pinned 3.
        assert_eq!(MemoryKind::ALL.map(|kind| RawMemoryKind::from(kind).get()), [0, 1, 2, 3]);
        for (index, kind) in MemoryKind::ALL.into_iter().enumerate() {
            assert_eq!(usize::from(RawMemoryKind::from(kind).get()), index, "{kind}");
            assert_eq!(MemoryKind::try_from(RawMemoryKind::from(kind)), Ok(kind));
        }
    }

    #[test]
    fn unknown_bytes_are_errors_naming_the_byte() {
        let err = DTypeCode::try_from(9u8).expect_err("unknown");
        assert_eq!(err, UnknownCode { kind: CodeKind::DType, byte: 9 });
        assert_eq!(err.to_string(), "dtype code 9 is not one this build knows (0..=8)");
        let err = MemoryKind::try_from(RawMemoryKind(200)).expect_err("unknown");
        assert_eq!(err.to_string(), "memory kind code 200 is not one this build knows (0..=3)");
        assert_eq!(et_error::HasErrorCode::error_code(&err), et_error::ErrorCode::InvalidArgument);
    }

    #[test]
    fn an_arg_with_an_unknown_code_fails_its_check_and_debug_names_the_byte() {
        let mut arg = TensorArg::describe(DTypeCode::F32, &[2], MemoryKind::Host).expect("rank 1");
        assert_eq!(arg.check_codes(), Ok(()));
        arg.dtype = RawDType(77);
        assert_eq!(arg.check_codes(), Err(UnknownCode { kind: CodeKind::DType, byte: 77 }));
        assert!(format!("{arg:?}").contains("unknown dtype code 77"));
        arg.dtype = DTypeCode::I64.into();
        arg.memory = RawMemoryKind(4);
        assert_eq!(arg.check_codes(), Err(UnknownCode { kind: CodeKind::Memory, byte: 4 }));
    }
}
