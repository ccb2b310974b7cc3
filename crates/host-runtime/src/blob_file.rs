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
//!
//! Every file is opened once and checked through the descriptor it was opened as ([`open_regular`]): a check
//! by path followed by an open by path could be raced (the file swapped for a FIFO in between, whose open
//! blocks until a writer comes), so the open itself is non-blocking and the type is read from the open
//! descriptor. A blob that must stay inside its program's directory is opened relative to that directory
//! without following a link out of it ([`BlobFile::open_beneath`]).

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

/// One non-blocking open, checked on the descriptor: the rule lives in `program-manifest` (the lowest crate that
/// reads files) and every file the host reads goes through it.
pub use program_manifest::file::{file_kind, open_regular};
use program_manifest::file::{only_regular, open_nonblocking};

/// A file's bytes as they were when it was read: a private snapshot, immune to later changes of the file.
pub struct BlobFile {
    bytes: Vec<u8>,
}

impl BlobFile {
    /// Reads `path` into memory.
    ///
    /// The file is opened once, non-blocking ([`open_regular`]), and anything but a regular file (a FIFO, a
    /// device, a socket, a directory) is refused from the open descriptor before a byte is read: a FIFO
    /// cannot block the open, and a device cannot stream without end. The allocation is fallible: a file
    /// larger than the memory available is an `OutOfMemory` error naming its size, never an abort.
    pub fn open(path: &Path) -> io::Result<BlobFile> {
        read_all(open_regular(path)?)
    }

    /// Reads `path`, a path under the directory `root` (`root` joined with a relative path), as
    /// [`BlobFile::open`] does, refusing it when it leads outside `root`: through `..`, an absolute symbolic
    /// link, or a symbolic link whose target lies outside `root`.
    ///
    /// The path is resolved by the kernel relative to `root`'s open descriptor (`openat2` with
    /// `RESOLVE_BENEATH`), so a link swapped in while the file is opened cannot lead out either. Where the
    /// kernel lacks `openat2` (Linux before 5.6, or a seccomp filter that refuses it), the path is resolved
    /// with `canonicalize` and checked against `root`'s canonical path before it is opened.
    pub fn open_beneath(root: &Path, path: &Path) -> io::Result<BlobFile> {
        read_all(open_regular_beneath(root, path)?)
    }

    /// The file's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// Reads the whole of an open regular file, from the descriptor `file` (see [`BlobFile::open`]).
fn read_all(file: File) -> io::Result<BlobFile> {
    let len = file.metadata()?.len();
    let mut bytes = Vec::new();
    usize::try_from(len).ok().and_then(|len| bytes.try_reserve_exact(len).ok()).ok_or_else(|| {
        io::Error::new(io::ErrorKind::OutOfMemory, format!("cannot allocate {len} bytes to read the file"))
    })?;
    // At most the length measured: a file that grows meanwhile is read as it was when opened, one that
    // shrinks gives fewer bytes, which the parsers refuse as truncated.
    file.take(len).read_to_end(&mut bytes)?;
    Ok(BlobFile { bytes })
}

/// Reads at most `limit` bytes from the start of the regular file at `path`, opened once ([`open_regular`]):
/// what a reader of a header, a manifest or another small file needs, whatever the file's size.
///
/// # Errors
/// The open's error, `InvalidInput` for anything but a regular file (naming what it is), or the read's error.
pub fn read_prefix(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let file = open_regular(path)?;
    let mut bytes = Vec::new();
    file.take(limit).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// [`open_regular`] for `path` under `root`, never resolving outside `root` (see [`BlobFile::open_beneath`]).
///
/// # Errors
/// `InvalidInput` when `path` is not `root` joined with a relative path, or when it leads outside `root`
/// (`... leads outside <root> ...`); otherwise as [`open_regular`].
pub fn open_regular_beneath(root: &Path, path: &Path) -> io::Result<File> {
    let relative = path.strip_prefix(root).ok().filter(|r| r.is_relative()).ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidInput, format!("it is not a path under {}", root.display()))
    })?;
    let root = if root.as_os_str().is_empty() { Path::new(".") } else { root };
    only_regular(open_beneath(root, relative)?)
}

/// The error of a path that leads outside `root`.
fn escapes(root: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "it leads outside {} (through '..' or a symbolic link); blobs stay inside the program's directory \
             unless the host is told to allow blobs anywhere (delegate-host --allow-outside-blobs)",
            root.display()
        ),
    )
}

#[cfg(target_os = "linux")]
fn open_beneath(root: &Path, relative: &Path) -> io::Result<File> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    use rustix::io::Errno;
    let dir = rustix::fs::open(root, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
    let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY;
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS;
    match rustix::fs::openat2(&dir, relative, flags, Mode::empty(), resolve) {
        Ok(fd) => Ok(File::from(fd)),
        Err(Errno::XDEV) => Err(escapes(root)),
        // No `openat2` here (or filtered): resolve by path, then open what was checked.
        Err(Errno::NOSYS | Errno::PERM) => open_canonical_beneath(root, relative),
        Err(err) => Err(err.into()),
    }
}

#[cfg(not(target_os = "linux"))]
fn open_beneath(root: &Path, relative: &Path) -> io::Result<File> {
    open_canonical_beneath(root, relative)
}

/// The fallback of [`open_beneath`]: both paths resolved by `canonicalize`, the file's checked to lie under
/// the root's, and the resolved path opened (a link swapped in between the check and the open is a race this
/// fallback cannot close; `openat2` does).
fn open_canonical_beneath(root: &Path, relative: &Path) -> io::Result<File> {
    let root = root.canonicalize()?;
    let resolved = root.join(relative).canonicalize()?;
    if !resolved.starts_with(&root) {
        return Err(escapes(&root));
    }
    open_nonblocking(&resolved)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fallback where the kernel has no `openat2` refuses the same links `openat2` does.
    #[test]
    fn the_canonical_fallback_keeps_a_blob_beneath_its_root() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("sub")).expect("mkdir");
        std::fs::write(dir.path().join("secret"), b"outside").expect("write");
        std::fs::write(root.join("sub/inside.blob"), b"inside").expect("write");
        std::os::unix::fs::symlink("../secret", root.join("out.blob")).expect("symlink");
        std::os::unix::fs::symlink("sub/inside.blob", root.join("in.blob")).expect("symlink");
        for name in ["out.blob", "../secret"] {
            let err = open_canonical_beneath(&root, Path::new(name)).expect_err("refused");
            assert!(err.to_string().starts_with("it leads outside "), "{name}: {err}");
        }
        let file = open_canonical_beneath(&root, Path::new("in.blob")).expect("a link inside the root");
        assert_eq!(read_all(only_regular(file).expect("regular")).expect("reads").bytes(), b"inside");
    }
}
