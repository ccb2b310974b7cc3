//! A library's bytes checked before any of its code runs: read once from one open descriptor, hashed as they
//! are copied into an in-memory file, compared with the manifest's SHA-256, and only then handed to the
//! dynamic loader as that sealed copy of exactly the bytes hashed (`memfd`, opened through
//! `/proc/self/fd/N`), so a library rewritten on disk in between changes nothing that runs. Discovery only
//! hashes ([`sha256`]); the copy is made when a library is loaded.
//!
//! The copy costs the library's size in memory and one descriptor, both kept for the life of the process
//! (libraries are never unloaded, and the loader knows the library by that descriptor's name, which must not
//! be reused). A library loaded this way finds its own dependencies through the loader path and absolute
//! run paths, not `$ORIGIN`.

use std::io::{Read, Write};
use std::path::Path;

use delegate_abi::host::{HostConfig, Plugin};
use sha2::{Digest, Sha256};

/// A library file's bytes, read once, hashed, and kept as the sealed in-memory copy the loader is given.
pub(crate) struct LibraryBytes {
    /// The bytes hashed, sealed against any change (Linux); `None` where there are no sealed memory files,
    /// and the library is then loaded by its path.
    copy: Option<std::fs::File>,
    /// SHA-256 of the bytes read, lowercase hex.
    pub sha256: String,
}

/// The manifest's SHA-256 against the library's, as a rejection reason naming the library and the fix.
pub(crate) fn sha256_mismatch(path: &Path, manifest: &str, library: &str) -> String {
    format!(
        "sha256: manifest {manifest}, library {library}: the library changed after its manifest was written \
         (rebuilt, or replaced); none of its code was run. If you trust it, write its manifest again with \
         `delegate-host plugin-manifest {}`",
        path.display()
    )
}

impl LibraryBytes {
    /// Reads the regular file at `path` through one descriptor (opened non-blocking, so a FIFO swapped in
    /// cannot stall the host; its type checked on the descriptor, not the path), hashing each chunk as it
    /// is copied into the in-memory file, which is then sealed.
    pub(crate) fn read(path: &Path) -> Result<LibraryBytes, String> {
        let mut copy = copy::create()?;
        let sha256 = hash_file(path, copy.as_mut())?;
        if let Some(copy) = &copy {
            copy::seal(copy)?;
        }
        Ok(LibraryBytes { copy, sha256 })
    }

    /// These bytes must be what `manifest_sha256` says, else the reason (naming `path` and the fix).
    pub(crate) fn check(&self, path: &Path, manifest_sha256: &str) -> Result<(), String> {
        check(path, manifest_sha256, &self.sha256)
    }

    /// Hands exactly the bytes hashed to the dynamic loader; the plugin records `path`.
    pub(crate) fn load(self, path: &Path, config: &HostConfig) -> Result<Plugin, String> {
        let Some(copy) = self.copy else {
            // No sealed in-memory files here: the file is loaded by its path, after its bytes were checked.
            return Plugin::load(path, config).map_err(|err| err.to_string());
        };
        let open = copy::proc_path(&copy);
        let result = Plugin::load_as(&open, path, config).map_err(|err| err.to_string());
        // Kept open for the life of the process: the loader may hold the library under this name, and a later
        // descriptor with the same number would otherwise be taken for it.
        std::mem::forget(copy);
        result
    }
}

/// The SHA-256 of the regular file at `path`, read through one non-blocking descriptor, with no copy kept:
/// what discovery checks a manifest against.
pub(crate) fn sha256(path: &Path) -> Result<String, String> {
    hash_file(path, None)
}

/// `library_sha256` must be what the manifest says, else the reason (naming `path` and the fix).
pub(crate) fn check(path: &Path, manifest_sha256: &str, library_sha256: &str) -> Result<(), String> {
    if library_sha256.eq_ignore_ascii_case(manifest_sha256) {
        Ok(())
    } else {
        Err(sha256_mismatch(path, manifest_sha256, library_sha256))
    }
}

