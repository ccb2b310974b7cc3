//! The one error type of `cuda-rt`, with the ExecuTorch code each variant is reported with.

use et_error::{ErrorCode, HasErrorCode};

use crate::memory::MemoryKind;

/// Why CUDA could not be had or used. Variants without a driver, device or library are `NotSupported`;
/// allocation failures `MemoryAllocationFailed`; caller misuse `InvalidArgument`; everything else the driver,
/// NVRTC or cuBLAS refuse is `Internal`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `libcuda` cannot be loaded: no NVIDIA driver on this machine.
    #[error("no CUDA driver is available: {reason}")]
    NoDriver {
        /// What was tried.
        reason: String,
    },
    /// `libcuda` loads but cannot be used (`cuInit` fails: no GPU, a driver too old, or the library lacks an
    /// entry point this build calls).
    #[error("the CUDA driver cannot be used: {reason}")]
    DriverUnusable {
        /// The driver's words.
        reason: String,
    },
    /// The device ordinal is not one the driver sees.
    #[error("there is no CUDA device {ordinal} (the driver sees {count})")]
    NoDevice {
        /// The ordinal asked for.
        ordinal: i32,
        /// How many devices the driver sees.
        count: i32,
    },
    /// The device exists but its context cannot be opened.
    #[error("CUDA device {ordinal} cannot be used: {reason}")]
    DeviceUnusable {
        /// The device.
        ordinal: i32,
        /// The driver's words.
        reason: String,
    },
    /// An optional CUDA library (NVRTC, cuBLAS) cannot be loaded or lacks an entry point.
    #[error("the CUDA library {library} is not available: {reason}")]
    LibraryUnavailable {
        /// `"nvrtc"` or `"cublas"`.
        library: &'static str,
        /// What was tried, or what is missing.
        reason: String,
    },
    /// An allocation failed (out of memory, usually).
    #[error("allocating {bytes} bytes of {kind} memory on CUDA device {ordinal} failed: {reason}")]
    Allocation {
        /// The device.
        ordinal: i32,
        /// The kind of memory asked for.
        kind: MemoryKind,
        /// Size asked for.
        bytes: usize,
        /// The driver's words.
        reason: String,
    },
    /// Two buffers given to one operation differ in size.
    #[error("{call}: the source holds {src} bytes, the destination {dst}")]
    SizeMismatch {
        /// The operation.
        call: &'static str,
        /// Bytes of the destination.
        dst: u64,
        /// Bytes of the source.
        src: u64,
    },
    /// Two buffers given to one operation are of memory kinds it cannot combine.
    #[error("{call}: cannot copy {src} memory into {dst} memory")]
    KindMismatch {
        /// The operation.
        call: &'static str,
        /// The destination's memory kind (`"host"`, `"pinned"`, `"device"`, `"managed"`).
        dst: &'static str,
        /// The source's memory kind.
        src: &'static str,
    },
    /// A size or count does not fit the type the driver takes (e.g. more than `usize::MAX` bytes, a matrix
    /// extent over `i32::MAX`), or a name contains a NUL byte.
    #[error("{call}: {what} cannot be passed to CUDA")]
    OutOfRange {
        /// The operation.
        call: &'static str,
        /// The value and why.
        what: String,
    },
    /// Another driver call failed (a copy, a memset, a synchronisation, loading a module).
    #[error("{call} on CUDA device {ordinal} failed: {reason}")]
    Driver {
        /// The driver function.
        call: &'static str,
        /// The device.
        ordinal: i32,
        /// The driver's words.
        reason: String,
    },
    /// NVRTC refused a source.
    #[error(transparent)]
    Compile(Box<CompileFailure>),
    /// A cuBLAS call failed.
    #[error("{call} on CUDA device {ordinal} failed: {status}")]
    Blas {
        /// The cuBLAS function.
        call: &'static str,
        /// The device.
        ordinal: i32,
        /// cuBLAS's status.
        status: String,
    },
}

