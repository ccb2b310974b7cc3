//! The one error of this crate: what was wrong, in the command line's terms, with its ExecuTorch code.

use et_error::{ErrorCode, HasErrorCode};

/// A bad input (an option, a tokenizer or config file): one line naming it, with the ExecuTorch code it is
/// reported with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct TextError {
    /// How it is reported: `InvalidArgument` for a bad value, `NotFound` / `AccessFailed` for a file.
    pub code: ErrorCode,
    /// What was wrong and where.
    pub message: String,
}

impl TextError {
    /// A bad value (`InvalidArgument`).
    pub fn invalid(message: impl Into<String>) -> TextError {
        TextError { code: ErrorCode::InvalidArgument, message: message.into() }
    }

    /// A file `what` at `path` that could not be opened or read (`NotFound` when it is missing).
    pub(crate) fn file(what: &str, path: &std::path::Path, err: &std::io::Error) -> TextError {
        let code = match err.kind() {
            std::io::ErrorKind::NotFound => ErrorCode::NotFound,
            _ => ErrorCode::AccessFailed,
        };
        TextError { code, message: format!("{what} {}: {err}", path.display()) }
    }
}

impl HasErrorCode for TextError {
    fn error_code(&self) -> ErrorCode {
        self.code
    }
}
