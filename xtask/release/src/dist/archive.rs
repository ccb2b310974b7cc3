//! Reproducible `.tar.gz` archives: the same files give the same bytes, on any machine, at any time.
//!
//! What is fixed: entries sorted by path under one top directory, regular files and that directory only,
//! uid/gid 0 with empty owner names, mode 0644 (0755 for executables and the directory), one mtime for every
//! entry (the caller's: the release date), ustar headers; gzip with header mtime 0, no file name, OS byte
//! 255 ("unknown") and a fixed compression level. What a file system would add (the build machine's
//! owner, umask, timestamps, directory order) never reaches the archive.

use anyhow::{bail, Context};
use flate2::{Compression, GzBuilder};
use sha2::{Digest, Sha256};

/// One file of an archive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The path below the archive's top directory (`/`-separated, relative, no `..`).
    pub path: String,
    /// The file's bytes.
    pub bytes: Vec<u8>,
    /// Mode 0755 instead of 0644.
    pub executable: bool,
}

impl Entry {
    /// A regular file (0644).
    pub fn file(path: impl Into<String>, bytes: impl Into<Vec<u8>>) -> Entry {
        Entry { path: path.into(), bytes: bytes.into(), executable: false }
    }

    /// An executable file (0755): binaries and shared libraries.
    pub fn executable(path: impl Into<String>, bytes: impl Into<Vec<u8>>) -> Entry {
        Entry { path: path.into(), bytes: bytes.into(), executable: true }
    }
}

/// SHA-256 of `bytes`, lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// The `SHA256SUMS` text of `entries` (the format `sha256sum -c` checks): one `<hex>  <path>` line per entry,
/// sorted by path.
pub fn sha256sums(entries: &[Entry]) -> String {
    let mut lines: Vec<(&str, String)> =
        entries.iter().map(|e| (e.path.as_str(), sha256_hex(&e.bytes))).collect();
    lines.sort();
    lines.into_iter().map(|(path, hash)| format!("{hash}  {path}\n")).collect()
}

/// Writes `entries` as a gzipped tar whose paths all start with `top/`, every entry with modification time
/// `mtime` (seconds since the Unix epoch).
///
/// # Errors
/// Two entries with one path, a path that is absolute, empty or climbs (`..`), or a path tar cannot store.
pub fn tar_gz(top: &str, entries: &[Entry], mtime: u64) -> anyhow::Result<Vec<u8>> {
    check_path(top)?;
    let mut sorted: Vec<&Entry> = entries.iter().collect();
    sorted.sort_by(|a, b| a.path.cmp(&b.path));
    for pair in sorted.windows(2) {
        if pair[0].path == pair[1].path {
            bail!("two archive entries named {}", pair[0].path);
        }
    }
    let gz = GzBuilder::new().mtime(0).operating_system(255).write(Vec::new(), Compression::new(6));
    let mut tar = tar::Builder::new(gz);
    let header = |path: &str, size: u64, mode: u32, kind: tar::EntryType| -> anyhow::Result<tar::Header> {
        let mut header = tar::Header::new_ustar();
        header.set_path(path).with_context(|| format!("archive path {path}"))?;
        header.set_size(size);
        header.set_mode(mode);
        header.set_uid(0);
        header.set_gid(0);
        header.set_username("").context("owner name")?;
        header.set_groupname("").context("group name")?;
        header.set_mtime(mtime);
        header.set_entry_type(kind);
        header.set_cksum();
        Ok(header)
    };
    let dir = format!("{top}/");
    tar.append(&header(&dir, 0, 0o755, tar::EntryType::Directory)?, std::io::empty())?;
    for entry in sorted {
        check_path(&entry.path)?;
        let path = format!("{top}/{}", entry.path);
        let mode = if entry.executable { 0o755 } else { 0o644 };
        let head = header(&path, entry.bytes.len() as u64, mode, tar::EntryType::Regular)?;
        tar.append(&head, entry.bytes.as_slice())?;
    }
    let gz = tar.into_inner().context("finishing the tar stream")?;
    gz.finish().context("finishing the gzip stream")
}

fn check_path(path: &str) -> anyhow::Result<()> {
    let bad = path.is_empty()
        || path.starts_with('/')
        || path.contains('\\')
        || path.split('/').any(|part| part.is_empty() || part == "." || part == "..");
    if bad {
        bail!("archive path {path:?} must be relative, `/`-separated, without empty, `.` or `..` parts");
    }
    Ok(())
}

