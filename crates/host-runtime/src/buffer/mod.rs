//! Caller-owned tensor storage, zero-initialised: 64-byte aligned host memory, or CUDA device, managed or
//! pinned memory (see [`crate::cuda`]) when a buffer declares it. The memory kind a delegate is told is
//! always the kind the storage really is.
//!
//! This module owns host allocations through raw pointers (`HostStorage`; `shared.rs` the memory-file
//! mappings a worker process shares, Linux only), its only `unsafe` code.
#![allow(unsafe_code)]

use std::borrow::Cow;

use std::alloc::Layout;
use std::ptr::NonNull;

use delegate_abi::MemoryKind;

#[cfg_attr(not(target_os = "linux"), path = "shared_disabled.rs")]
mod shared;
#[cfg(target_os = "linux")]
pub(crate) use shared::seal;

use crate::cuda::{
    self, Contexts, DevicePtr, DeviceStorage, ManagedStorage, PinnedStorage, RawInput, RawMemory,
};

/// Host storage for one tensor, zero-initialised, 64-byte aligned.
///
/// The bytes are one allocation owned through a raw pointer (not a `Box`), so an address taken from it once
/// stays valid however the storage is moved or borrowed later: a program lends these addresses to each call's
/// argument list once, at load (see `crate::program`), and every later slice is derived from the same pointer.
pub struct HostStorage {
    ptr: NonNull<u8>,
    len: usize,
    /// The memory file behind a shared storage (`HostStorage::shared`, Linux); none for heap memory.
    file: shared::File,
}

// SAFETY: the allocation is owned by this value alone (no other handle exists); `&self` only reads it.
unsafe impl Send for HostStorage {}
// SAFETY: as above; shared access only reads.
unsafe impl Sync for HostStorage {}

/// Alignment of host storage: a cache line, enough for every element type.
const ALIGN: usize = 64;

fn layout(len: usize) -> Option<Layout> {
    Layout::from_size_align(len.max(1).checked_next_multiple_of(ALIGN)?, ALIGN).ok()
}

/// Why storage could not be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AllocError {
    /// The host allocator refused (`MemoryAllocationFailed`).
    #[error("cannot allocate {bytes} bytes of host memory")]
    Host {
        /// The size asked for.
        bytes: usize,
    },
    /// No CUDA driver or device, or the CUDA allocation failed.
    #[error(transparent)]
    Cuda(#[from] cuda::Error),
}

impl et_error::HasErrorCode for AllocError {
    fn error_code(&self) -> et_error::ErrorCode {
        match self {
            AllocError::Host { .. } => et_error::ErrorCode::MemoryAllocationFailed,
            AllocError::Cuda(err) => err.error_code(),
        }
    }
}

