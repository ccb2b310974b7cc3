//! What `kvd_check_program` decides, in safe code: whether ExecuTorch may load a program's bytes with our
//! delegates in the process.
//!
//! A C or C++ application loads programs through ExecuTorch itself, and our backends see only their own
//! payloads, never the program: they cannot tell that a crafted program names one of its constants where a
//! delegate writes (ExecuTorch hands the delegate every tensor as writable, so the delegate would write into the
//! program's bytes: SIGSEGV in a read-only mapping, silently overwritten constants in memory). So the
//! application checks the bytes first, with the same check `et-run` makes
//! ([`executorch_bridge::written::unplanned_write`]), and then has ExecuTorch load exactly those bytes.

use et_error::{ErrorCode, HasErrorCode};
use executorch_bridge::BridgeError;
use pte_format::Program;

/// Why `kvd_check_program` refused a program.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckError {
    /// The caller passed a null pointer with a non-zero length: caller misuse (`InvalidArgument`).
    #[error("data is NULL but len is {len}: pass the program's bytes, as ExecuTorch will load them")]
    NoData {
        /// The length passed with it.
        len: usize,
    },
    /// The length passed is larger than any memory a process can hold (`InvalidArgument`).
    #[error("len {len} is larger than any program (more than isize::MAX bytes)")]
    Length {
        /// The length passed.
        len: usize,
    },
    /// The bytes are not a program this library reads: truncated, corrupted, not a `.pte` (`InvalidProgram`), or
    /// of an ExecuTorch version it does not read (`NotSupported`).
    #[error("the {len} bytes are not a readable program: {source}")]
    Unreadable {
        /// How many bytes were passed.
        len: usize,
        /// What is wrong, and where.
        #[source]
        source: pte_format::Error,
    },
    /// A DelegateCall argument that one of our delegates writes is not planned memory (a constant of the
    /// program, or memory the caller binds): [`BridgeError::UnplannedWrite`], naming the method, the call, the
    /// argument and why (`InvalidProgram`).
    #[error("{0}")]
    Refused(#[source] BridgeError),
}

impl HasErrorCode for CheckError {
    fn error_code(&self) -> ErrorCode {
        match self {
            CheckError::NoData { .. } | CheckError::Length { .. } => ErrorCode::InvalidArgument,
            CheckError::Unreadable { source, .. } => source.error_code(),
            CheckError::Refused(err) => err.error_code(),
        }
    }
}

/// Checks that `bytes` are a readable program in which every DelegateCall argument one of our delegates writes
/// is planned memory. Reads only the program's metadata and each delegate payload's header; needs no
/// registration, and decides nothing about backends that are not ours (their payloads are passed over).
///
/// # Errors
/// [`CheckError::Unreadable`] for bytes that are not a readable program; [`CheckError::Refused`] for the first
/// argument a delegate writes that is not planned memory.
pub fn check_program(bytes: &[u8]) -> Result<(), CheckError> {
    let program =
        Program::parse(bytes).map_err(|source| CheckError::Unreadable { len: bytes.len(), source })?;
    executorch_bridge::written::unplanned_write(&program).map_or(Ok(()), |err| Err(CheckError::Refused(err)))
}
