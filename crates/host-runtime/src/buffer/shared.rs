//! Host storage in a memory file mapped shared, which a worker process maps too (Linux only: an isolated
//! plugin's worker reads and writes the program's host memory in place; other targets use
//! `shared_disabled.rs`, where no storage is shared).

use std::os::fd::OwnedFd;
use std::ptr::NonNull;

use super::{AllocError, HostStorage};

/// The memory file behind a shared storage; `None` for heap memory.
pub(super) type File = Option<OwnedFd>;

/// What heap memory holds for its file.
pub(super) const NO_FILE: File = None;

impl HostStorage {
    /// `len` zero bytes in a memory file (`memfd`) mapped shared, so that another process given the file
    /// ([`HostStorage::shared_fd`]) maps the same pages: what an isolated plugin's worker reads and writes in
    /// place (see [`crate::isolate`]). Page aligned; pages are zero and materialise on first touch.
    ///
    /// The file is sealed at its size (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`): whoever else holds it
    /// can write its bytes but never shrink or grow it, so no page under this storage's mapping can disappear
    /// (which would be `SIGBUS` here).
    ///
    /// # Errors
    /// [`AllocError::Host`] when the file cannot be made, sized or sealed, or the mapping is refused.
    pub fn shared(len: usize) -> Result<HostStorage, AllocError> {
        use rustix::fs::{ftruncate, memfd_create, MemfdFlags, SealFlags};
        use rustix::mm::{mmap, MapFlags, ProtFlags};
        let refused = AllocError::Host { bytes: len };
        let size = len.max(1);
        let flags = MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING;
        let fd = memfd_create("kv-delegate-buffer", flags).map_err(|_| refused.clone())?;
        ftruncate(&fd, size as u64).map_err(|_| refused.clone())?;
        seal(&fd, SealFlags::empty()).map_err(|_| refused.clone())?;
        // SAFETY: a fresh mapping (null hint: the kernel picks an unused range) of `size` bytes of a file just
        // sized to `size` and sealed against shrinking, so every mapped page stays backed whoever else holds
        // the file (a worker). It is unmapped once, in `Drop`.
        let ptr = unsafe {
            mmap(std::ptr::null_mut(), size, ProtFlags::READ | ProtFlags::WRITE, MapFlags::SHARED, &fd, 0)
        }
        .map_err(|_| refused.clone())?;
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or(refused)?;
        Ok(HostStorage { ptr, len, file: Some(fd) })
    }

    /// The memory file of a [`HostStorage::shared`] storage; `None` for heap memory.
    pub fn shared_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.file.as_ref().map(|fd| fd.as_fd())
    }
}

/// Unmaps the mapping of a shared storage; `false`, doing nothing, for heap memory (`file` none).
///
/// # Safety
/// `ptr` and `len` are those of the storage whose `file` this is, and the storage is being dropped: nothing
/// reads or writes its bytes again.
pub(super) unsafe fn unmap(ptr: NonNull<u8>, len: usize, file: &File) -> bool {
    if file.is_none() {
        return false;
    }
    // SAFETY: a storage with a file is the `max(len, 1)`-byte mapping made in `HostStorage::shared` (the
    // caller's contract), unmapped once, here.
    if let Err(err) = unsafe { rustix::mm::munmap(ptr.as_ptr().cast(), len.max(1)) } {
        tracing::warn!("unmapping a shared buffer failed: {err}");
    }
    true
}

/// Seals a memory file (made with `MFD_ALLOW_SEALING`) at its present size: it can no longer shrink or
/// grow, nor its seals change, plus `extra` (`F_SEAL_WRITE` for a file that must not change at all). A
/// process it is shared with can then neither cut pages from under another's mapping nor undo the seals.
///
/// # Errors
/// The `fcntl` error.
pub(crate) fn seal(fd: impl std::os::fd::AsFd, extra: rustix::fs::SealFlags) -> rustix::io::Result<()> {
    use rustix::fs::SealFlags;
    rustix::fs::fcntl_add_seals(fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL | extra)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a worker process maps is the storage's own bytes: writes through the storage are in its memory
    /// file, which starts zeroed.
    #[test]
    fn shared_storage_is_its_memory_file() {
        use std::io::Read;
        let mut storage = HostStorage::shared(10_000).expect("a memory file");
        assert!(storage.bytes().iter().all(|&b| b == 0));
        storage.bytes_mut()[9_999] = 7;
        let fd = storage.shared_fd().expect("shared").try_clone_to_owned().expect("dup");
        let mut seen = Vec::new();
        std::fs::File::from(fd).read_to_end(&mut seen).expect("read the file");
        assert_eq!(seen.len(), 10_000);
        assert_eq!(seen[9_999], 7);
        assert!(HostStorage::zeroed(16).expect("heap").shared_fd().is_none());
    }

    /// Whoever else holds a shared storage's file (a worker) can neither shrink it (the storage's mapping
    /// would lose its pages: `SIGBUS` in the host) nor grow it nor lift the seals.
    #[test]
    fn shared_storage_cannot_be_resized_by_whoever_holds_its_file() {
        use rustix::fs::{fcntl_add_seals, fcntl_get_seals, ftruncate, SealFlags};
        let storage = HostStorage::shared(10_000).expect("a memory file");
        let fd = storage.shared_fd().expect("shared");
        assert_eq!(ftruncate(fd, 0), Err(rustix::io::Errno::PERM), "shrunk");
        assert_eq!(ftruncate(fd, 20_000), Err(rustix::io::Errno::PERM), "grown");
        assert_eq!(fcntl_add_seals(fd, SealFlags::WRITE), Err(rustix::io::Errno::PERM), "resealed");
        let seals = fcntl_get_seals(fd).expect("seals");
        assert!(seals.contains(SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL), "{seals:?}");
        assert!(!seals.contains(SealFlags::WRITE), "the worker writes the caches: {seals:?}");
        assert_eq!(storage.bytes()[9_999], 0);
    }
}
