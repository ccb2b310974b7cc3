//! [`BlobSource`]: where a call's blob bytes are, a blob file or a delegate payload inside another file.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// Where a call's blob bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BlobSource {
    /// A blob file, as a manifest names it.
    File {
        /// The path, resolved against the manifest's directory.
        path: PathBuf,
        /// The directory `path` must stay inside once symbolic links are resolved: the manifest's directory
        /// under [`BlobPaths::WithinProgram`](crate::BlobPaths::WithinProgram), whose reader opens the blob
        /// relative to it and refuses a link that leads out (the path text alone cannot tell); `None` when
        /// the caller allows blobs anywhere ([`BlobPaths::Anywhere`](crate::BlobPaths::Anywhere)).
        root: Option<PathBuf>,
    },
    /// A delegate's payload inside a program file (an ExecuTorch `.pte`), read in place (boxed: errors
    /// carry a source, and stay small).
    Payload(Box<Payload>),
}

/// A delegate's payload inside a program file: the file, the call it serves, and the payload's place as the
/// file's reader reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payload {
    /// The program file holding the payload.
    pub program: PathBuf,
    /// The call it serves, for messages: `method 'forward' instruction 0 (ReferenceBackend)`.
    pub call: String,
    /// Where the file stores it, for messages: `segment 1`, `inline 0`.
    pub label: String,
    /// Its bytes in the file.
    pub range: Range<u64>,
}

impl BlobSource {
    /// A blob file at `path`, allowed anywhere (no directory to stay inside).
    pub fn file(path: impl Into<PathBuf>) -> BlobSource {
        BlobSource::File { path: path.into(), root: None }
    }

    /// The blob file's path; `None` for a payload inside another file.
    pub fn path(&self) -> Option<&Path> {
        match self {
            BlobSource::File { path, .. } => Some(path),
            BlobSource::Payload(_) => None,
        }
    }
}

impl fmt::Display for BlobSource {
    /// The file's path, or `PROGRAM: CALL, payload LABEL (bytes START..END)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BlobSource::File { path, .. } => write!(f, "{}", path.display()),
            BlobSource::Payload(p) => write!(
                f,
                "{}: {}, payload {} (bytes {}..{})",
                p.program.display(),
                p.call,
                p.label,
                p.range.start,
                p.range.end
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_says_where_its_bytes_are() {
        let file = BlobSource::file("dir/decode.blob");
        assert_eq!(file.to_string(), "dir/decode.blob");
        assert_eq!(file.path(), Some(Path::new("dir/decode.blob")));
        let payload = BlobSource::Payload(Box::new(Payload {
            program: "m.pte".into(),
            call: "method 'forward' instruction 0 (ReferenceBackend)".into(),
            label: "segment 1".into(),
            range: 128..640,
        }));
        assert_eq!(payload.path(), None);
        assert_eq!(
            payload.to_string(),
            "m.pte: method 'forward' instruction 0 (ReferenceBackend), payload segment 1 (bytes 128..640)"
        );
    }
}
