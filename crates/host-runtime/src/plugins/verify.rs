//! A library's bytes checked before any of its code runs: read once from one open descriptor, hashed, compared
//! with the manifest's SHA-256, and only then handed to the dynamic loader — as a sealed in-memory copy of
//! exactly the bytes hashed (`memfd`, opened through `/proc/self/fd/N`), so a library rewritten on disk in
//! between changes nothing that runs.
//!
//! The copy costs the library's size in memory and one descriptor, both kept for the life of the process
//! (libraries are never unloaded, and the loader knows the library by that descriptor's name, which must not
//! be reused). A library loaded this way finds its own dependencies through the loader path and absolute
//! run paths, not `$ORIGIN`.

use std::io::Read;
use std::path::Path;

use delegate_abi::host::{HostConfig, Plugin};
use sha2::{Digest, Sha256};

/// A library file's bytes, read once, and their SHA-256 (lowercase hex).
pub(crate) struct LibraryBytes {
    bytes: Vec<u8>,
    /// SHA-256 of `bytes`, lowercase hex.
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
    /// cannot stall the host; its type checked on the descriptor, not the path).
    pub(crate) fn read(path: &Path) -> Result<LibraryBytes, String> {
        let file = open_regular(path)?;
        let len = file.metadata().map_err(|err| format!("cannot read it: {err}"))?.len();
        let mut bytes = Vec::new();
        let reserve = usize::try_from(len).map_err(|_| format!("{len} bytes do not fit in memory"))?;
        bytes.try_reserve_exact(reserve).map_err(|_| format!("cannot allocate {len} bytes to read it"))?;
        (&file).read_to_end(&mut bytes).map_err(|err| format!("cannot read it: {err}"))?;
        let sha256 = Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
        Ok(LibraryBytes { bytes, sha256 })
    }

    /// These bytes must be what `manifest_sha256` says, else the reason (naming `path` and the fix).
    pub(crate) fn check(&self, path: &Path, manifest_sha256: &str) -> Result<(), String> {
        if self.sha256.eq_ignore_ascii_case(manifest_sha256) {
            Ok(())
        } else {
            Err(sha256_mismatch(path, manifest_sha256, &self.sha256))
        }
    }

    /// Hands exactly these bytes to the dynamic loader; the plugin records `path`.
    pub(crate) fn load(&self, path: &Path, config: &HostConfig) -> Result<Plugin, String> {
        load_bytes(&self.bytes, path, config)
    }
}

/// Opens `path` for reading without blocking, and checks on the descriptor that it is a regular file.
fn open_regular(path: &Path) -> Result<std::fs::File, String> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32);
    }
    let file = options.open(path).map_err(|err| format!("cannot open it: {err}"))?;
    let metadata = file.metadata().map_err(|err| format!("cannot read it: {err}"))?;
    if !metadata.is_file() {
        return Err(format!(
            "not a regular file (it is {})",
            crate::blob_file::file_kind(&metadata.file_type())
        ));
    }
    Ok(file)
}

#[cfg(target_os = "linux")]
fn load_bytes(bytes: &[u8], path: &Path, config: &HostConfig) -> Result<Plugin, String> {
    use rustix::fs::{fcntl_add_seals, memfd_create, MemfdFlags, SealFlags};
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let copy = |err: std::io::Error| format!("cannot make the in-memory copy to load: {err}");
    let fd = memfd_create("kv-delegate-plugin", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
        .map_err(|err| copy(err.into()))?;
    let mut file = std::fs::File::from(fd);
    file.write_all(bytes).map_err(copy)?;
    fcntl_add_seals(&file, SealFlags::SHRINK | SealFlags::GROW | SealFlags::WRITE | SealFlags::SEAL)
        .map_err(|err| copy(err.into()))?;
    let open = std::path::PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
    let result = Plugin::load_as(&open, path, config).map_err(|err| err.to_string());
    // Kept open for the life of the process: the loader may hold the library under this name, and a later
    // descriptor with the same number would otherwise be taken for it.
    std::mem::forget(file);
    result
}

#[cfg(not(target_os = "linux"))]
fn load_bytes(_bytes: &[u8], path: &Path, config: &HostConfig) -> Result<Plugin, String> {
    // No sealed in-memory files here: the file is loaded by its path, after its bytes were checked.
    Plugin::load(path, config).map_err(|err| err.to_string())
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