/// What NVRTC said about a source it could not compile.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("NVRTC could not compile '{name}' ({options}): {reason}{}", log_suffix(.log))]
pub struct CompileFailure {
    /// The program name given to NVRTC.
    pub name: String,
    /// The options, space-separated.
    pub options: String,
    /// NVRTC's result.
    pub reason: String,
    /// NVRTC's log, trimmed.
    pub log: String,
}

fn log_suffix(log: &str) -> String {
    if log.is_empty() {
        String::new()
    } else {
        format!(" (log: {})", log.replace('\n', " | "))
    }
}

impl HasErrorCode for Error {
    fn error_code(&self) -> ErrorCode {
        match self {
            Error::NoDriver { .. }
            | Error::DriverUnusable { .. }
            | Error::NoDevice { .. }
            | Error::DeviceUnusable { .. }
            | Error::LibraryUnavailable { .. } => ErrorCode::NotSupported,
            Error::Allocation { .. } => ErrorCode::MemoryAllocationFailed,
            Error::SizeMismatch { .. } | Error::KindMismatch { .. } | Error::OutOfRange { .. } => {
                ErrorCode::InvalidArgument
            }
            Error::Driver { .. } | Error::Compile(_) | Error::Blas { .. } => ErrorCode::Internal,
        }
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_maps_to_the_code_its_docs_promise() {
        let cases = [
            (Error::NoDriver { reason: "r".into() }, ErrorCode::NotSupported),
            (Error::DriverUnusable { reason: "r".into() }, ErrorCode::NotSupported),
            (Error::NoDevice { ordinal: 3, count: 1 }, ErrorCode::NotSupported),
            (Error::DeviceUnusable { ordinal: 0, reason: "r".into() }, ErrorCode::NotSupported),
            (Error::LibraryUnavailable { library: "nvrtc", reason: "r".into() }, ErrorCode::NotSupported),
            (
                Error::Allocation { ordinal: 0, kind: MemoryKind::Managed, bytes: 8, reason: "r".into() },
                ErrorCode::MemoryAllocationFailed,
            ),
            (Error::SizeMismatch { call: "copy", dst: 1, src: 2 }, ErrorCode::InvalidArgument),
            (Error::KindMismatch { call: "copy", dst: "host", src: "device" }, ErrorCode::InvalidArgument),
            (Error::OutOfRange { call: "gemm", what: "m".into() }, ErrorCode::InvalidArgument),
            (Error::Driver { call: "cuMemcpy", ordinal: 0, reason: "r".into() }, ErrorCode::Internal),
            (
                Error::Compile(Box::new(CompileFailure {
                    name: "k".into(),
                    options: String::new(),
                    reason: "r".into(),
                    log: "l".into(),
                })),
                ErrorCode::Internal,
            ),
            (Error::Blas { call: "cublasSgemm", ordinal: 0, status: "s".into() }, ErrorCode::Internal),
        ];
        // Small enough to return everywhere (clippy's `result_large_err` threshold is 128 bytes).
        assert!(std::mem::size_of::<Error>() <= 64, "{} bytes", std::mem::size_of::<Error>());
        for (err, code) in cases {
            assert_eq!(err.error_code(), code, "{err}");
            assert!(!err.to_string().contains('\n'), "one line: {err}");
        }
        assert_eq!(
            Error::Allocation { ordinal: 0, kind: MemoryKind::Pinned, bytes: 300, reason: "OOM".into() }
                .to_string(),
            "allocating 300 bytes of pinned memory on CUDA device 0 failed: OOM"
        );
        assert_eq!(
            Error::Compile(Box::new(CompileFailure {
                name: "k.cu".into(),
                options: "-arch=compute_90".into(),
                reason: "NVRTC_ERROR_COMPILATION".into(),
                log: "line 1\nline 2".into()
            }))
            .to_string(),
            "NVRTC could not compile 'k.cu' (-arch=compute_90): NVRTC_ERROR_COMPILATION (log: line 1 | line 2)"
        );
    }
}