/// Reads the regular file at `path` through one descriptor (opened non-blocking, so a FIFO swapped in cannot
/// stall the host; its type checked on the descriptor, not the path), hashing each chunk and writing it into
/// `copy` when one is given.
fn hash_file(path: &Path, mut copy: Option<&mut std::fs::File>) -> Result<String, String> {
    let mut file = crate::blob_file::open_regular(path).map_err(|err| match err.kind() {
        std::io::ErrorKind::InvalidInput => err.to_string(),
        _ => format!("cannot open it: {err}"),
    })?;
    let mut hasher = Sha256::new();
    let mut chunk = vec![0u8; 1 << 16];
    loop {
        let n = match file.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(format!("cannot read it: {err}")),
        };
        hasher.update(&chunk[..n]);
        if let Some(copy) = copy.as_mut() {
            copy.write_all(&chunk[..n]).map_err(copy::failed)?;
        }
    }
    Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// The sealed in-memory copy (Linux: `memfd_create` with sealing).
#[cfg(target_os = "linux")]
mod copy {
    use std::os::fd::AsRawFd;

    use rustix::fs::{fcntl_add_seals, memfd_create, MemfdFlags, SealFlags};

    pub(super) fn failed(err: impl Into<std::io::Error>) -> String {
        format!("cannot make the in-memory copy to load: {}", err.into())
    }

    pub(super) fn create() -> Result<Option<std::fs::File>, String> {
        let fd = memfd_create("kv-delegate-plugin", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
            .map_err(failed)?;
        Ok(Some(std::fs::File::from(fd)))
    }

    pub(super) fn seal(copy: &std::fs::File) -> Result<(), String> {
        // `FUTURE_WRITE`, not `WRITE`: no write through any descriptor from now on, without `WRITE`'s wait for
        // every page reference to drop (which fails with EBUSY on freshly written pages of a large library).
        fcntl_add_seals(copy, SealFlags::SHRINK | SealFlags::GROW | SealFlags::FUTURE_WRITE | SealFlags::SEAL)
            .map_err(failed)
    }

    pub(super) fn proc_path(copy: &std::fs::File) -> std::path::PathBuf {
        std::path::PathBuf::from(format!("/proc/self/fd/{}", copy.as_raw_fd()))
    }
}

/// Elsewhere: no copy; the library is loaded by its path after its bytes were hashed.
#[cfg(not(target_os = "linux"))]
mod copy {
    pub(super) fn failed(err: impl Into<std::io::Error>) -> String {
        format!("cannot make the in-memory copy to load: {}", err.into())
    }

    pub(super) fn create() -> Result<Option<std::fs::File>, String> {
        Ok(None)
    }

    pub(super) fn seal(_copy: &std::fs::File) -> Result<(), String> {
        Ok(())
    }

    pub(super) fn proc_path(_copy: &std::fs::File) -> std::path::PathBuf {
        unreachable!("no in-memory copy is made on this platform")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_is_refused_on_its_descriptor_without_blocking() {
        let dir = tempfile::tempdir().expect("temp dir");
        let fifo = dir.path().join("libfifo.so");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status().expect("mkfifo runs");
        assert!(made.success());
        let err = LibraryBytes::read(&fifo).err().expect("refused");
        assert_eq!(err, "not a regular file (it is a FIFO)");
    }

    #[test]
    fn the_hash_is_of_the_bytes_read_and_a_mismatch_names_the_library_and_the_fix() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("libx.so");
        std::fs::write(&path, b"abc").expect("write");
        let read = LibraryBytes::read(&path).expect("reads");
        // SHA-256("abc").
        let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(read.sha256, abc);
        assert_eq!(read.check(&path, abc), Ok(()));
        let reason = read.check(&path, &"0".repeat(64)).expect_err("mismatch");
        assert!(
            reason.starts_with(&format!("sha256: manifest {}, library {abc}", "0".repeat(64))),
            "{reason}"
        );
        assert!(reason.ends_with(&format!("`delegate-host plugin-manifest {}`", path.display())), "{reason}");
    }
}
