//! One shared mapping of a memory file: how the worker reaches the host's memory files, and how both
//! sides reach the doorbell's page.
#![allow(unsafe_code)]

use std::os::fd::BorrowedFd;

use delegate_abi::{DelegateError, ErrorCode};

/// A shared mapping of the first `len` bytes of a memory file (at least one page), unmapped when dropped.
pub(super) struct Mapping {
    /// The mapping's first byte.
    pub(super) ptr: *mut std::ffi::c_void,
    /// The bytes of the file it was asked for (a zero-length one still maps one page).
    pub(super) len: usize,
}

impl Mapping {
    /// Maps `fd`'s first `len` bytes shared, read-write when `writable`; a file shorter than `len` is refused.
    pub(super) fn new(fd: BorrowedFd<'_>, len: u64, writable: bool) -> Result<Mapping, DelegateError> {
        use rustix::mm::{mmap, MapFlags, ProtFlags};
        let len = usize::try_from(len).map_err(|_| DelegateError::internal("a region larger than memory"))?;
        let size = len.max(1);
        let prot = if writable { ProtFlags::READ | ProtFlags::WRITE } else { ProtFlags::READ };
        let actual = rustix::fs::fstat(fd).map_err(|err| DelegateError::internal(format!("fstat: {err}")))?;
        if (actual.st_size as u64) < len as u64 {
            return Err(DelegateError::internal(format!(
                "a memory file of {} bytes cannot hold {len}",
                actual.st_size
            )));
        }
        // SAFETY: a fresh mapping (null hint) of `size` bytes of a file at least `len` bytes long (checked
        // above; a zero-length region maps one page of a file the host sized to one byte or more), unmapped
        // once, in `Drop`. The host sealed every file it sends against shrinking before sending it (see
        // `crate::buffer::seal`), so no process, this one included, can take mapped pages away (`SIGBUS`).
        let ptr =
            unsafe { mmap(std::ptr::null_mut(), size, prot, MapFlags::SHARED, fd, 0) }.map_err(|err| {
                DelegateError::new(ErrorCode::MemoryAllocationFailed, format!("mapping {len} bytes: {err}"))
            })?;
        Ok(Mapping { ptr, len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once; every borrow of it is gone: the worker's (the blob
        // slice given to `init`, the argument list) because `serve` drops them first, the doorbell's because
        // they borrow the `Bell` that owns this mapping.
        let _ = unsafe { rustix::mm::munmap(self.ptr, self.len.max(1)) };
    }
}
