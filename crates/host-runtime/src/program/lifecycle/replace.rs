//! Replacing a file whole: what a save writes goes to a temporary file beside the target, which is flushed
//! to disk and renamed over the target, so the target is always either the previous file, whole, or the new
//! one, whole.
//!
//! - A save that fails part-way (a full disk, a file-size limit) leaves the previous file as it was, and no
//!   temporary file: the temporary file is removed when the [`Replacement`] is dropped uncommitted. A process
//!   killed part-way leaves the previous file whole too (and its temporary file, `.kv-delegate-cache-*.partial`,
//!   beside it).
//! - Of two saves to the same path at once, each writes its own temporary file, and each rename is atomic:
//!   the target ends as one of the two files, whole.
//! - The target is never opened, so nothing at its path is written through or blocks the save: a symbolic
//!   link there (dangling or not) and anything but a regular file (a FIFO, a directory, a device) is refused,
//!   checked without following or opening it ([`std::fs::symlink_metadata`]); one swapped in after that
//!   check is replaced by the rename (which replaces a directory entry), never written through.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use program_manifest::file::file_kind;
use tempfile::NamedTempFile;

/// A file being written in place of `target`: [`Replacement::commit`] puts it there, dropping it removes it.
pub(super) struct Replacement {
    out: BufWriter<NamedTempFile>,
    target: PathBuf,
    dir: PathBuf,
}

impl Replacement {
    /// Starts replacing `target`: checks what is there (nothing, or a regular file) and creates the
    /// temporary file in its directory (readable as a file `std::fs::write` creates: `0o666` less the umask).
    ///
    /// # Errors
    /// `InvalidInput` naming a symbolic link at `target` (and where it points) or what else than a regular
    /// file is there; the system's error when `target` cannot be inspected or the temporary file created.
    pub(super) fn begin(target: &Path) -> io::Result<Replacement> {
        refuse_all_but_regular(target)?;
        let dir = match target.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let temp = tempfile::Builder::new()
            .prefix(".kv-delegate-cache-")
            .suffix(".partial")
            .permissions(readable_as_a_new_file())
            .tempfile_in(&dir)?;
        Ok(Replacement { out: BufWriter::new(temp), target: target.to_path_buf(), dir })
    }

    /// Where the new file's bytes go.
    pub(super) fn writer(&mut self) -> &mut impl Write {
        &mut self.out
    }

    /// Flushes the new file to disk, renames it over the target and flushes the directory (so the rename
    /// survives a power loss too).
    ///
    /// # Errors
    /// The system's error; the temporary file is removed and the target is as it was, unless only the
    /// directory's flush failed (the target is the new file then, perhaps not yet on disk).
    pub(super) fn commit(self) -> io::Result<()> {
        let temp = self.out.into_inner().map_err(io::IntoInnerError::into_error)?;
        temp.as_file().sync_all()?;
        temp.persist(&self.target).map_err(|err| err.error)?;
        File::open(&self.dir)?.sync_all()
    }
}

/// Refuses `target` when something other than a regular file is there, without following a link or opening
/// anything.
fn refuse_all_but_regular(target: &Path) -> io::Result<()> {
    let kind = match std::fs::symlink_metadata(target) {
        Ok(meta) => meta.file_type(),
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(err) => return Err(err),
    };
    if kind.is_symlink() {
        let to = std::fs::read_link(target).map(|to| format!(" to {}", to.display())).unwrap_or_default();
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "it is a symbolic link{to}, which a save does not follow; save to the file it names, or \
                 remove the link"
            ),
        ));
    }
    if !kind.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("not a regular file (it is {})", file_kind(&kind)),
        ));
    }
    Ok(())
}

/// The mode a new file gets (`0o666`, less the umask when it is created), as `std::fs::write` gives it.
fn readable_as_a_new_file() -> std::fs::Permissions {
    use std::os::unix::fs::PermissionsExt;
    std::fs::Permissions::from_mode(0o666)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The files in `dir`, by name, sorted.
    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .expect("read dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// Issue 44, item 2: a write that fails part-way (here the writer's caller gives up after half the
    /// bytes, as a save does on an error) leaves the previous file whole and no temporary file.
    #[test]
    fn a_replacement_abandoned_part_way_leaves_the_previous_file_and_no_temporary_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("cache.safetensors");
        std::fs::write(&path, b"the previous file").expect("write");
        let mut new = Replacement::begin(&path).expect("begins");
        new.writer().write_all(b"half of the ne").expect("writes");
        new.writer().flush().expect("flushes to the temporary file");
        assert_eq!(names(dir.path()).len(), 2, "the temporary file sits beside the target");
        assert_eq!(std::fs::read(&path).expect("read"), b"the previous file", "untouched while written");
        drop(new);
        assert_eq!(std::fs::read(&path).expect("read"), b"the previous file");
        assert_eq!(names(dir.path()), ["cache.safetensors"], "no temporary file left");
    }

    /// Issue 44, item 3: two saves interleaved (the second begins, writes and commits while the first is
    /// half-written) end with one whole file, the last committed; a reader never sees a mixture.
    #[test]
    fn interleaved_replacements_end_with_one_whole_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("cache.safetensors");
        std::fs::write(&path, b"old").expect("write");
        let (a, b) = (vec![b'a'; 100_000], vec![b'b'; 50_000]);
        let mut first = Replacement::begin(&path).expect("begins");
        first.writer().write_all(&a[..60_000]).expect("writes");
        let mut second = Replacement::begin(&path).expect("begins");
        second.writer().write_all(&b).expect("writes");
        assert_eq!(std::fs::read(&path).expect("read"), b"old");
        second.commit().expect("commits");
        assert_eq!(std::fs::read(&path).expect("read"), b, "the second save, whole");
        first.writer().write_all(&a[60_000..]).expect("writes");
        assert_eq!(std::fs::read(&path).expect("read"), b, "still the second save, whole");
        first.commit().expect("commits");
        assert_eq!(std::fs::read(&path).expect("read"), a, "the first save, whole");
        assert_eq!(names(dir.path()), ["cache.safetensors"]);
    }

    #[test]
    fn a_link_or_a_fifo_at_the_target_is_refused_before_anything_is_created() {
        let dir = tempfile::tempdir().expect("tempdir");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("missing", &link).expect("symlink");
        let err = Replacement::begin(&link).err().expect("a link is refused");
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(
            err.to_string(),
            "it is a symbolic link to missing, which a save does not follow; save to the file it names, or \
             remove the link"
        );
        let err = Replacement::begin(dir.path()).err().expect("a directory is refused");
        assert_eq!(err.to_string(), "not a regular file (it is a directory)");
        assert_eq!(names(dir.path()), ["link"], "no temporary file, no link target");
    }
}
