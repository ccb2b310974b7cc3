//! Opening a file once, without blocking, and checked through the open descriptor: how a program manifest is
//! opened here, and how `host-runtime` opens every file a host reads (blobs, programs, plugin manifests and
//! libraries). It lives in this format crate, the lowest one that reads files, so there is one copy.
//!
//! A type check by path followed by an open by path could be raced (the file swapped for a FIFO in between,
//! whose open blocks until a writer comes), so the open itself is non-blocking and the type is read from the
//! descriptor that is then read.

use std::fs::File;
use std::io;
use std::path::Path;

/// Opens `path` for reading exactly once and returns the descriptor only if it is a regular file.
///
/// The open is non-blocking (`O_NONBLOCK`, so a FIFO put in a file's place cannot block it until a writer
/// comes), close-on-exec, and takes no controlling terminal; the type is then read from the open descriptor
/// (`fstat`), not from the path, so what is checked is what is read. Reads from a regular file are never
/// affected by `O_NONBLOCK`.
///
/// # Errors
/// The open's error, or `InvalidInput` with `not a regular file (it is a FIFO)` (a directory, a character
/// device, ...).
pub fn open_regular(path: &Path) -> io::Result<File> {
    only_regular(open_nonblocking(path)?)
}

/// Refuses an open descriptor that is not a regular file, naming what it is.
///
/// # Errors
/// `fstat`'s error, or `InvalidInput` with `not a regular file (it is ...)`.
pub fn only_regular(file: File) -> io::Result<File> {
    let kind = file.metadata()?.file_type();
    if kind.is_file() {
        Ok(file)
    } else {
        Err(not_regular(&kind))
    }
}

fn not_regular(kind: &std::fs::FileType) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, format!("not a regular file (it is {})", file_kind(kind)))
}

/// Opens `path` read-only, non-blocking, close-on-exec and without taking a controlling terminal; the caller
/// checks the descriptor's type ([`only_regular`]).
///
/// # Errors
/// The open's error (elsewhere than Linux, also `InvalidInput` for anything but a regular file).
#[cfg(target_os = "linux")]
pub fn open_nonblocking(path: &Path) -> io::Result<File> {
    use rustix::fs::{Mode, OFlags};
    let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY;
    Ok(File::from(rustix::fs::open(path, flags, Mode::empty())?))
}

/// Opens `path` read-only; the caller checks the descriptor's type ([`only_regular`]).
///
/// # Errors
/// The open's error, or `InvalidInput` for anything but a regular file.
#[cfg(not(target_os = "linux"))]
pub fn open_nonblocking(path: &Path) -> io::Result<File> {
    // No `O_NONBLOCK` here: the type is checked by path first too, which narrows a FIFO swapped in to a race.
    let kind = std::fs::metadata(path)?.file_type();
    if !kind.is_file() {
        return Err(not_regular(&kind));
    }
    File::open(path)
}

/// What a file is, for messages: `a directory`, `a FIFO`, `a regular file`, ...
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