impl HostStorage {
    /// `len` zero bytes, 64-byte aligned.
    ///
    /// Fallible and lazy: the memory comes zeroed from the allocator (`alloc_zeroed`, fresh pages for large
    /// sizes), so neither a refused allocation aborts the process nor a large one is written byte by byte.
    ///
    /// # Errors
    /// [`AllocError::Host`] when the allocator refuses.
    pub fn zeroed(len: usize) -> Result<HostStorage, AllocError> {
        let refused = AllocError::Host { bytes: len };
        let layout = layout(len).ok_or(refused.clone())?;
        // SAFETY: `layout` has a non-zero size (at least one line).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).ok_or(refused)?;
        Ok(HostStorage { ptr, len, file: shared::NO_FILE })
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` is a live, initialised (zeroed at allocation) allocation of at least `len` bytes, freed
        // only in `Drop`; writers need `&mut self` or go through `as_mut_ptr`'s contract.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and `&mut self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// The address of the bytes, with the allocation's own provenance: valid for reads and writes of
    /// [`HostStorage::len`] bytes until the storage is dropped, whatever borrows come and go in between.
    /// Whoever writes through it must not overlap another access.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Zeroes every byte.
    pub fn clear(&mut self) {
        self.bytes_mut().fill(0);
    }
}

impl Clone for HostStorage {
    fn clone(&self) -> HostStorage {
        let mut copy = HostStorage::zeroed(self.len).unwrap_or_else(|_| {
            std::alloc::handle_alloc_error(layout(self.len).unwrap_or(Layout::new::<u8>()))
        });
        copy.bytes_mut().copy_from_slice(self.bytes());
        copy
    }
}

impl Drop for HostStorage {
    fn drop(&mut self) {
        // SAFETY: `ptr` and `len` are this storage's, whose `file` is the one its mapping (if any) was made of;
        // it is dropped once, here, and no borrow of its bytes outlives `self`.
        if unsafe { shared::unmap(self.ptr, self.len, &self.file) } {
            return;
        }
        if let Some(layout) = layout(self.len) {
            // SAFETY: `ptr` was allocated with this layout (the same `len`) and is freed once, here.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

impl std::fmt::Debug for HostStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostStorage").field("len", &self.len).finish()
    }
}

/// A buffer's storage, of the memory kind it declares.
#[derive(Debug)]
#[non_exhaustive]
pub enum Storage {
    /// Ordinary host memory.
    Host(HostStorage),
    /// Page-locked host memory.
    Pinned(PinnedStorage),
    /// CUDA device memory.
    Device(DeviceStorage),
    /// CUDA managed memory.
    Managed(ManagedStorage),
}

/// Where a storage's bytes are, borrowed mutably for one delegate call.
#[derive(Debug)]
pub enum View<'a> {
    /// Host-visible bytes of host and pinned memory, passed as a slice.
    Host(&'a mut [u8]),
    /// Device or managed memory, passed by address.
    Raw(RawMemory<'a>),
}

/// Where a storage's bytes are, borrowed for reading by one delegate call.
#[derive(Debug)]
pub enum ReadView<'a> {
    /// Host-visible bytes of host and pinned memory, passed as a slice.
    Host(&'a [u8]),
    /// Device or managed memory, passed by address, read only.
    Raw(RawInput<'a>),
}

impl Storage {
    /// `len` zero bytes of `memory` on CUDA device `device` (ignored for host memory), opening the device's
    /// context through `contexts` only when the kind needs one.
    pub fn zeroed(
        memory: MemoryKind,
        device: i32,
        len: usize,
        contexts: &mut Contexts,
    ) -> Result<Storage, AllocError> {
        Ok(match memory {
            MemoryKind::Host => Storage::Host(HostStorage::zeroed(len)?),
            MemoryKind::Pinned => Storage::Pinned(PinnedStorage::zeroed(&contexts.get(device)?, len)?),
            MemoryKind::Device => Storage::Device(DeviceStorage::zeroed(&contexts.get(device)?, len)?),
            MemoryKind::Managed => Storage::Managed(ManagedStorage::zeroed(&contexts.get(device)?, len)?),
        })
    }

    /// The memory kind it really is.
    pub fn memory(&self) -> MemoryKind {
        match self {
            Storage::Host(_) => MemoryKind::Host,
            Storage::Pinned(_) => MemoryKind::Pinned,
            Storage::Device(_) => MemoryKind::Device,
            Storage::Managed(_) => MemoryKind::Managed,
        }
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        match self {
            Storage::Host(s) => s.len(),
            Storage::Pinned(s) => s.len(),
            Storage::Device(s) => s.len(),
            Storage::Managed(s) => s.len(),
        }
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes: borrowed for host, pinned and managed memory (managed after a context synchronisation),
    /// copied to the host for device memory.
    pub fn read(&self) -> Result<Cow<'_, [u8]>, cuda::Error> {
        Ok(match self {
            Storage::Host(s) => Cow::Borrowed(s.bytes()),
            Storage::Pinned(s) => Cow::Borrowed(s.bytes()),
            Storage::Device(s) => Cow::Owned(s.read()?),
            Storage::Managed(s) => Cow::Borrowed(s.host_bytes()?),
        })
    }

    /// Zeroes every byte.
    pub fn clear(&mut self) -> Result<(), cuda::Error> {
        match self {
            Storage::Host(s) => s.clear(),
            Storage::Pinned(s) => s.bytes_mut().fill(0),
            Storage::Device(s) => s.clear()?,
            Storage::Managed(s) => s.clear()?,
        }
        Ok(())
    }

    /// The storage as one delegate call sees it. Allocates nothing.
    pub fn view(&mut self) -> View<'_> {
        match self {
            Storage::Host(s) => View::Host(s.bytes_mut()),
            Storage::Pinned(s) => View::Host(s.bytes_mut()),
            Storage::Device(s) => View::Raw(RawMemory::device(s)),
            Storage::Managed(s) => View::Raw(RawMemory::managed(s)),
        }
    }

    /// The storage as one delegate call reads it. Allocates nothing.
    pub fn view_read(&self) -> ReadView<'_> {
        match self {
            Storage::Host(s) => ReadView::Host(s.bytes()),
            Storage::Pinned(s) => ReadView::Host(s.bytes()),
            Storage::Device(s) => ReadView::Raw(RawInput::device(s)),
            Storage::Managed(s) => ReadView::Raw(RawInput::managed(s)),
        }
    }

    /// The address of the whole storage and its CUDA device (0 for host memory), to lend to a call's argument
    /// list once (see `crate::lend`). For host memory the address keeps the allocation's provenance, so it
    /// stays valid across later moves and borrows of the storage.
    pub(crate) fn lend(&mut self) -> (*mut std::ffi::c_void, i32) {
        match self {
            Storage::Host(s) => (s.as_mut_ptr().cast(), 0),
            Storage::Pinned(s) => (s.as_ptr(), 0),
            Storage::Device(s) => (s.as_ptr(), s.device()),
            Storage::Managed(s) => (s.as_ptr(), s.device()),
        }
    }

    /// The device address of device or managed memory (what a kernel is given); `None` for host and pinned
    /// memory.
    pub fn device_ptr(&self) -> Option<DevicePtr> {
        match self {
            Storage::Device(s) => Some(s.device_ptr()),
            Storage::Managed(s) => Some(s.device_ptr()),
            Storage::Host(_) | Storage::Pinned(_) => None,
        }
    }

    /// The bytes in place, for memory the host can read: host and pinned memory, and managed memory after a
    /// context synchronisation; `Ok(None)` for device memory.
    pub fn host_slice(&self) -> Result<Option<&[u8]>, cuda::Error> {
        Ok(match self {
            Storage::Host(s) => Some(s.bytes()),
            Storage::Pinned(s) => Some(s.bytes()),
            Storage::Managed(s) => Some(s.host_bytes()?),
            Storage::Device(_) => None,
        })
    }

    /// The bytes in place, writable, for memory the host can write (as [`Storage::host_slice`]).
    pub fn host_slice_mut(&mut self) -> Result<Option<&mut [u8]>, cuda::Error> {
        Ok(match self {
            Storage::Host(s) => Some(s.bytes_mut()),
            Storage::Pinned(s) => Some(s.bytes_mut()),
            Storage::Managed(s) => Some(s.host_bytes_mut()?),
            Storage::Device(_) => None,
        })
    }

    /// Overwrites every byte with `data` (exactly [`Storage::len`] bytes): a host copy for host-visible
    /// memory, a synchronous host-to-device copy for device memory.
    pub fn write(&mut self, data: &[u8]) -> Result<(), cuda::Error> {
        if let Storage::Device(s) = self {
            return s.write(data);
        }
        let len = self.len();
        match self.host_slice_mut()? {
            Some(bytes) => copy_host(bytes, data).map(drop),
            None => Err(cuda::Error::SizeMismatch { call: "write", dst: len as u64, src: data.len() as u64 }),
        }
    }

    /// Copies `src` (a storage of the same kind and size) over these bytes: a host copy for host-visible
    /// memory, a device-to-device copy for device and managed memory. Returns the bytes copied.
    pub fn copy_from(&mut self, src: &Storage) -> Result<u64, cuda::Error> {
        match (self, src) {
            (Storage::Device(dst), Storage::Device(src)) => dst.copy_from(src),
            (Storage::Managed(dst), Storage::Managed(src)) => dst.copy_from(src),
            (Storage::Host(dst), Storage::Host(src)) => copy_host(dst.bytes_mut(), src.bytes()),
            (Storage::Pinned(dst), Storage::Pinned(src)) => copy_host(dst.bytes_mut(), src.bytes()),
            (dst, src) => Err(cuda::Error::KindMismatch {
                call: "copy",
                dst: dst.memory().name(),
                src: src.memory().name(),
            }),
        }
    }
}

impl Storage {
    /// Queues a copy of `src` (same kind and size) over these bytes on the program's `stream`: an
    /// asynchronous device-to-device copy for device and managed memory. Host and pinned memory are copied
    /// by the host at once; the caller has synchronised the stream first when queued work may still use
    /// them. Returns the bytes copied.
    pub(crate) fn copy_from_on(&mut self, src: &Storage, stream: &cuda::Stream) -> Result<u64, cuda::Error> {
        match (self, src) {
            (Storage::Device(dst), Storage::Device(src)) => cuda::copy_async(dst, src, stream),
            (Storage::Managed(dst), Storage::Managed(src)) => cuda::copy_async(dst, src, stream),
            (dst, src) => dst.copy_from(src),
        }
    }

