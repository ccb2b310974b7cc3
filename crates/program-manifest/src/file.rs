//! Opening a manifest: once, without blocking, and checked through the open descriptor.
//!
//! A type check by path followed by an open by path could be raced (the file swapped for a FIFO in between,
//! whose open blocks until a writer comes), so the open itself is non-blocking and the type is read from the
//! descriptor that is then read. (`host_runtime::blob_file::open_regular` does the same for the files a host
//! reads; a format crate does not depend on the host.)

use std::fs::File;
use std::io;
use std::path::Path;

/// Opens `path` for reading once, non-blocking and close-on-exec, and returns it only if it is a regular file.
///
/// # Errors
/// The open's error, or `InvalidInput` with `not a regular file (it is a FIFO)` (a directory, a device, ...).
pub(crate) fn open_regular(path: &Path) -> io::Result<File> {
    let file = open_nonblocking(path)?;
    let kind = file.metadata()?.file_type();
    if kind.is_file() {
        Ok(file)
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("not a regular file (it is {})", kind_name(&kind)),
        ))
    }
}

#[cfg(target_os = "linux")]
fn open_nonblocking(path: &Path) -> io::Result<File> {
    use rustix::fs::{Mode, OFlags};
    let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY;
    Ok(File::from(rustix::fs::open(path, flags, Mode::empty())?))
}

#[cfg(not(target_os = "linux"))]
fn open_nonblocking(path: &Path) -> io::Result<File> {
    // No `O_NONBLOCK` here: the type is checked by path first too, which narrows a FIFO swapped in to a race.
    let kind = std::fs::metadata(path)?.file_type();
    if !kind.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("not a regular file (it is {})", kind_name(&kind)),
        ));
    }
    File::open(path)
}

/// What a file that is not a regular file is: `a directory`, `a FIFO`, ...
fn kind_name(kind: &std::fs::FileType) -> &'static str {
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
    } else {
        "not a regular file"
    }
}
