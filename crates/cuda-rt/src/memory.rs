//! One owning allocation type, [`Allocation<K>`], for the three kinds of CUDA memory: [`Device`]
//! (`cuMemAlloc`), [`Managed`] (`cuMemAllocManaged`, attached globally) and [`Pinned`] host memory
//! (`cuMemHostAlloc`, portable to every context). The kind is a type parameter, so what the host may do with
//! the bytes (read them in place, or only through a copy) is checked at compile time.
//!
//! Every allocation requests at least one byte (the driver refuses zero), so even an empty one has a valid,
//! 256-byte aligned address. It is freed on drop, after the context has retired any queued work that may
//! still use it.

use std::ffi::c_void;
use std::marker::PhantomData;

use cudarc::driver::{result, sys};

use crate::context::Context;
use crate::driver;
use crate::error::{Error, Result};

/// A device address (`CUdeviceptr`). Under unified addressing, pinned host memory has one too: its host
/// address.
pub type DevicePtr = u64;

/// The kind of memory an [`Allocation`] holds: the workspace's one memory-kind vocabulary,
/// [`et_error::MemoryKind`] ([`MemoryKind::Host`] is never an allocation's: pageable memory is not the
/// driver's).
pub use et_error::MemoryKind;

mod sealed {
    use cudarc::driver::{result, sys, DriverError};

    use super::DevicePtr;

    /// How a kind is allocated and freed, so that no code matches on a kind that cannot be allocated.
    pub trait Sealed {
        /// The driver call that frees it, for messages.
        const FREE: &'static str;

        /// Allocates `bytes` bytes.
        ///
        /// # Safety
        /// A context is current and `bytes >= 1`; the result is freed once, with [`Sealed::free`].
        unsafe fn malloc(bytes: usize) -> Result<DevicePtr, DriverError>;

        /// Frees what [`Sealed::malloc`] returned.
        ///
        /// # Safety
        /// `ptr` came from [`Sealed::malloc`] of this kind, its context retired every queued work that used
        /// it, and nothing uses it again.
        unsafe fn free(ptr: DevicePtr) -> Result<(), DriverError>;
    }

    impl Sealed for super::Device {
        const FREE: &'static str = "cuMemFree";

        unsafe fn malloc(bytes: usize) -> Result<DevicePtr, DriverError> {
            // SAFETY: the caller makes a context current and asks for at least one byte.
            unsafe { result::malloc_sync(bytes) }
        }

        unsafe fn free(ptr: DevicePtr) -> Result<(), DriverError> {
            // SAFETY: `ptr` came from `cuMemAlloc` and is freed once, after its work retired (the contract).
            unsafe { result::free_sync(ptr) }
        }
    }

    impl Sealed for super::Managed {
        const FREE: &'static str = "cuMemFree";

        unsafe fn malloc(bytes: usize) -> Result<DevicePtr, DriverError> {
            // SAFETY: as for device memory.
            unsafe { result::malloc_managed(bytes, sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL) }
        }

        unsafe fn free(ptr: DevicePtr) -> Result<(), DriverError> {
            // SAFETY: `ptr` came from `cuMemAllocManaged` and is freed once, after its work retired.
            unsafe { result::free_sync(ptr) }
        }
    }

    impl Sealed for super::Pinned {
        const FREE: &'static str = "cuMemFreeHost";

        unsafe fn malloc(bytes: usize) -> Result<DevicePtr, DriverError> {
            // SAFETY: as for device memory.
            unsafe { result::malloc_host(bytes, sys::CU_MEMHOSTALLOC_PORTABLE) }
                .map(|p| p as usize as DevicePtr)
        }

        unsafe fn free(ptr: DevicePtr) -> Result<(), DriverError> {
            // SAFETY: `ptr` is the host address `cuMemHostAlloc` returned, freed once, after its work retired.
            unsafe { result::free_host(ptr as usize as *mut std::ffi::c_void) }
        }
    }
}

/// A kind of memory, as an [`Allocation`]'s type parameter: [`Device`], [`Managed`] or [`Pinned`].
pub trait Kind: sealed::Sealed {
    /// The kind as a value.
    const KIND: MemoryKind;
}