/// Unpacks a `.tar.gz` written by [`tar_gz`] (or any plain archive of regular files and directories) into
/// `dir`, refusing links and paths that leave `dir`.
///
/// # Errors
/// An unreadable archive, a link or special file, or an entry outside `dir`.
pub fn unpack(archive: &[u8], dir: &std::path::Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(archive));
    for entry in tar.entries().context("reading the archive")? {
        let mut entry = entry.context("reading an archive entry")?;
        let kind = entry.header().entry_type();
        if !(kind.is_file() || kind.is_dir()) {
            bail!("archive entry {} is not a regular file or directory", entry.path()?.display());
        }
        if !entry.unpack_in(dir).context("unpacking an archive entry")? {
            bail!("archive entry {} would leave {}", entry.path()?.display(), dir.display());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<Entry> {
        vec![
            Entry::file("README.md", "hello\n"),
            Entry::executable("libfoo.so", vec![0x7f, b'E', b'L', b'F', 0, 1, 2]),
            Entry::file("docs/abi.md", "# ABI\n"),
        ]
    }

    #[test]
    fn the_same_files_give_the_same_bytes_whatever_their_order() {
        let mut reversed = sample();
        reversed.reverse();
        let a = tar_gz("foo-0.1.0", &sample(), 1_764_547_200).expect("archive");
        let b = tar_gz("foo-0.1.0", &reversed, 1_764_547_200).expect("archive");
        assert_eq!(a, b);
        // Gzip header: magic, deflate, no flags, mtime 0, then OS 255.
        assert_eq!(a[..10], [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 255]);
        // Another date or other content changes the bytes (the test can fail).
        assert_ne!(a, tar_gz("foo-0.1.0", &sample(), 1_764_547_201).expect("archive"));
        let mut changed = sample();
        changed[0].bytes.push(b'!');
        assert_ne!(a, tar_gz("foo-0.1.0", &changed, 1_764_547_200).expect("archive"));
    }

    #[test]
    fn entries_are_sorted_owned_by_root_with_fixed_modes_and_mtime() {
        let bytes = tar_gz("foo-0.1.0", &sample(), 1_764_547_200).expect("archive");
        let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(bytes.as_slice()));
        let mut seen = Vec::new();
        for entry in tar.entries().expect("entries") {
            let entry = entry.expect("entry");
            let h = entry.header();
            assert_eq!((h.uid().expect("uid"), h.gid().expect("gid")), (0, 0));
            assert_eq!(h.username().expect("utf-8"), Some(""));
            assert_eq!(h.groupname().expect("utf-8"), Some(""));
            assert_eq!(h.mtime().expect("mtime"), 1_764_547_200);
            let path = entry.path().expect("path").display().to_string();
            seen.push((path, h.mode().expect("mode")));
        }
        let expected = [
            ("foo-0.1.0/", 0o755),
            ("foo-0.1.0/README.md", 0o644),
            ("foo-0.1.0/docs/abi.md", 0o644),
            ("foo-0.1.0/libfoo.so", 0o755),
        ];
        let expected: Vec<(String, u32)> = expected.iter().map(|(p, m)| (p.to_string(), *m)).collect();
        assert_eq!(seen, expected);
    }

    #[test]
    fn bad_paths_and_duplicates_are_refused() {
        for bad in ["/etc/passwd", "../up", "a//b", "", "a/./b"] {
            assert!(tar_gz("top", &[Entry::file(bad, "x")], 0).is_err(), "{bad:?}");
        }
        assert!(tar_gz("top", &[Entry::file("a", "x"), Entry::file("a", "y")], 0).is_err());
    }

    #[test]
    fn sums_are_what_sha256sum_checks_and_archives_unpack() {
        let sums = sha256sums(&sample());
        let lines: Vec<&str> = sums.lines().collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(
            lines[0], "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03  README.md",
            "sha256(\"hello\\n\")"
        );
        assert!(lines[1].ends_with("  docs/abi.md") && lines[2].ends_with("  libfoo.so"));

        let dir = tempfile::tempdir().expect("tempdir");
        unpack(&tar_gz("top", &sample(), 0).expect("archive"), dir.path()).expect("unpack");
        assert_eq!(std::fs::read(dir.path().join("top/docs/abi.md")).expect("file"), b"# ABI\n");
    }
}
