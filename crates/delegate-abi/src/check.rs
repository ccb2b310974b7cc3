//! Per-argument checks for plugin authors: the ones every delegate runs at the top of `execute`, before it
//! reads a byte, with the errors that name what was wrong and where.
//!
//! A delegate decides at `init` what each argument position must be (from its blob's bindings) and, on every
//! call, checks the [`TensorArg`]s it is handed against that: the count ([`check_count`]), then per position
//! the dtype and shape, the size in bytes and, for what it writes, writability ([`check_arg`]). Checks that
//! depend on where the delegate computes (memory kinds, residency, alignment, overlaps) stay the delegate's
//! own and report through [`ArgError::arg`], so every refusal reads the same way. The reference and CUDA
//! delegates use these; a new delegate can too.
//!
//! ```
//! use delegate_abi::check::{check_arg, check_count, ArgError, Expected};
//! use delegate_abi::{DTypeCode, MemoryKind, TensorArg};
//!
//! let expected = Expected { name: "x", dtype: DTypeCode::F32, shape: &[2], nbytes: 8, written: false };
//! let arg = TensorArg::describe(DTypeCode::F32, &[3], MemoryKind::Host).expect("rank 1");
//! assert!(check_count(["x"], 2).is_err());
//! let err = check_arg(0, &expected, &arg).expect_err("wrong shape");
//! assert_eq!(err.to_string(), "argument 0 ('x'): is f32 [3], expected f32 [2]");
//! assert!(matches!(err, ArgError::Arg { position: 0, .. }));
//! ```
#![forbid(unsafe_code)]

use et_error::{ErrorCode, HasErrorCode};

use crate::tensor::{DTypeCode, TensorArg};

/// What one argument position must be, as decided at `init`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expected<'a> {
    /// The tensor the position binds, for messages.
    pub name: &'a str,
    /// Element type.
    pub dtype: DTypeCode,
    /// Extents.
    pub shape: &'a [i64],
    /// Size in bytes (shape x element size).
    pub nbytes: u64,
    /// Whether the delegate writes it (an output, or an input it updates in place): it must be writable.
    pub written: bool,
}

/// A call's arguments do not fit what the blob binds. `InvalidArgument`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ArgError {
    /// The call has the wrong number of arguments.
    #[error("the call has {found} arguments, but this blob binds {expected}: {names}")]
    Count {
        /// Arguments the blob binds.
        expected: usize,
        /// Arguments given.
        found: usize,
        /// The bound tensor names, in argument order.
        names: String,
    },
    /// One argument does not fit its binding.
    #[error("argument {position} ('{tensor}'): {problem}")]
    Arg {
        /// The argument position.
        position: usize,
        /// The tensor it binds.
        tensor: String,
        /// What is wrong and what was expected.
        problem: String,
    },
}

impl ArgError {
    /// The argument at `position`, binding `tensor`, is wrong: `problem` says how (e.g. "is read-only, but
    /// the delegate writes it").
    pub fn arg(position: usize, tensor: &str, problem: impl Into<String>) -> ArgError {
        ArgError::Arg { position, tensor: tensor.to_owned(), problem: problem.into() }
    }
}

impl HasErrorCode for ArgError {
    fn error_code(&self) -> ErrorCode {
        ErrorCode::InvalidArgument
    }
}

/// Checks that a call has one argument per bound tensor; `names` are the bound tensors in argument order.
///
/// # Errors
/// [`ArgError::Count`] naming every bound tensor.
pub fn check_count<'a>(names: impl IntoIterator<Item = &'a str>, found: usize) -> Result<(), ArgError> {
    let names: Vec<&str> = names.into_iter().collect();
    if names.len() == found {
        return Ok(());
    }
    Err(ArgError::Count { expected: names.len(), found, names: names.join(", ") })
}

/// Checks the argument at `position` against what it must be: dtype and shape, size in bytes, and
/// writability when the delegate writes it.
///
/// # Errors
/// [`ArgError::Arg`] naming the position, the tensor and the first mismatch.
pub fn check_arg(position: usize, expected: &Expected<'_>, arg: &TensorArg) -> Result<(), ArgError> {
    let bad = |problem: String| ArgError::arg(position, expected.name, problem);
    if arg.dtype() != expected.dtype || arg.dims() != expected.shape {
        return Err(bad(format!(
            "is {} {:?}, expected {} {:?}",
            arg.dtype(),
            arg.dims(),
            expected.dtype,
            expected.shape
        )));
    }
    if arg.nbytes != expected.nbytes {
        return Err(bad(format!("has {} bytes, expected {}", arg.nbytes, expected.nbytes)));
    }
    if expected.written && !arg.is_writable() {
        return Err(bad("is read-only, but the delegate writes it".to_owned()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::{MemoryKind, ARG_WRITABLE};

    fn arg(dtype: DTypeCode, shape: &[i64], nbytes: u64, writable: bool) -> TensorArg {
        let mut arg = TensorArg::describe(dtype, shape, MemoryKind::Host).expect("small rank");
        arg.nbytes = nbytes;
        arg.flags = if writable { ARG_WRITABLE } else { 0 };
        arg
    }

    const CACHE: Expected<'static> =
        Expected { name: "k_cache", dtype: DTypeCode::F32, shape: &[2, 3], nbytes: 24, written: true };

    #[test]
    fn a_fitting_argument_passes() {
        assert_eq!(check_arg(4, &CACHE, &arg(DTypeCode::F32, &[2, 3], 24, true)), Ok(()));
        let read = Expected { written: false, ..CACHE };
        assert_eq!(check_arg(4, &read, &arg(DTypeCode::F32, &[2, 3], 24, false)), Ok(()));
        assert_eq!(check_count(["a", "b"], 2), Ok(()));
    }

    #[test]
    fn each_mismatch_names_the_position_the_tensor_and_what_was_expected() {
        let cases = [
            (arg(DTypeCode::F16, &[2, 3], 12, true), "is f16 [2, 3], expected f32 [2, 3]"),
            (arg(DTypeCode::F32, &[3, 2], 24, true), "is f32 [3, 2], expected f32 [2, 3]"),
            (arg(DTypeCode::F32, &[2, 3], 20, true), "has 20 bytes, expected 24"),
            (arg(DTypeCode::F32, &[2, 3], 24, false), "is read-only, but the delegate writes it"),
        ];
        for (given, problem) in cases {
            let err = check_arg(4, &CACHE, &given).expect_err("refused");
            assert_eq!(err.to_string(), format!("argument 4 ('k_cache'): {problem}"));
            assert_eq!(err.error_code(), ErrorCode::InvalidArgument);
        }
        let err = check_count(["tokens", "k_cache"], 3).expect_err("one too many");
        assert_eq!(err.to_string(), "the call has 3 arguments, but this blob binds 2: tokens, k_cache");
        assert_eq!(err.error_code(), ErrorCode::InvalidArgument);
    }
}
