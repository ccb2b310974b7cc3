//! The one conversion pair between the workspace's element types ([`et_error::DType`], what blob-format,
//! program-manifest and ref-graph name) and the ABI's element-type codes, in one place.
//!
//! The ABI's codes are stable numbers on the boundary, numbered independently of the vocabulary (which may
//! learn a type before the ABI carries it), so they convert by variant, never by name or number.

use et_error::DType;

use crate::tensor::DTypeCode;

/// A wire-format element type that has no ABI code in this build (the wire format may know more types than
/// the ABI carries).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("element type {0} cannot cross the plugin ABI (it has no ABI dtype code in this build)")]
pub struct NoDTypeCode(pub DType);

impl TryFrom<DType> for DTypeCode {
    type Error = NoDTypeCode;

    fn try_from(dtype: DType) -> Result<DTypeCode, NoDTypeCode> {
        Ok(match dtype {
            DType::F32 => DTypeCode::F32,
            DType::F16 => DTypeCode::F16,
            DType::BF16 => DTypeCode::BF16,
            DType::F64 => DTypeCode::F64,
            DType::I8 => DTypeCode::I8,
            DType::U8 => DTypeCode::U8,
            DType::I32 => DTypeCode::I32,
            DType::I64 => DTypeCode::I64,
            DType::Bool => DTypeCode::Bool,
            other => return Err(NoDTypeCode(other)),
        })
    }
}

impl From<DTypeCode> for DType {
    fn from(code: DTypeCode) -> DType {
        match code {
            DTypeCode::F32 => DType::F32,
            DTypeCode::F16 => DType::F16,
            DTypeCode::BF16 => DType::BF16,
            DTypeCode::F64 => DType::F64,
            DTypeCode::I8 => DType::I8,
            DTypeCode::U8 => DType::U8,
            DTypeCode::I32 => DType::I32,
            DTypeCode::I64 => DType::I64,
            DTypeCode::Bool => DType::Bool,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips_through_the_wire_type_of_the_same_name_and_size() {
        for code in DTypeCode::ALL {
            let dtype = DType::from(code);
            assert_eq!(dtype.name(), code.name());
            assert_eq!(dtype.size_bytes(), code.size_bytes());
            assert_eq!(DTypeCode::try_from(dtype), Ok(code));
        }
        for dtype in DType::ALL {
            assert_eq!(DTypeCode::try_from(dtype).map(|c| c.name()), Ok(dtype.name()));
        }
    }
}
