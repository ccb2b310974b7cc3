//! Blob and program files read into memory the host owns, so that nothing a file's owner does to it later
//! (rewrite it, truncate it, replace it with `cp`) can reach the host.
//!
//! Why not a memory map: a mapped file that is truncated while mapped raises SIGBUS on the next read of a page
//! past its new end, which kills the process, and a write shows through a shared mapping under the parsers'
//! immutable borrow. A running server must survive its files being replaced, so the host reads each file once
//! into its own allocation (fallibly: a file too large for memory is an error naming its size) and parses and
//! initialises from that snapshot. The bytes live only while a program loads: `Delegate::init` borrows the
//! blob for the call, so they are dropped once every call is initialised, and the steady state holds no copy.
//! The cost is one read of the file at load, which a mapping pays in page faults anyway.

use std::fs::File;
use std::io::Read;
use std::path::Path;

/// A file's bytes as they were when it was read: a private snapshot, immune to later changes of the file.
pub struct BlobFile {
    bytes: Vec<u8>,
}

impl BlobFile {
    /// Reads `path` into memory.
    ///
    /// Anything but a regular file (a FIFO, a device, a socket, a directory) is refused before it is opened:
    /// opening a FIFO for reading blocks until a writer comes, and a device can stream without end. The
    /// allocation is fallible: a file larger than the memory available is an `OutOfMemory` error naming its
    /// size, never an abort.
    pub fn open(path: &Path) -> std::io::Result<BlobFile> {
        let metadata = std::fs::metadata(path)?;
        if !metadata.is_file() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("not a regular file (it is {})", file_kind(&metadata.file_type())),
            ));
        }
        let file = File::open(path)?;
        let len = file.metadata()?.len();
        let mut bytes = Vec::new();
        usize::try_from(len).ok().and_then(|len| bytes.try_reserve_exact(len).ok()).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::OutOfMemory,
                format!("cannot allocate {len} bytes to read the file"),
            )
        })?;
        // At most the length measured: a file that grows meanwhile is read as it was when opened, one that
        // shrinks gives fewer bytes, which the parsers refuse as truncated.
        file.take(len).read_to_end(&mut bytes)?;
        Ok(BlobFile { bytes })
    }

    /// The file's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// What a file that is not a regular file is, for messages: `a directory`, `a FIFO`, ...
pub fn file_kind(kind: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_fifo() {
            return "a FIFO";
        }
        if kind.is_char_device() {
            return "a character device";
        }
        if kind.is_block_device() {
            return "a block device";
        }
        if kind.is_socket() {
            return "a socket";
        }
    }
    if kind.is_dir() {
        "a directory"
    } else if kind.is_file() {
        "a regular file"
    } else {
        "not a regular file"
    }
}
