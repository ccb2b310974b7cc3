//! Why a `.pte` program could not be loaded: [`Error`], with [`At`] and [`Problem`] naming the place and
//! the fault.

use std::path::PathBuf;

use et_error::{ErrorCode, HasErrorCode};
use pte_format::model::InstructionRef;

/// Why a `.pte` program could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The file could not be read (`AccessFailed`).
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not a `.pte` program this build reads (`pte_format`'s code).
    #[error("{path}: {source}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        source: pte_format::Error,
    },
    /// An instruction calls an operator the host does not run (`NotSupported`). The host runs delegates, not
    /// ExecuTorch's kernels: a program the partitioner left partly outside runs in ExecuTorch's own runtime,
    /// which the message names with the command.
    #[error("{path}: method '{method}' instruction {at} calls operator '{operator}', which delegate-host does not run; it runs DelegateCalls, aten::copy_ write-backs and aten::clone.out only. ExecuTorch's runtime runs the operators a partly delegated program keeps outside: et-run {}", path.display())]
    Operator {
        /// The file.
        path: PathBuf,
        /// The method.
        method: String,
        /// The instruction.
        at: At,
        /// `name.overload`.
        operator: String,
    },
    /// An instruction kind the host does not run: `MoveCall`, `JumpFalseCall` (control flow) or a newer
    /// kind (`NotSupported`).
    #[error("{path}: method '{method}' instruction {at} is a {kind}, which delegate-host does not run; ExecuTorch's runtime does: et-run {}", path.display())]
    Instruction {
        /// The file.
        path: PathBuf,
        /// The method.
        method: String,
        /// The instruction.
        at: At,
        /// `MoveCall`, `JumpFalseCall`, ...
        kind: &'static str,
    },
    /// A `DelegateCall` names a backend id no loaded plugin serves (`NotFound`).
    #[error("{path}: method '{method}' instruction {at} calls backend '{backend}', which no loaded plugin serves (loaded: {available}); see `delegate-host plugins`")]
    NoPlugin {
        /// The file.
        path: PathBuf,
        /// The method.
        method: String,
        /// The instruction.
        at: At,
        /// The backend id.
        backend: String,
        /// The backends that are served.
        available: String,
    },
    /// A delegate's payload is not a blob this build reads (the blob reader's code).
    #[error("{path}: method '{method}' instruction {at} ({backend}): the delegate payload is not a blob: {source}")]
    Blob {
        /// The file.
        path: PathBuf,
        /// The method.
        method: String,
        /// The instruction.
        at: At,
        /// The backend id.
        backend: String,
        /// What the blob reader said.
        source: Box<blob_format::Error>,
    },
    /// A delegate's blob breaks the aliasing rules (alias-validate's code).
    #[error("{path}: method '{method}' instruction {at} ({backend}): {source}")]
    Alias {
        /// The file.
        path: PathBuf,
        /// The method.
        method: String,
        /// The instruction.
        at: At,
        /// The backend id.
        backend: String,
        /// The broken rule.
        source: Box<alias_validate::Error>,
    },
    /// The program holds something the host cannot give storage or meaning to: a non-tensor input, an
    /// element type or shape the host has no name for, a value read before anything wrote it, a buffer two
    /// methods declare differently (`NotSupported` or `InvalidProgram`, see [`Problem`]).
    #[error("{path}: method '{method}': {problem}")]
    Program {
        /// The file.
        path: PathBuf,
        /// The method.
        method: String,
        /// What is wrong.
        problem: Box<Problem>,
    },
    /// A prompt was given but the program does not follow the generation convention (`InvalidArgument`).
    #[error("{path} is not a token generator: {reason} (see host_runtime::pte's generation convention); run it without a prompt, with inputs")]
    NotGenerator {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// Loading the mapped program failed ([`crate::program::Error`]'s code).
    #[error(transparent)]
    Load(#[from] crate::program::Error),
}

impl HasErrorCode for Error {
    fn error_code(&self) -> ErrorCode {
        match self {
            Error::Io { .. } => ErrorCode::AccessFailed,
            Error::Format { source, .. } => source.error_code(),
            Error::Operator { .. } | Error::Instruction { .. } => ErrorCode::NotSupported,
            Error::NoPlugin { .. } => ErrorCode::NotFound,
            Error::Blob { source, .. } => source.error_code(),
            Error::Alias { source, .. } => source.error_code(),
            Error::Program { problem, .. } => problem.error_code(),
            Error::NotGenerator { .. } => ErrorCode::InvalidArgument,
            Error::Load(err) => err.error_code(),
        }
    }
}

/// An instruction's position, as messages name it: `3` in chain 0, `chain 1 instruction 3` otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct At(pub InstructionRef);

impl std::fmt::Display for At {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.chain == 0 {
            write!(f, "{}", self.0.instruction)
        } else {
            write!(f, "{} of chain {}", self.0.instruction, self.0.chain)
        }
    }
}