/// Memory with a device address the driver copies and sets by address ([`Device`] and [`Managed`]).
pub trait DeviceAddressable: Kind {}

/// Device memory (`cuMemAlloc`).
#[derive(Debug)]
pub enum Device {}
/// Managed memory (`cuMemAllocManaged`, `CU_MEM_ATTACH_GLOBAL`).
#[derive(Debug)]
pub enum Managed {}
/// Pinned host memory (`cuMemHostAlloc`, `CU_MEMHOSTALLOC_PORTABLE`).
#[derive(Debug)]
pub enum Pinned {}

impl Kind for Device {
    const KIND: MemoryKind = MemoryKind::Device;
}
impl Kind for Managed {
    const KIND: MemoryKind = MemoryKind::Managed;
}
impl Kind for Pinned {
    const KIND: MemoryKind = MemoryKind::Pinned;
}
impl DeviceAddressable for Device {}
impl DeviceAddressable for Managed {}

/// One driver allocation of kind `K`, owned: freed on drop.
pub struct Allocation<K: Kind> {
    /// The address (for pinned memory, the host address).
    ptr: DevicePtr,
    len: usize,
    ctx: Context,
    kind: PhantomData<K>,
}

// SAFETY: the allocation is owned by this value alone (no other handle to it exists); device addresses are
// plain data usable from any host thread with the context current (every use binds it), pinned and managed
// memory are ordinary memory to any thread, and the driver allows freeing from another thread.
unsafe impl<K: Kind> Send for Allocation<K> {}
// SAFETY: shared access only reads (`&self` methods read the bytes or copy them out); writing needs `&mut`.
unsafe impl<K: Kind> Sync for Allocation<K> {}

impl<K: Kind> std::fmt::Debug for Allocation<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allocation")
            .field("kind", &K::KIND)
            .field("len", &self.len)
            .field("device", &self.ctx.ordinal())
            .finish()
    }
}

impl<K: Kind> Allocation<K> {
    /// `len` bytes of kind `K` in `ctx`, contents undefined; every kind but [`Device`] is zeroed before it
    /// is handed out (so host views never see undefined bytes).
    fn alloc(ctx: &Context, len: usize) -> Result<Allocation<K>> {
        ctx.bind()?;
        let bytes = len.max(1);
        let failed =
            |reason: String| Error::Allocation { ordinal: ctx.ordinal(), kind: K::KIND, bytes: len, reason };
        let unusable = |message: String| Error::DriverUnusable { reason: format!("allocating: {message}") };
        let ptr = driver::guard(unusable, || {
            // SAFETY: the context is current (bound above); at least one byte is requested; the allocation is
            // freed once, in `Drop`.
            let allocated = unsafe { K::malloc(bytes) };
            allocated.map_err(|e| failed(driver::describe(e)))
        })?;
        Ok(Allocation { ptr, len, ctx: ctx.clone(), kind: PhantomData })
    }

    /// Size in bytes (the driver holds at least one).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The memory kind.
    pub fn kind(&self) -> MemoryKind {
        K::KIND
    }

    /// The device ordinal of the context it was allocated in.
    pub fn device(&self) -> i32 {
        self.ctx.ordinal()
    }

    /// The context it was allocated in.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The address, as a delegate argument or a kernel parameter carries it.
    pub fn as_ptr(&self) -> *mut c_void {
        self.ptr as usize as *mut c_void
    }

    /// The address as a device pointer (for pinned memory, its host address, valid under unified addressing).
    pub fn device_ptr(&self) -> DevicePtr {
        self.ptr
    }
}

impl Allocation<Device> {
    /// A handle another process passes to [`IpcMapping::open`] to address these same bytes (CUDA IPC): how an
    /// isolated plugin's worker reads and writes the caller's device memory in place.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver refuses (e.g. on a platform without CUDA IPC).
    pub fn ipc_handle(&self) -> Result<IpcHandle> {
        self.ctx.bind()?;
        let mut handle = sys::CUipcMemHandle_st { reserved: [0; 64] };
        driver::call("cuIpcGetMemHandle", self.ctx.ordinal(), || {
            // SAFETY: the context is current; `ptr` is the start of a live `cuMemAlloc` allocation (the only
            // kind IPC accepts), and `handle` is a local the driver fills.
            unsafe { sys::cuIpcGetMemHandle(&mut handle, self.ptr) }.result()
        })?;
        Ok(IpcHandle(handle.reserved.map(|c| c as u8)))
    }

