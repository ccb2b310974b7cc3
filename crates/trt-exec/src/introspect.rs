//! Engine I/O introspection as plain data: captured from a network at build time or from a deserialized engine,
//! serialisable to JSON (test fixtures), and answering alias-validate's [`EngineIntrospect`].

use alias_validate::engine::{EngineIntrospect, EngineTensor};
use blob_format::model::{DType, Dim, Role};
use serde::{Deserialize, Serialize};

/// One engine I/O tensor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoTensor {
    /// The tensor's name in the engine.
    pub name: String,
    /// `"input"` or `"output"`.
    pub mode: IoMode,
    /// Element type name (`"f32"`, `"i32"`, ...); TensorRT types this build does not map are kept as
    /// `"trt:<TensorRT name>"`.
    pub dtype: String,
    /// Extents; `-1` is a dynamic extent (decided per call within the optimisation profile).
    pub shape: Vec<i64>,
}

/// Input or output, as TensorRT's `TensorIOMode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IoMode {
    /// `kINPUT`.
    Input,
    /// `kOUTPUT`.
    Output,
}

impl From<IoMode> for Role {
    fn from(mode: IoMode) -> Role {
        match mode {
            IoMode::Input => Role::Input,
            IoMode::Output => Role::Output,
        }
    }
}

/// An output the engine writes in place into an input (`getAliasedInputTensor`, or at build time the
/// network's `IKVCacheUpdateLayer` output and its cache input).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AliasPair {
    /// The output tensor.
    pub output: String,
    /// The input it aliases.
    pub input: String,
}

/// Everything the binding plan needs to know about an engine, whoever captured it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineIo {
    /// Library that built or loaded the engine, e.g. `"TensorRT-RTX 1.7.1.116"`.
    pub library: Option<String>,
    /// Whether the library can report aliases (TensorRT-RTX 1.7+).
    pub reports_aliases: bool,
    /// I/O tensors in the engine's own order.
    pub tensors: Vec<IoTensor>,
    /// Output -> input aliases the engine reports.
    pub aliases: Vec<AliasPair>,
}

impl EngineIo {
    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&IoTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Reads the JSON written by [`EngineIo::to_json`].
    pub fn from_json(text: &str) -> Result<EngineIo, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// Pretty JSON, as stored in test fixtures.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("EngineIo has only string keys and plain values")
    }
}

impl IoTensor {
    /// The element type, when this build knows it.
    pub fn dtype(&self) -> Option<DType> {
        DType::from_name(&self.dtype)
    }

    /// The shape with `-1` as [`Dim::Dynamic`].
    pub fn dims(&self) -> Vec<Dim> {
        self.shape.iter().map(|&d| u64::try_from(d).map(Dim::Static).unwrap_or(Dim::Dynamic)).collect()
    }
}

impl EngineIntrospect for EngineIo {
    fn tensors(&self) -> Vec<EngineTensor> {
        self.tensors
            .iter()
            .map(|t| EngineTensor {
                name: t.name.clone(),
                role: t.mode.into(),
                dtype: t.dtype(),
                shape: t.dims(),
            })
            .collect()
    }

    fn reports_aliases(&self) -> bool {
        self.reports_aliases
    }

    fn aliased_input(&self, output: &str) -> Option<String> {
        self.aliases.iter().find(|a| a.output == output).map(|a| a.input.clone())
    }
}

/// TensorRT data type -> our dtype name (`"trt:<name>"` for types we do not map); shared with the build side.
pub fn dtype_name(dtype: trtx::DataType) -> String {
    use trtx::DataType as T;
    let ours = match dtype {
        T::kFLOAT => Some(DType::F32),
        T::kHALF => Some(DType::F16),
        T::kBF16 => Some(DType::BF16),
        T::kINT8 => Some(DType::I8),
        T::kUINT8 => Some(DType::U8),
        T::kINT32 => Some(DType::I32),
        T::kINT64 => Some(DType::I64),
        T::kBOOL => Some(DType::Bool),
        _ => None,
    };
    match ours {
        Some(d) => d.name().to_owned(),
        None => format!("trt:{dtype:?}"),
    }
}

/// Our dtype -> TensorRT's, `None` where TensorRT has no such type (f64).
pub fn trt_dtype(dtype: DType) -> Option<trtx::DataType> {
    use trtx::DataType as T;
    Some(match dtype {
        DType::F32 => T::kFLOAT,
        DType::F16 => T::kHALF,
        DType::BF16 => T::kBF16,
        DType::I8 => T::kINT8,
        DType::U8 => T::kUINT8,
        DType::I32 => T::kINT32,
        DType::I64 => T::kINT64,
        DType::Bool => T::kBOOL,
        _ => return None,
    })
}