/// What [`Error::Program`] found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Problem {
    /// A value the host must give storage is not a tensor (`NotSupported`).
    #[error("{what} (value {value}) is a {kind}, not a tensor")]
    NotTensor {
        /// `input 0`, `argument 3 of instruction 0`, ...
        what: String,
        /// The value index.
        value: usize,
        /// The value's kind.
        kind: &'static str,
    },
    /// A tensor's element type has no host name (`NotSupported`).
    #[error("{what} (value {value}) is {scalar_type}, which delegate-host does not allocate")]
    ScalarType {
        /// What the tensor is.
        what: String,
        /// The value index.
        value: usize,
        /// Its type.
        scalar_type: String,
    },
    /// A tensor has a negative size (`InvalidProgram`).
    #[error("{what} (value {value}) has sizes {sizes:?}")]
    Sizes {
        /// What the tensor is.
        what: String,
        /// The value index.
        value: usize,
        /// The sizes.
        sizes: Vec<i32>,
    },
    /// A tensor's size in bytes overflows (`InvalidProgram`): the manifest's checked product refused it.
    #[error("{what} (value {value}): {source}")]
    TooLarge {
        /// What the tensor is.
        what: String,
        /// The value index.
        value: usize,
        /// The tensor and its shape.
        source: program_manifest::TooLarge,
    },
    /// An instruction reads a value nothing wrote (a constant or a value of a skipped instruction:
    /// `NotSupported`).
    #[error(
        "instruction {at} reads value {value}, which no input, buffer or earlier delegate call provides"
    )]
    Unbound {
        /// The instruction.
        at: At,
        /// The value index.
        value: usize,
    },
    /// An operator's arguments do not match what the host runs (`NotSupported`).
    #[error("instruction {at} ({operator}): {message}")]
    Operands {
        /// The instruction.
        at: At,
        /// The operator.
        operator: String,
        /// What does not match.
        message: String,
    },
    /// A `DelegateCall` passes a different number of arguments than its blob threads (`InvalidProgram`).
    #[error("instruction {at} passes {passed} arguments, but its blob threads {threaded}")]
    ArgCount {
        /// The instruction.
        at: At,
        /// Arguments of the call.
        passed: usize,
        /// Arguments the blob threads.
        threaded: usize,
    },
    /// Two methods declare one buffer with different types or shapes (`InvalidProgram`).
    #[error("buffer '{name}' is {first} here but {second} in method '{other}'")]
    BufferMismatch {
        /// The buffer.
        name: String,
        /// As this method declares it.
        first: String,
        /// As the other method declares it.
        second: String,
        /// The other method.
        other: String,
    },
    /// Two values of the method map to the same name (`InvalidProgram`).
    #[error("two values are named '{name}'")]
    Duplicate {
        /// The name.
        name: String,
    },
}

impl HasErrorCode for Problem {
    fn error_code(&self) -> ErrorCode {
        match self {
            Problem::NotTensor { .. }
            | Problem::ScalarType { .. }
            | Problem::Unbound { .. }
            | Problem::Operands { .. } => ErrorCode::NotSupported,
            Problem::Sizes { .. }
            | Problem::TooLarge { .. }
            | Problem::ArgCount { .. }
            | Problem::BufferMismatch { .. }
            | Problem::Duplicate { .. } => ErrorCode::InvalidProgram,
        }
    }
}
