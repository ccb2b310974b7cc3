//! Blob files mapped into memory, so a multi-GiB engine is neither read nor copied to be parsed.
#![allow(unsafe_code)]

use std::fs::File;
use std::path::Path;

use memmap2::Mmap;

/// A blob file's bytes, mapped read-only and shared. The file must not be modified or truncated while a
/// `BlobFile` of it lives (see `open`).
pub struct BlobFile {
    map: Option<Mmap>,
}

impl BlobFile {
    /// Maps `path`. An empty file maps to no bytes.
    ///
    /// The caller must not let anything modify or truncate the file while the returned value lives: a
    /// truncated file raises SIGBUS on the next read of a page past its new end.
    ///
    /// Anything but a regular file (a FIFO, a device, a socket, a directory) is refused before it is opened:
    /// opening a FIFO for reading blocks until a writer comes, and a device can stream without end.
    pub fn open(path: &Path) -> std::io::Result<BlobFile> {
        let metadata = std::fs::metadata(path)?;
        if !metadata.is_file() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("not a regular file (it is {})", file_kind(&metadata.file_type())),
            ));
        }
        let file = File::open(path)?;
        if file.metadata()?.len() == 0 {
            return Ok(BlobFile { map: None });
        }
        // SAFETY: memmap2's `Mmap::map` maps the file *shared* (`MAP_SHARED`), read-only: the returned `&[u8]`
        // is only sound if nothing modifies or truncates the file while it is mapped. That is the
        // precondition, and this code does not enforce it: blob files are build artefacts that nothing is
        // expected to write while the host runs. If something does, a write shows through the mapping
        // (the bytes of an immutable borrow change under the parsers: undefined behaviour in Rust's model,
        // although the parsers are fuzzed against arbitrary bytes), and a truncation makes a later read of a
        // page past the new end raise SIGBUS, killing the process. How to remove the hazard (copying small
        // files, a private mapping, a lease or lock, a SIGBUS guard) is the reliability issue's decision.
        let map = unsafe { Mmap::map(&file)? };
        Ok(BlobFile { map: Some(map) })
    }

    /// The mapped bytes.
    pub fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
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
