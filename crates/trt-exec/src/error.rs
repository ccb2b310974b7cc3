//! The one error type of `trt-exec`, with the ExecuTorch code each variant is reported with.

use et_error::{ErrorCode, HasErrorCode};

use crate::plan::BindingError;

/// Everything that can go wrong loading, binding or running a TensorRT engine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No TensorRT-RTX library could be loaded from the environment variable or the loader path.
    #[error(
        "TensorRT-RTX library not found (tried {tried}): {message}; set {env} to the path of libtensorrt_rtx.so.1 \
         (`cargo xtask test` installs it into .cache/tensorrt)",
        env = crate::library::LIB_ENV
    )]
    LibraryNotFound {
        /// Every path or name that was tried, comma-separated.
        tried: String,
        /// The loader's message for the last attempt.
        message: String,
    },
    /// TensorRT could not deserialize the plan on this machine (no CUDA driver, unsupported GPU, other
    /// library version); `log` holds TensorRT's own messages.
    #[error("TensorRT cannot load this engine here: {message}{}", crate::log::log_suffix(.log))]
    EngineUnavailable {
        /// What failed.
        message: String,
        /// TensorRT's error-level log lines.
        log: Vec<String>,
    },
    /// The payload is not a TensorRT or TensorRT-RTX plan at all.
    #[error("engine payload refused: {0}")]
    BadPayload(String),
    /// The payload is a real plan of another TensorRT flavour than the loaded library reads (a TensorRT plan
    /// under TensorRT-RTX, or the reverse).
    #[error("engine payload cannot be read by this build: {0}")]
    ForeignPlan(String),
    /// The engine and the blob disagree, or an argument does not fit the binding plan.
    #[error(transparent)]
    Binding(#[from] BindingError),
    /// A feature this build does not provide (e.g. host-resident shape tensors).
    #[error("not supported: {0}")]
    NotSupported(String),
    /// CUDA refused: no driver or device (`NotSupported`), an allocation of the runner's own buffers
    /// (`DelegateMemoryAllocationFailed`), a copy or a synchronisation (`Internal`).
    #[error(transparent)]
    Cuda(#[from] cuda_rt::Error),
    /// A TensorRT call failed in a way TensorRT did not explain.
    #[error("TensorRT call {call} failed: {message}")]
    Trt {
        /// The call, e.g. `getTensorShape`.
        call: &'static str,
        /// Detail.
        message: String,
    },
}

impl HasErrorCode for Error {
    fn error_code(&self) -> ErrorCode {
        match self {
            Error::LibraryNotFound { .. }
            | Error::EngineUnavailable { .. }
            | Error::NotSupported(_)
            | Error::ForeignPlan(_) => ErrorCode::NotSupported,
            // The delegate's own buffers (staging, scratch): ExecuTorch's delegate allocation code.
            Error::Cuda(cuda_rt::Error::Allocation { .. }) => ErrorCode::DelegateMemoryAllocationFailed,
            Error::Cuda(err) => err.error_code(),
            Error::Trt { .. } => ErrorCode::Internal,
            Error::BadPayload(_) => ErrorCode::InvalidProgram,
            Error::Binding(err) => err.error_code(),
        }
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
