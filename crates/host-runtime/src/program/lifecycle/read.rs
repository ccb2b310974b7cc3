//! Reading a cache file: opened once, non-blocking, as every file the host reads ([`open_regular`]: a FIFO
//! or a device is refused from the open descriptor, before a byte is read), and read only when it is no
//! larger than the program's cache file can be, into memory allocated fallibly.

use std::io::Read;
use std::path::Path;

use super::CacheFileProblem;
use crate::blob_file::open_regular;

/// The bytes of the regular file at `path`, refused unread when it holds more than `most` bytes.
///
/// # Errors
/// [`CacheFileProblem::Io`] when the file cannot be opened or read, or is not a regular file (naming what it
/// is); [`CacheFileProblem::TooLarge`] naming its size and `most`; [`CacheFileProblem::Memory`] when its
/// bytes cannot be allocated.
pub(super) fn read_at_most(path: &Path, most: u64) -> Result<Vec<u8>, CacheFileProblem> {
    let io = |source| CacheFileProblem::Io { action: "read", source };
    let file = open_regular(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    if len > most {
        return Err(CacheFileProblem::TooLarge { bytes: len, most });
    }
    let mut bytes = Vec::new();
    usize::try_from(len)
        .ok()
        .and_then(|n| bytes.try_reserve_exact(n).ok())
        .ok_or_else(|| CacheFileProblem::Memory { bytes: len, what: "to read the file".into() })?;
    // At most the length measured: a file that grows meanwhile is read as it was when opened, one that
    // shrinks gives fewer bytes, which the format's checks refuse.
    file.take(len).read_to_end(&mut bytes).map_err(io)?;
    Ok(bytes)
}
