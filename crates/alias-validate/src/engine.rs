//! What validation needs to know about an engine, whoever built it.

use blob_format::model::{DType, Dim, Role};

/// One engine I/O tensor, as the engine itself reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineTensor {
    /// The tensor's name in the engine.
    pub name: String,
    /// Input or output.
    pub role: Role,
    /// Element type, when the engine reports one this build knows.
    pub dtype: Option<DType>,
    /// Shape as the engine declares it (dynamic extents as [`Dim::Dynamic`]).
    pub shape: Vec<Dim>,
}

/// Engine introspection: implemented by `trt-exec` for a deserialized TensorRT engine and by the reference
/// delegate for its op graph.
pub trait EngineIntrospect {
    /// Every I/O tensor of the engine, in the engine's own order.
    fn tensors(&self) -> Vec<EngineTensor>;

    /// Whether [`EngineIntrospect::aliased_input`] is meaningful (TensorRT 10.15+ / TensorRT-RTX 1.7 can say;
    /// an older library cannot).
    fn reports_aliases(&self) -> bool;

    /// The input the engine itself writes in place through `output` (TensorRT's `getAliasedInputTensor`), or
    /// `None` when `output` aliases nothing.
    fn aliased_input(&self, output: &str) -> Option<String>;
}