    /// `len` bytes of device memory whose contents are undefined (for buffers the device writes before
    /// anything reads them, such as staging buffers). The host never reads device memory except through a
    /// driver copy, so undefined bytes are never observed by Rust code.
    ///
    /// # Errors
    /// [`Error::Allocation`] (`MemoryAllocationFailed`) when the driver refuses.
    pub fn uninit(ctx: &Context, len: usize) -> Result<Allocation<Device>> {
        Allocation::alloc(ctx, len)
    }

    /// `len` zero bytes of device memory.
    ///
    /// # Errors
    /// [`Error::Allocation`] (`MemoryAllocationFailed`) when the driver refuses, [`Error::Driver`] when the
    /// memset fails.
    pub fn zeroed(ctx: &Context, len: usize) -> Result<Allocation<Device>> {
        let mut allocation = Allocation::alloc(ctx, len)?;
        allocation.clear()?;
        Ok(allocation)
    }

    /// Copies the bytes to the host (a synchronous device-to-host copy: a host synchronisation, counted by
    /// [`crate::stats`]).
    ///
    /// # Errors
    /// [`Error::Driver`] when the copy fails.
    pub fn read(&self) -> Result<Vec<u8>> {
        self.ctx.bind()?;
        let mut out = vec![0u8; self.len];
        if self.len > 0 {
            crate::stats::count_host_sync();
            driver::call("cuMemcpyDtoH", self.ctx.ordinal(), || {
                // SAFETY: the context is current; `ptr` is a live allocation of at least `len` bytes (freed
                // only in `Drop`, which cannot run while `&self` is held) and `out` holds exactly `len` bytes.
                // The copy is synchronous: it waits for prior work on the legacy default stream and
                // completes before returning.
                unsafe { result::memcpy_dtoh_sync(&mut out, self.ptr) }
            })?;
        }
        Ok(out)
    }

    /// Overwrites the bytes with `data` (a synchronous host-to-device copy, complete when it returns).
    ///
    /// # Errors
    /// [`Error::SizeMismatch`] unless `data` holds exactly [`Allocation::len`] bytes; [`Error::Driver`] when
    /// the copy fails.
    pub fn write(&mut self, data: &[u8]) -> Result<()> {
        if data.len() != self.len {
            return Err(Error::SizeMismatch {
                call: "cuMemcpyHtoD",
                dst: self.len as u64,
                src: data.len() as u64,
            });
        }
        self.ctx.bind()?;
        if self.len > 0 {
            driver::call("cuMemcpyHtoD", self.ctx.ordinal(), || {
                // SAFETY: the context is current; `ptr` is a live allocation of `len` bytes that `&mut self`
                // makes exclusively ours, and `data` holds exactly `len` bytes. The copy from pageable memory
                // returns once `data` has been consumed; the synchronisation below completes it.
                unsafe { result::memcpy_htod_sync(self.ptr, data) }
            })?;
        }
        self.ctx.synchronize()
    }
}

impl Allocation<Managed> {
    /// `len` zero bytes of managed memory, attached globally, with `ctx`'s device as its home.
    ///
    /// # Errors
    /// [`Error::Allocation`] (`MemoryAllocationFailed`) when the driver refuses, [`Error::Driver`] when the
    /// memset fails.
    pub fn zeroed(ctx: &Context, len: usize) -> Result<Allocation<Managed>> {
        let mut allocation = Allocation::alloc(ctx, len)?;
        allocation.clear()?;
        Ok(allocation)
    }

