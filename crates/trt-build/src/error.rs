//! The one error type of `trt-build`, with the ExecuTorch code each variant is reported with.

use et_error::{ErrorCode, HasErrorCode};

/// Everything that can go wrong describing, building or exporting a TensorRT engine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The network description is malformed (unknown tensor, bad shape, weights of the wrong size), or an
    /// argument order names a tensor the engine lacks.
    #[error("network description, node '{node}': {message}")]
    Network {
        /// The node (tensor) name at fault.
        node: String,
        /// What is wrong.
        message: String,
    },
    /// TensorRT refused to build the network; `log` holds TensorRT's own error messages.
    #[error("TensorRT failed to build the engine: {message}{}", trt_exec::log_suffix(.log))]
    Build {
        /// What failed.
        message: String,
        /// TensorRT's error-level log lines during the build.
        log: Vec<String>,
    },
    /// A TensorRT network call failed in a way TensorRT did not explain.
    #[error("TensorRT call {call} failed: {message}")]
    Trt {
        /// The call, e.g. `ITensor::getName`.
        call: &'static str,
        /// Detail.
        message: String,
    },
    /// The TensorRT-RTX library could not be loaded (`NotSupported`, naming `KV_TENSORRT_LIB`).
    #[error(transparent)]
    Runtime(#[from] trt_exec::Error),
    /// An upstream TR02 blob cannot express the header (`NotSupported`).
    #[error("writing TR02: {0}")]
    Upstream(#[from] blob_format::WriteError),
}

impl HasErrorCode for Error {
    fn error_code(&self) -> ErrorCode {
        match self {
            Error::Network { .. } => ErrorCode::InvalidArgument,
            Error::Build { .. } | Error::Trt { .. } => ErrorCode::Internal,
            Error::Runtime(err) => err.error_code(),
            Error::Upstream(err) => err.error_code(),
        }
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
