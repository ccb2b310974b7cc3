//! [`DType`]: what a tensor's elements are, in a blob's bindings, a program manifest, a cache file and a
//! graph's declarations alike (the plugin ABI carries it as its own numbered code, `delegate_abi::DTypeCode`).

use std::fmt;

/// Element type of a tensor.
///
/// Non-exhaustive: a format may learn a type before every consumer does, so a match on it has a fallback
/// (an encoding with no name for it refuses it, naming it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DType {
    /// 32-bit float.
    F32,
    /// 16-bit IEEE float.
    F16,
    /// bfloat16.
    BF16,
    /// 64-bit float.
    F64,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// Boolean, one byte.
    Bool,
}

impl DType {
    /// Every dtype this build knows.
    pub const ALL: [DType; 9] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F64,
        DType::I8,
        DType::U8,
        DType::I32,
        DType::I64,
        DType::Bool,
    ];

    /// Size of one element in bytes.
    pub const fn size_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::F64 | DType::I64 => 8,
            DType::I8 | DType::U8 | DType::Bool => 1,
        }
    }

    /// The lowercase name used in text formats and messages (`"f32"`, `"i64"`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F64 => "f64",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::Bool => "bool",
        }
    }

    /// Parses a [`DType::name`]; `None` for anything else.
    pub fn from_name(name: &str) -> Option<DType> {
        Self::ALL.into_iter().find(|dtype| dtype.name() == name)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_is_named_and_sized() {
        let named: Vec<(&str, usize)> = DType::ALL.into_iter().map(|d| (d.name(), d.size_bytes())).collect();
        assert_eq!(
            named,
            [
                ("f32", 4),
                ("f16", 2),
                ("bf16", 2),
                ("f64", 8),
                ("i8", 1),
                ("u8", 1),
                ("i32", 4),
                ("i64", 8),
                ("bool", 1)
            ]
        );
        for dtype in DType::ALL {
            assert_eq!(DType::from_name(dtype.name()), Some(dtype));
            assert_eq!(dtype.to_string(), dtype.name());
        }
        assert_eq!(DType::from_name("float32"), None);
    }
}