    /// The bytes, read in place on the host after synchronising the context (so no queued device work still
    /// writes them).
    ///
    /// # Errors
    /// [`Error::Driver`] when the synchronisation reports an error.
    pub fn host_bytes(&self) -> Result<&[u8]> {
        self.ctx.synchronize()?;
        // SAFETY: `ptr` is a live managed allocation of at least `len` bytes (freed only in `Drop`, which
        // cannot run while the returned borrow of `self` lives), valid on the host because it is managed
        // memory, zeroed at allocation so never undefined, and nothing writes it meanwhile: the context was
        // synchronised above, and writers need `&mut self` (or an `unsafe` call whose contract gives them
        // exclusive use of the address).
        Ok(unsafe { std::slice::from_raw_parts(self.ptr as usize as *const u8, self.len) })
    }

    /// The bytes, writable in place on the host after synchronising the context.
    ///
    /// # Errors
    /// [`Error::Driver`] when the synchronisation reports an error.
    pub fn host_bytes_mut(&mut self) -> Result<&mut [u8]> {
        self.ctx.synchronize()?;
        // SAFETY: as in `host_bytes`, and `&mut self` makes this the only access for the borrow's lifetime.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr as usize as *mut u8, self.len) })
    }
}

impl Allocation<Pinned> {
    /// `len` zero bytes of page-locked host memory, portable to every context.
    ///
    /// # Errors
    /// [`Error::Allocation`] (`MemoryAllocationFailed`) when the driver refuses.
    pub fn zeroed(ctx: &Context, len: usize) -> Result<Allocation<Pinned>> {
        let allocation = Allocation::alloc(ctx, len)?;
        // SAFETY: `ptr` is a fresh host allocation of at least `len` bytes that nothing else knows; writing
        // through a raw pointer (rather than a slice) initialises it before any slice is made.
        unsafe { std::ptr::write_bytes(allocation.ptr as usize as *mut u8, 0, allocation.len) };
        Ok(allocation)
    }

    /// The bytes. Pinned memory is only written by the device through copies or kernels someone queued on
    /// its address with an `unsafe` call, whose contract keeps them from overlapping this borrow.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` is a live host allocation of at least `len` bytes, zeroed at allocation, freed only in
        // `Drop`; writers need `&mut self` (or an `unsafe` call's exclusive use), so nothing writes it while
        // the returned borrow lives.
        unsafe { std::slice::from_raw_parts(self.ptr as usize as *const u8, self.len) }
    }

    /// The bytes, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and `&mut self` makes this the only access for the borrow's lifetime.
        unsafe { std::slice::from_raw_parts_mut(self.ptr as usize as *mut u8, self.len) }
    }

    /// The bytes as `len / 8` atomic 64-bit words: a mailbox that a kernel writes through the allocation's
    /// device address (under unified addressing, pinned memory is mapped into every context at its host
    /// address) while the host polls it, with no copy and no synchronisation. Whoever queues such a kernel
    /// (an `unsafe` launch) promises that it writes only whole, aligned words of this allocation and that the
    /// host reads those words only through this view while the kernel may run.
    pub fn atomic_words(&self) -> &[std::sync::atomic::AtomicU64] {
        // SAFETY: `ptr` is a live host allocation of at least `len` bytes, 256-byte aligned (the driver's
        // alignment, above `AtomicU64`'s 8), zeroed at allocation so every word is initialised, freed only in
        // `Drop`, which cannot run while the borrow of `self` lives. `AtomicU64` has `u64`'s layout, and atomic
        // access is what memory written concurrently by another agent (the device, through the mapping) needs;
        // writers other than such kernels need `&mut self`.
        unsafe {
            std::slice::from_raw_parts(self.ptr as usize as *const std::sync::atomic::AtomicU64, self.len / 8)
        }
    }
}

impl<K: DeviceAddressable> Allocation<K> {
    /// Zeroes every byte (`cuMemsetD8`, then a context synchronisation: callers, and CPU code reading
    /// managed memory, must see zeros).
    ///
    /// # Errors
    /// [`Error::Driver`] when the memset fails.
    pub fn clear(&mut self) -> Result<()> {
        self.ctx.bind()?;
        if self.len > 0 {
            driver::call("cuMemsetD8", self.ctx.ordinal(), || {
                // SAFETY: the context is current; `ptr` is a live allocation of at least `len` bytes, and
                // `&mut self` means nothing else in this process writes it.
                unsafe { result::memset_d8_sync(self.ptr, 0, self.len) }
            })?;
        }
        self.ctx.synchronize()
    }

