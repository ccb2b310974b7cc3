//! [`Error`]: why a blob does not make a binding plan.

use et_error::{ErrorCode, HasErrorCode};

/// Why a blob cannot be read or bound by an executor of reference graphs. Converts to
/// [`delegate_abi::DelegateError`] with the code of [`HasErrorCode`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The blob does not parse (its code says whether it is malformed or from an unknown format).
    #[error("{0}")]
    Blob(#[from] blob_format::Error),
    /// The blob is not a native reference-graph blob for the executor's backend. `DelegateInvalidCompatibility`.
    #[error("{0}")]
    Incompatible(String),
    /// The payload is not a valid graph. `InvalidProgram`.
    #[error("reference graph: {0}")]
    Graph(#[from] ref_graph::Error),
    /// The blob's bindings or aliases disagree with the graph. `InvalidProgram` (or as alias-validate says).
    #[error("{0}")]
    Alias(#[from] alias_validate::Error),
    /// A `user` alias: the graph cannot write into an input it does not update itself. `NotSupported`.
    #[error(
        "user alias '{output}' -> '{input}' is not supported: the reference delegate only runs aliases its graph \
         performs (kv_cache_update); export the alias as a kv_cache_update op"
    )]
    UserAlias {
        /// The alias's output.
        output: String,
        /// The alias's input.
        input: String,
    },
    /// A graph tensor the blob binds but whose shape or type the ABI cannot carry. `InvalidProgram`.
    #[error("binding '{name}': {problem}")]
    Binding {
        /// The binding.
        name: String,
        /// What is wrong.
        problem: String,
    },
}

impl HasErrorCode for Error {
    fn error_code(&self) -> ErrorCode {
        match self {
            Error::Blob(err) => err.error_code(),
            Error::Incompatible(_) => ErrorCode::DelegateInvalidCompatibility,
            Error::Graph(err) => err.error_code(),
            Error::Alias(err) => err.error_code(),
            Error::UserAlias { .. } => ErrorCode::NotSupported,
            Error::Binding { .. } => ErrorCode::InvalidProgram,
        }
    }
}