    /// Whether copies into it are made by the host (host and pinned memory), not queued on a stream.
    pub(crate) fn host_copied(&self) -> bool {
        matches!(self, Storage::Host(_) | Storage::Pinned(_))
    }
}

fn copy_host(dst: &mut [u8], src: &[u8]) -> Result<u64, cuda::Error> {
    if dst.len() != src.len() {
        return Err(cuda::Error::SizeMismatch { call: "copy", dst: dst.len() as u64, src: src.len() as u64 });
    }
    dst.copy_from_slice(src);
    Ok(src.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_is_zeroed_aligned_and_exact() {
        let mut s = HostStorage::zeroed(100).expect("100 bytes");
        assert_eq!(s.bytes().len(), 100);
        assert!(s.bytes().iter().all(|&b| b == 0));
        assert_eq!(s.bytes().as_ptr() as usize % 64, 0);
        s.bytes_mut()[99] = 7;
        assert_eq!(s.bytes()[99], 7);
        s.clear();
        assert_eq!(s.bytes()[99], 0);
    }

    #[test]
    fn host_storage_needs_no_cuda_and_copies_by_size() {
        let mut contexts = Contexts::new();
        let mut a = Storage::zeroed(MemoryKind::Host, 0, 8, &mut contexts).expect("host memory");
        let mut b = Storage::zeroed(MemoryKind::Host, 7, 8, &mut contexts).expect("the ordinal is ignored");
        assert_eq!(a.memory(), MemoryKind::Host);
        match b.view() {
            View::Host(bytes) => bytes[3] = 9,
            View::Raw(_) => panic!("host memory is passed as a slice"),
        }
        assert_eq!(a.copy_from(&b).expect("same size"), 8);
        assert_eq!(a.read().expect("read")[3], 9);
        a.clear().expect("clear");
        assert!(a.read().expect("read").iter().all(|&x| x == 0));
        let short = Storage::zeroed(MemoryKind::Host, 0, 4, &mut contexts).expect("host memory");
        assert!(a.copy_from(&short).is_err(), "sizes must match");
    }
}