    /// Copies `src` (of the same kind and size) over these bytes through the device, complete when it
    /// returns. Returns the bytes copied.
    ///
    /// # Errors
    /// [`Error::SizeMismatch`] when the sizes differ; [`Error::Driver`] when the copy fails.
    pub fn copy_from(&mut self, src: &Allocation<K>) -> Result<u64> {
        if self.len != src.len {
            return Err(Error::SizeMismatch {
                call: "cuMemcpyDtoD",
                dst: self.len as u64,
                src: src.len as u64,
            });
        }
        self.ctx.bind()?;
        if self.len > 0 {
            driver::call("cuMemcpyDtoD", self.ctx.ordinal(), || {
                // SAFETY: the context is current; both are live allocations of `len` bytes (freed only on
                // drop), distinct because `self` is borrowed mutably and `src` shared, so they do not overlap.
                unsafe { result::memcpy_dtod_sync(self.ptr, src.ptr, self.len) }
            })?;
        }
        self.ctx.synchronize()?;
        Ok(self.len as u64)
    }
}

impl<K: Kind> Drop for Allocation<K> {
    fn drop(&mut self) {
        // Work queued on the memory may still use it: wait for it before freeing.
        let ordinal = self.ctx.ordinal();
        let freed = self.ctx.synchronize().and_then(|()| {
            driver::call(K::FREE, ordinal, || {
                // SAFETY: `ptr` came from `K::malloc` in this context and is freed once, here, by its only
                // owner, after the context retired any queued work that used it.
                unsafe { K::free(self.ptr) }
            })
        });
        if let Err(err) = freed {
            tracing::warn!(
                "leaking {} bytes of {} memory on CUDA device {ordinal}: {err}",
                self.len,
                K::KIND
            );
        }
    }
}

/// An opaque CUDA IPC handle of a device allocation ([`Allocation::ipc_handle`]), as bytes that can travel
/// to another process.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct IpcHandle(pub [u8; 64]);

impl std::fmt::Debug for IpcHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IpcHandle(..)")
    }
}

/// Another process's device allocation, opened from its [`IpcHandle`] in this process's context: device
/// memory this process may read and write, not own. Closed on drop.
pub struct IpcMapping {
    ptr: DevicePtr,
    len: usize,
    ctx: Context,
}

// SAFETY: a device address is plain data usable from any host thread with the context current (every use
// binds it); closing from another thread is allowed.
unsafe impl Send for IpcMapping {}

impl std::fmt::Debug for IpcMapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpcMapping").field("len", &self.len).field("device", &self.ctx.ordinal()).finish()
    }
}

impl IpcMapping {
    /// Opens `handle` (an allocation of at least `len` bytes, by the exporter's word) in `ctx`.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver refuses the handle (another device, a closed allocation, the same
    /// process).
    pub fn open(ctx: &Context, handle: &IpcHandle, len: usize) -> Result<IpcMapping> {
        ctx.bind()?;
        let raw = sys::CUipcMemHandle_st { reserved: handle.0.map(|b| b as std::ffi::c_char) };
        let mut ptr: DevicePtr = 0;
        driver::call("cuIpcOpenMemHandle", ctx.ordinal(), || {
            // SAFETY: the context is current; `ptr` is a local the driver fills; the handle is plain bytes the
            // driver validates.
            unsafe {
                sys::cuIpcOpenMemHandle_v2(
                    &mut ptr,
                    raw,
                    sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as std::ffi::c_uint,
                )
            }
            .result()
        })?;
        Ok(IpcMapping { ptr, len, ctx: ctx.clone() })
    }

    /// The address in this process, as a delegate argument carries it.
    pub fn as_ptr(&self) -> *mut c_void {
        self.ptr as usize as *mut c_void
    }

    /// The size the exporter gave.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device ordinal.
    pub fn device(&self) -> i32 {
        self.ctx.ordinal()
    }
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: `ptr` came from `cuIpcOpenMemHandle` in this context and is closed once, here.
            let _ = unsafe { sys::cuIpcCloseMemHandle(self.ptr) };
        }
    }
}
