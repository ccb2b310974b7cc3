//! Files the command writes (`convert`'s output, `run --output-dir`'s `.npy` files): each written whole to a
//! temporary file beside its destination, flushed to disk, then renamed over the destination.
//!
//! The destination itself is never opened: whatever is at its path (a FIFO whose open would block until a
//! reader comes, a device, a symbolic link leading elsewhere) is not written through but replaced, and a
//! write that fails part-way (a full disk, a file-size limit, a crash) leaves what was there whole.
//! [`refuse_special`] refuses such an entry first, for outputs whose path the user may not have meant to
//! replace.

use std::io::{self, BufWriter};
use std::path::Path;

/// What [`replace`] hands its writer: the temporary file, buffered.
pub type Temporary = BufWriter<tempfile::NamedTempFile>;

/// Writes `path` through a temporary file in its directory: `write` fills it, then it is flushed, synced and
/// renamed over `path` (see the module docs). The file gets the permissions a new file would (`0o666` less
/// the umask), not a temporary file's private ones.
///
/// # Errors
/// The first error of creating, writing, syncing or renaming the temporary file (which is then removed).
pub fn replace(path: &Path, write: impl FnOnce(&mut Temporary) -> io::Result<()>) -> io::Result<()> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let mut builder = tempfile::Builder::new();
    builder.prefix(".delegate-host-");
    #[cfg(unix)]
    builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
    let mut out = BufWriter::new(builder.tempfile_in(dir)?);
    write(&mut out)?;
    let temp = out.into_inner().map_err(io::IntoInnerError::into_error)?;
    temp.as_file().sync_all()?;
    temp.persist(path).map_err(|err| err.error)?;
    Ok(())
}

/// Refuses `path` when something other than a regular file is there (a FIFO, a device, a socket, a
/// directory, a symbolic link), read from the entry itself (`lstat`), never opened; nothing there is fine.
///
/// # Errors
/// `InvalidInput` naming what is there (`not a regular file (it is a FIFO)`), or `lstat`'s error.
pub fn refuse_special(path: &Path) -> io::Result<()> {
    let kind = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta.file_type(),
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(err) => return Err(err),
    };
    if kind.is_file() {
        return Ok(());
    }
    let what = if kind.is_symlink() { "a symbolic link" } else { host_runtime::blob_file::file_kind(&kind) };
    Err(io::Error::new(io::ErrorKind::InvalidInput, format!("not a regular file (it is {what})")))
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn a_failed_write_leaves_the_old_file_whole_and_no_temporary_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("out.npy");
        std::fs::write(&path, b"old").expect("write");
        let err = replace(&path, |out| {
            out.write_all(b"half")?;
            Err(io::Error::other("the disk is full"))
        })
        .expect_err("fails");
        assert_eq!(err.to_string(), "the disk is full");
        assert_eq!(std::fs::read(&path).expect("read"), b"old");
        assert_eq!(std::fs::read_dir(dir.path()).expect("list").count(), 1, "the temporary file is gone");
        replace(&path, |out| out.write_all(b"new")).expect("writes");
        assert_eq!(std::fs::read(&path).expect("read"), b"new");
    }

    #[cfg(unix)]
    #[test]
    fn a_symbolic_link_or_a_directory_is_refused_a_regular_file_or_nothing_is_not() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("file");
        std::fs::write(&file, b"").expect("write");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&file, &link).expect("symlink");
        refuse_special(&file).expect("a regular file");
        refuse_special(&dir.path().join("absent")).expect("nothing there");
        let err = refuse_special(&link).expect_err("a link");
        assert_eq!(err.to_string(), "not a regular file (it is a symbolic link)");
        let err = refuse_special(dir.path()).expect_err("a directory");
        assert_eq!(err.to_string(), "not a regular file (it is a directory)");
    }
}
