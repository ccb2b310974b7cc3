//! [`Error`]: why a graph is invalid or a payload does not decode.

use crate::{PAYLOAD_MAGIC, PAYLOAD_VERSION_MAJOR};

/// Why a graph is invalid, or why a payload does not decode to one. Every variant is
/// [`et_error::ErrorCode::InvalidProgram`]: the blob is wrong, not the call.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The payload is shorter than its fixed prefix.
    #[error("reference-graph payload is {len} bytes, shorter than its {needed}-byte prefix")]
    TooShort {
        /// Payload length.
        len: usize,
        /// Bytes the prefix needs.
        needed: usize,
    },
    /// The payload does not start with [`PAYLOAD_MAGIC`].
    #[error("reference-graph payload starts with {found:02x?}, expected the magic {PAYLOAD_MAGIC:?}")]
    BadMagic {
        /// The first four bytes.
        found: [u8; 4],
    },
    /// The payload's major version is not one this build reads.
    #[error(
        "reference-graph payload version {major}.{minor} is not supported (this build reads {PAYLOAD_VERSION_MAJOR}.x)"
    )]
    UnsupportedVersion {
        /// Major version found.
        major: u16,
        /// Minor version found.
        minor: u16,
    },
    /// The JSON section or the constant section does not fit in the payload.
    #[error("reference-graph {section} section at offset {offset} with {len} bytes overruns the {total}-byte payload")]
    SectionOutOfBounds {
        /// `"json"` or `"constant"`.
        section: &'static str,
        /// Start offset of the section.
        offset: u64,
        /// Declared length.
        len: u64,
        /// Payload length.
        total: usize,
    },
    /// The graph description is not valid JSON of the expected structure.
    #[error("reference-graph description is malformed: {source}")]
    Json {
        /// The JSON error, with line and column.
        #[source]
        source: serde_json::Error,
    },
    /// An op entry has no `"op"` string.
    #[error("op {index} has no \"op\" name")]
    MissingOpName {
        /// Position of the op in the graph.
        index: usize,
    },
    /// An op name this build does not know (e.g. from a newer exporter).
    #[error(
        "op {index} is '{op}', which this build of the reference graph does not know (known ops: {known})"
    )]
    UnknownOp {
        /// Position of the op in the graph.
        index: usize,
        /// The unknown name.
        op: String,
        /// Known op names, comma separated.
        known: String,
    },
    /// A known op with missing or mistyped fields.
    #[error("op {index} ('{op}') is malformed: {source}")]
    MalformedOp {
        /// Position of the op in the graph.
        index: usize,
        /// The op's name.
        op: String,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
    /// A tensor name is empty or used twice.
    #[error("tensor name '{name}' is {problem}")]
    BadTensorName {
        /// The name.
        name: String,
        /// `"empty"` or `"declared twice"`.
        problem: &'static str,
    },
    /// A tensor has a zero extent or too many elements.
    #[error("tensor '{name}' has shape {shape:?}: {problem}")]
    BadShape {
        /// The tensor.
        name: String,
        /// Its declared shape.
        shape: Vec<u64>,
        /// What is wrong.
        problem: String,
    },
    /// A name that refers to no declared tensor.
    #[error("{context} refers to tensor '{name}', which is not declared")]
    DanglingTensor {
        /// Where the reference is, e.g. `"op 3 (mat_mul)"` or `"graph outputs"`.
        context: String,
        /// The undeclared name.
        name: String,
    },
    /// A tensor listed twice where it may appear once (graph inputs, outputs, constants).
    #[error("tensor '{name}' appears twice in {context}")]
    Duplicate {
        /// The tensor.
        name: String,
        /// Where.
        context: &'static str,
    },
    /// A tensor with more than one definition (input, constant, op output).
    #[error("tensor '{name}' is defined twice: as {first} and as {second}")]
    DefinedTwice {
        /// The tensor.
        name: String,
        /// Its first definition.
        first: String,
        /// Its second definition.
        second: String,
    },
    /// An op reads a tensor that no earlier op, input or constant defines.
    #[error("op {index} ({op}) reads tensor '{name}' before anything defines it")]
    UseBeforeDefinition {
        /// Position of the op.
        index: usize,
        /// The op's name.
        op: &'static str,
        /// The tensor.
        name: String,
    },
    /// A declared tensor that nothing defines.
    #[error("tensor '{name}' is declared but is neither an input, a constant nor an op output")]
    Undefined {
        /// The tensor.
        name: String,
    },
    /// An op's operand has the wrong element type or shape, or its declared output does not match what the
    /// op computes.
    #[error("op {index} ({op}): {detail}")]
    OpMismatch {
        /// Position of the op.
        index: usize,
        /// The op's name.
        op: &'static str,
        /// What does not fit, naming the tensors and shapes.
        detail: String,
    },
    /// A constant's bytes are misplaced or of the wrong size.
    #[error("constant '{name}' at offset {offset} with {nbytes} bytes: {problem}")]
    BadConstant {
        /// The tensor.
        name: String,
        /// Declared offset in the constant section.
        offset: u64,
        /// Declared length.
        nbytes: u64,
        /// What is wrong.
        problem: String,
    },
    /// A graph input used as a constant, a graph output that nothing produces, and the like.
    #[error("tensor '{name}' {problem}")]
    BadInterface {
        /// The tensor.
        name: String,
        /// What is wrong.
        problem: String,
    },
    /// An in-place cache tensor used in a way the aliasing rules forbid (see the crate docs).
    #[error("cache tensor '{name}' {problem}")]
    CacheMisuse {
        /// The tensor.
        name: String,
        /// What is wrong.
        problem: String,
    },
    /// The target or output of an [`crate::Op::Assign`] used in a way the aliasing rules forbid (see the crate
    /// docs).
    #[error("in-place tensor '{name}' {problem}")]
    AssignMisuse {
        /// The tensor.
        name: String,
        /// What is wrong.
        problem: String,
    },
}

impl et_error::HasErrorCode for Error {
    fn error_code(&self) -> et_error::ErrorCode {
        et_error::ErrorCode::InvalidProgram
    }
}
