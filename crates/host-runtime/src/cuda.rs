//! CUDA memory for caller-owned buffers: device (`cuMemAlloc`), managed (`cuMemAllocManaged`) and pinned host
//! (`cuMemHostAlloc`) storage, zeroed at allocation and freed on drop, through the CUDA driver API (cudarc,
//! `libcuda` opened at run time).
//!
//! Nothing here runs unless a program declares a non-host buffer: [`Contexts::get`] opens a device's primary
//! context on first use. cudarc panics when `libcuda` is missing, so [`Context::open`] probes the library
//! first and catches any loader panic; a machine without a driver or without the device gets a typed
//! [`Error`], never a panic.
//!
//! This module and `blob_file`'s mapping are the only `unsafe` code of the crate.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::sync::Arc;

use std::marker::PhantomData;

use cudarc::driver::{result, sys, CudaContext, DriverError};
use delegate_abi::host::{ArgError, ArgList, Slot};
use delegate_abi::{DTypeCode, MemoryKind, TensorArg, ARG_INOUT, ARG_WRITABLE};
use et_error::{ErrorCode, HasErrorCode};

/// Why CUDA memory could not be had or used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `libcuda` cannot be loaded: no NVIDIA driver on this machine.
    #[error("no CUDA driver is available: {reason}")]
    NoDriver {
        /// What was tried.
        reason: String,
    },
    /// `libcuda` loads but does not initialise (`cuInit` fails: no GPU, a driver too old, ...).
    #[error("the CUDA driver cannot be used: {reason}")]
    DriverUnusable {
        /// The driver's words.
        reason: String,
    },
    /// The device ordinal is not one the driver sees.
    #[error("there is no CUDA device {ordinal} (the driver sees {count})")]
    NoDevice {
        /// The ordinal asked for.
        ordinal: i32,
        /// How many devices the driver sees.
        count: i32,
    },
    /// The device exists but its context cannot be opened.
    #[error("CUDA device {ordinal} cannot be used: {reason}")]
    DeviceUnusable {
        /// The device.
        ordinal: i32,
        /// The driver's words.
        reason: String,
    },
    /// An allocation failed (out of memory, usually).
    #[error("allocating {bytes} bytes of {kind} memory on CUDA device {ordinal} failed: {reason}")]
    Allocation {
        /// The device.
        ordinal: i32,
        /// `"device"`, `"managed"` or `"pinned"`.
        kind: &'static str,
        /// Size asked for.
        bytes: usize,
        /// The driver's words.
        reason: String,
    },
    /// Another driver call failed (a copy, a memset, a synchronisation).
    #[error("{call} on CUDA device {ordinal} failed: {reason}")]
    Driver {
        /// The driver function.
        call: &'static str,
        /// The device.
        ordinal: i32,
        /// The driver's words.
        reason: String,
    },
}

impl HasErrorCode for Error {
    fn error_code(&self) -> ErrorCode {
        match self {
            Error::NoDriver { .. }
            | Error::DriverUnusable { .. }
            | Error::NoDevice { .. }
            | Error::DeviceUnusable { .. } => ErrorCode::NotSupported,
            Error::Allocation { .. } => ErrorCode::MemoryAllocationFailed,
            Error::Driver { .. } => ErrorCode::Internal,
        }
    }
}

/// `CUDA_ERROR_X (what it means)`.
fn describe(err: DriverError) -> String {
    match (err.error_name(), err.error_string()) {
        (Ok(name), Ok(text)) => format!("{} ({})", name.to_string_lossy(), text.to_string_lossy()),
        _ => format!("{:?}", err.0),
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "cudarc panicked".to_owned())
}

/// The primary context of one CUDA device, retained while any clone (or any storage allocated in it) lives.
#[derive(Clone)]
pub struct Context {
    ctx: Arc<CudaContext>,
    ordinal: i32,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("ordinal", &self.ordinal).finish()
    }
}

impl Context {
    /// Loads the CUDA driver, initialises it and retains the primary context of device `ordinal`.
    ///
    /// # Errors
    /// [`Error::NoDriver`] when `libcuda` cannot be loaded, [`Error::DriverUnusable`] when `cuInit` fails,
    /// [`Error::NoDevice`] for an ordinal the driver does not see, [`Error::DeviceUnusable`] when the
    /// context cannot be retained; all `NotSupported`.
    pub fn open(ordinal: i32) -> Result<Context, Error> {
        // SAFETY: `is_culib_present` only `dlopen`s the driver's library names and drops what it opened;
        // loading libcuda runs its initialisers, which have no preconditions.
        if !unsafe { sys::is_culib_present() } {
            let mut tried: Vec<String> =
                ["cuda", "nvcuda"].iter().flat_map(|name| cudarc::get_lib_name_candidates(name)).collect();
            tried.sort();
            tried.dedup();
            return Err(Error::NoDriver {
                reason: format!(
                    "the driver library could not be loaded ({} names tried, libcuda.so.1 among them); \
                     install an NVIDIA driver",
                    tried.len()
                ),
            });
        }
        // cudarc panics if a symbol is missing from the loaded library (a driver older than the API it
        // binds); that is turned into an error too.
        let opened = std::panic::catch_unwind(|| -> Result<Arc<CudaContext>, Error> {
            result::init()
                .map_err(|e| Error::DriverUnusable { reason: format!("cuInit: {}", describe(e)) })?;
            let count = result::device::get_count().map_err(|e| Error::DriverUnusable {
                reason: format!("cuDeviceGetCount: {}", describe(e)),
            })?;
            let index = usize::try_from(ordinal).ok().filter(|_| ordinal < count);
            let index = index.ok_or(Error::NoDevice { ordinal, count })?;
            CudaContext::new(index).map_err(|e| Error::DeviceUnusable { ordinal, reason: describe(e) })
        });
        match opened {
            Ok(Ok(ctx)) => Ok(Context { ctx, ordinal }),
            Ok(Err(err)) => Err(err),
            Err(panic) => Err(Error::DriverUnusable {
                reason: format!("the driver library is unusable: {}", panic_message(panic.as_ref())),
            }),
        }
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> i32 {
        self.ordinal
    }

    fn driver_error(&self, call: &'static str) -> impl FnOnce(DriverError) -> Error + '_ {
        move |err| Error::Driver { call, ordinal: self.ordinal, reason: describe(err) }
    }

    /// Makes the context current on the calling thread (a no-op when it already is; allocates nothing).
    fn bind(&self) -> Result<(), Error> {
        self.ctx.bind_to_thread().map_err(self.driver_error("cuCtxSetCurrent"))
    }

    /// Waits for all work queued in the context.
    pub fn synchronize(&self) -> Result<(), Error> {
        self.ctx.synchronize().map_err(self.driver_error("cuCtxSynchronize"))
    }
}

/// Contexts opened on demand, one per device ordinal: a program with host buffers only never opens one.
#[derive(Debug, Default)]
pub struct Contexts {
    open: Vec<Context>,
}

impl Contexts {
    /// No context open yet.
    pub fn new() -> Contexts {
        Contexts::default()
    }

    /// Device `ordinal`'s context, opening it on first use.
    pub fn get(&mut self, ordinal: i32) -> Result<Context, Error> {
        if let Some(ctx) = self.open.iter().find(|c| c.ordinal == ordinal) {
            return Ok(ctx.clone());
        }
        let ctx = Context::open(ordinal)?;
        self.open.push(ctx.clone());
        Ok(ctx)
    }
}

/// One driver allocation with a device address (device or managed memory): zeroed when made, freed on drop.
/// [`DeviceStorage`] and [`ManagedStorage`] are this plus what their kind allows the host to do.
struct Allocation {
    ptr: sys::CUdeviceptr,
    len: usize,
    ctx: Context,
    memory: MemoryKind,
}

impl Allocation {
    /// `len` zero bytes of `memory` (device or managed) on `ctx`'s device.
    fn zeroed(ctx: &Context, len: usize, memory: MemoryKind) -> Result<Allocation, Error> {
        ctx.bind()?;
        // At least one byte is requested (the driver refuses zero); the allocation is freed once, in `Drop`.
        let allocated = match memory {
            // SAFETY: the context is current (bound above).
            MemoryKind::Managed => unsafe {
                result::malloc_managed(len.max(1), sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL)
            },
            // SAFETY: the context is current (bound above).
            _ => unsafe { result::malloc_sync(len.max(1)) },
        };
        let ptr = allocated.map_err(|e| Error::Allocation {
            ordinal: ctx.ordinal,
            kind: memory.name(),
            bytes: len,
            reason: describe(e),
        })?;
        let allocation = Allocation { ptr, len, ctx: ctx.clone(), memory };
        clear_device(&allocation.ctx, allocation.ptr, allocation.len)?;
        Ok(allocation)
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        // Work queued by delegates may still use the memory: wait for it before freeing.
        let ready = self.ctx.synchronize();
        let freed = ready.and_then(|()| {
            // SAFETY: `ptr` came from `cuMemAlloc`/`cuMemAllocManaged` in this context and is freed once,
            // here, by its only owner; the synchronisation above retired any queued work that used it.
            unsafe { result::free_sync(self.ptr) }.map_err(self.ctx.driver_error("cuMemFree"))
        });
        if let Err(err) = freed {
            tracing::warn!("leaking {} memory on CUDA device {}: {err}", self.memory, self.ctx.ordinal);
        }
    }
}

/// Device memory (`cuMemAlloc`): the host cannot dereference it.
pub struct DeviceStorage(Allocation);

/// Managed (unified) memory (`cuMemAllocManaged`, attached globally): one address valid on host and device.
pub struct ManagedStorage(Allocation);

/// Pinned (page-locked) host memory (`cuMemHostAlloc`, portable to every context).
pub struct PinnedStorage {
    ptr: *mut c_void,
    len: usize,
    ctx: Context,
}

// SAFETY: the allocation is owned by this value alone (no other handle to it exists), pinned memory is
// ordinary host memory to any thread, and freeing it from another thread is allowed by the driver.
unsafe impl Send for PinnedStorage {}
// SAFETY: shared access only reads (`bytes`); writing needs `&mut self`.
unsafe impl Sync for PinnedStorage {}

macro_rules! debug_storage {
    ($($ty:ident),*) => {$(
        impl std::fmt::Debug for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($ty)).field("len", &self.len).field("device", &self.ctx.ordinal).finish()
            }
        }
    )*};
}
debug_storage!(PinnedStorage);

/// What device and managed memory share: size, address, zeroing, device-to-device copies, and lending the
/// memory to one call's argument list.
macro_rules! allocation_methods {
    ($($ty:ident),*) => {$(
        impl std::fmt::Debug for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($ty)).field("len", &self.0.len).field("device", &self.0.ctx.ordinal).finish()
            }
        }

        impl $ty {
            /// Size in bytes.
            pub fn len(&self) -> usize {
                self.0.len
            }

            /// Whether it holds no bytes.
            pub fn is_empty(&self) -> bool {
                self.0.len == 0
            }

            /// The device ordinal.
            pub fn device(&self) -> i32 {
                self.0.ctx.ordinal
            }

            /// The address, as a delegate argument carries it.
            pub fn as_ptr(&self) -> *mut c_void {
                self.0.ptr as usize as *mut c_void
            }

            /// Zeroes every byte; complete when it returns.
            pub fn clear(&mut self) -> Result<(), Error> {
                clear_device(&self.0.ctx, self.0.ptr, self.0.len)
            }

            /// Copies `src` over these bytes (through the device; complete when it returns). Returns the bytes
            /// copied.
            pub fn copy_from(&mut self, src: &$ty) -> Result<u64, Error> {
                copy_device(&self.0.ctx, self.0.ptr, self.0.len, src.0.ptr, src.0.len)
            }

            /// The memory, borrowed for one call's argument list.
            pub fn raw(&mut self) -> RawMemory<'_> {
                RawMemory {
                    ptr: self.0.ptr,
                    len: self.0.len,
                    memory: self.0.memory,
                    device: self.0.ctx.ordinal,
                    borrow: PhantomData,
                }
            }
        }
    )*};
}
allocation_methods!(DeviceStorage, ManagedStorage);

impl DeviceStorage {
    /// `len` zero bytes of device memory on `ctx`'s device.
    ///
    /// # Errors
    /// [`Error::Allocation`] (`MemoryAllocationFailed`) when the driver refuses, [`Error::Driver`] when the
    /// memset fails.
    pub fn zeroed(ctx: &Context, len: usize) -> Result<DeviceStorage, Error> {
        Allocation::zeroed(ctx, len, MemoryKind::Device).map(DeviceStorage)
    }

    /// Copies the bytes to the host (a synchronous device-to-host copy).
    pub fn read(&self) -> Result<Vec<u8>, Error> {
        self.0.ctx.bind()?;
        let mut out = vec![0u8; self.0.len];
        if self.0.len > 0 {
            // SAFETY: the context is current; `ptr` is a live allocation of at least `len` bytes (freed only
            // in `Drop`, which cannot run while `&self` is held) and `out` holds exactly `len` bytes. The
            // copy is synchronous: it waits for prior work on the legacy default stream and completes before
            // returning.
            unsafe { result::memcpy_dtoh_sync(&mut out, self.0.ptr) }
                .map_err(self.0.ctx.driver_error("cuMemcpyDtoH"))?;
        }
        Ok(out)
    }

    /// Overwrites the bytes with `data` (a synchronous host-to-device copy); `data` must hold exactly
    /// [`DeviceStorage::len`] bytes.
    pub fn write(&mut self, data: &[u8]) -> Result<(), Error> {
        if data.len() != self.0.len {
            return Err(Error::Driver {
                call: "cuMemcpyHtoD",
                ordinal: self.0.ctx.ordinal,
                reason: format!("{} bytes given for a {}-byte buffer", data.len(), self.0.len),
            });
        }
        self.0.ctx.bind()?;
        if self.0.len > 0 {
            // SAFETY: the context is current; `ptr` is a live allocation of `len` bytes that `&mut self` makes
            // exclusively ours, and `data` holds exactly `len` bytes. The copy from pageable memory returns
            // once `data` has been consumed; the synchronisation below completes it on the device.
            unsafe { result::memcpy_htod_sync(self.0.ptr, data) }
                .map_err(self.0.ctx.driver_error("cuMemcpyHtoD"))?;
        }
        self.0.ctx.synchronize()
    }
}

impl ManagedStorage {
    /// `len` zero bytes of managed memory, attached globally, with `ctx`'s device as its home.
    ///
    /// # Errors
    /// [`Error::Allocation`] (`MemoryAllocationFailed`) when the driver refuses, [`Error::Driver`] when the
    /// memset fails.
    pub fn zeroed(ctx: &Context, len: usize) -> Result<ManagedStorage, Error> {
        Allocation::zeroed(ctx, len, MemoryKind::Managed).map(ManagedStorage)
    }

    /// The bytes, read in place on the host after synchronising the context (so no queued device work
    /// still writes them).
    pub fn bytes(&self) -> Result<&[u8], Error> {
        self.0.ctx.synchronize()?;
        // SAFETY: `ptr` is a live managed allocation of at least `len` bytes (freed only in `Drop`, which
        // cannot run while the returned borrow of `self` lives), valid on the host because it is managed
        // memory, and nothing writes it meanwhile: the context was synchronised above, and every writer in
        // this process needs `&mut self` (delegates receive its address only inside `Program::execute`).
        Ok(unsafe { std::slice::from_raw_parts(self.0.ptr as usize as *const u8, self.0.len) })
    }
}

impl PinnedStorage {
    /// `len` zero bytes of page-locked host memory, portable to every context.
    ///
    /// # Errors
    /// [`Error::Allocation`] (`MemoryAllocationFailed`) when the driver refuses.
    pub fn zeroed(ctx: &Context, len: usize) -> Result<PinnedStorage, Error> {
        ctx.bind()?;
        // SAFETY: the context is current. At least one byte is requested; the allocation is freed once, in
        // `Drop`.
        let ptr = unsafe { result::malloc_host(len.max(1), sys::CU_MEMHOSTALLOC_PORTABLE) }.map_err(|e| {
            Error::Allocation { ordinal: ctx.ordinal, kind: "pinned", bytes: len, reason: describe(e) }
        })?;
        let mut storage = PinnedStorage { ptr, len, ctx: ctx.clone() };
        storage.bytes_mut().fill(0);
        Ok(storage)
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
        // SAFETY: `ptr` is a live host allocation of at least `len` bytes, freed only in `Drop`; writers need
        // `&mut self`, so nothing writes it while the returned borrow lives.
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<u8>(), self.len) }
    }

    /// The bytes, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and `&mut self` makes this the only access for the borrow's lifetime.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.cast::<u8>(), self.len) }
    }
}

/// Device or managed memory borrowed mutably for one delegate call: only [`DeviceStorage::raw`] and
/// [`ManagedStorage::raw`] make one, so its address is always a live allocation of its size that nothing
/// else touches while the borrow lives.
#[derive(Debug)]
pub struct RawMemory<'a> {
    ptr: sys::CUdeviceptr,
    len: usize,
    memory: MemoryKind,
    device: i32,
    borrow: PhantomData<&'a mut [u8]>,
}

impl RawMemory<'_> {
    /// The address.
    pub fn as_ptr(&self) -> *mut c_void {
        self.ptr as usize as *mut c_void
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `Device` or `Managed`.
    pub fn memory(&self) -> MemoryKind {
        self.memory
    }

    /// The CUDA device ordinal.
    pub fn device(&self) -> i32 {
        self.device
    }
}

/// How a [`RawMemory`] argument is passed, mirroring `ArgList`'s safe pushes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read only (`push_input`: no flags).
    Read,
    /// Caller-owned state read and updated in place (`push_inout`: writable + inout); its slot serves
    /// `push_output_in_place`.
    InOut,
    /// An output slot (`push_output`: writable).
    Write,
}

/// Pushes device or managed memory onto `args` as `dtype × shape`, with the flags the safe pushes set for
/// `access` and the memory's kind and device ordinal. Allocates nothing beyond the list's capacity.
pub fn push_raw<'a>(
    args: &mut ArgList<'a>,
    memory: RawMemory<'a>,
    dtype: DTypeCode,
    shape: &[i64],
    access: Access,
) -> Result<Slot, ArgError> {
    let index = args.len();
    let mut arg = TensorArg::describe(dtype, shape, memory.memory)
        .ok_or(ArgError::RankTooLarge { index, rank: shape.len() })?;
    arg.data = memory.as_ptr();
    arg.nbytes = memory.len as u64;
    arg.device_id = memory.device;
    arg.flags = match access {
        Access::Read => 0,
        Access::InOut => ARG_WRITABLE | ARG_INOUT,
        Access::Write => ARG_WRITABLE,
    };
    // SAFETY: `memory` is a live device or managed allocation of `len` bytes on `device` (only this module's
    // storages make a `RawMemory`, and they free on drop, which the borrow `'a` rules out while the list
    // lives). It is borrowed mutably for `'a`, the list's lifetime, and consumed here, so nothing else
    // writes it and no other argument of the list gets this address except through
    // `push_output_in_place`, which shares it at the same address and size as the ABI allows. Managed
    // memory is host-visible: valid for host reads and writes of `len` bytes, and the storages synchronise
    // their own memsets and copies before returning, so no device work writes it behind the delegate.
    unsafe { args.push_raw(arg) }
}

/// `cuMemsetD8` over `len` bytes at `ptr`, then a context synchronisation: the memset is asynchronous to the
/// host for device and managed memory, and callers (and CPU delegates reading managed memory) must see
/// zeros.
fn clear_device(ctx: &Context, ptr: sys::CUdeviceptr, len: usize) -> Result<(), Error> {
    ctx.bind()?;
    if len > 0 {
        // SAFETY: the context is current; `ptr` is a live allocation of at least `len` bytes owned by the
        // caller's storage, which holds `&mut self`, so nothing else in this process writes it.
        unsafe { result::memset_d8_sync(ptr, 0, len) }.map_err(ctx.driver_error("cuMemsetD8"))?;
    }
    ctx.synchronize()
}

/// `cuMemcpyDtoD` of `len` bytes, then a context synchronisation (a device-to-device copy does not
/// synchronise with the host).
fn copy_device(
    ctx: &Context,
    dst: sys::CUdeviceptr,
    dst_len: usize,
    src: sys::CUdeviceptr,
    src_len: usize,
) -> Result<u64, Error> {
    if dst_len != src_len {
        return Err(Error::Driver {
            call: "cuMemcpyDtoD",
            ordinal: ctx.ordinal,
            reason: format!("source holds {src_len} bytes, destination {dst_len}"),
        });
    }
    ctx.bind()?;
    if dst_len > 0 {
        // SAFETY: the context is current; both are live allocations of `dst_len` bytes in it (owned by the
        // caller's storages, freed only on drop), distinct because `dst` is borrowed mutably and `src`
        // shared, so the ranges do not overlap.
        unsafe { result::memcpy_dtod_sync(dst, src, dst_len) }.map_err(ctx.driver_error("cuMemcpyDtoD"))?;
    }
    ctx.synchronize()?;
    Ok(dst_len as u64)
}

impl Drop for PinnedStorage {
    fn drop(&mut self) {
        let freed = self.ctx.synchronize().and_then(|()| {
            // SAFETY: `ptr` came from `cuMemHostAlloc` and is freed once, here, by its only owner, after the
            // context retired any queued work (a DMA) that used it.
            unsafe { result::free_host(self.ptr) }.map_err(self.ctx.driver_error("cuMemFreeHost"))
        });
        if let Err(err) = freed {
            tracing::warn!("leaking pinned memory: {err}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a machine without `libcuda` (every CI machine), opening a context is a typed error, not a panic;
    /// on a machine with a GPU, device 0 opens and its memory starts zeroed.
    #[test]
    fn opening_a_context_fails_cleanly_or_gives_zeroed_memory() {
        match Context::open(0) {
            Err(err @ (Error::NoDriver { .. } | Error::DriverUnusable { .. } | Error::NoDevice { .. })) => {
                assert_eq!(err.error_code(), ErrorCode::NotSupported);
                assert!(!err.to_string().contains('\n'), "{err}");
            }
            Err(other) => panic!("unexpected error: {other}"),
            Ok(ctx) => {
                let mut device = DeviceStorage::zeroed(&ctx, 300).expect("device memory");
                assert_eq!(device.read().expect("read"), vec![0u8; 300]);
                assert_eq!(memory_type(device.0.ptr), sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32);
                assert_eq!(is_managed(device.0.ptr), 0, "device memory is not managed");

                let pattern: Vec<u8> = (0..300u32).map(|i| (i % 251) as u8 + 1).collect();
                device.write(&pattern).expect("write");
                let mut copy = DeviceStorage::zeroed(&ctx, 300).expect("device memory");
                assert_eq!(copy.copy_from(&device).expect("device-to-device copy"), 300);
                assert_eq!(copy.read().expect("read"), pattern);
                copy.clear().expect("clear");
                assert_eq!(copy.read().expect("read"), vec![0u8; 300]);
                let short = DeviceStorage::zeroed(&ctx, 299).expect("device memory");
                assert!(copy.copy_from(&short).is_err(), "sizes must match");

                let managed = ManagedStorage::zeroed(&ctx, 300).expect("managed memory");
                assert!(managed.bytes().expect("bytes").iter().all(|&b| b == 0));
                assert_eq!(is_managed(managed.0.ptr), 1, "cuMemAllocManaged memory is managed");

                let pinned = PinnedStorage::zeroed(&ctx, 300).expect("pinned memory");
                assert!(pinned.bytes().iter().all(|&b| b == 0));
                let host = pinned.ptr as usize as sys::CUdeviceptr;
                assert_eq!(memory_type(host), sys::CUmemorytype::CU_MEMORYTYPE_HOST as u32);
            }
        }
    }

    fn pointer_attribute(ptr: sys::CUdeviceptr, attribute: sys::CUpointer_attribute) -> u32 {
        let mut value = [0u8; 8];
        // SAFETY: `value` has room for the largest of the two attributes asked for here (a 4-byte
        // `CUmemorytype` or a boolean); the driver writes only that and reads `ptr` as an address.
        unsafe { sys::cuPointerGetAttribute(value.as_mut_ptr().cast(), attribute, ptr) }
            .result()
            .expect("cuPointerGetAttribute");
        u32::from_le_bytes([value[0], value[1], value[2], value[3]])
    }

    fn memory_type(ptr: sys::CUdeviceptr) -> u32 {
        pointer_attribute(ptr, sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE)
    }

    fn is_managed(ptr: sys::CUdeviceptr) -> u32 {
        pointer_attribute(ptr, sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_MANAGED)
    }

    #[test]
    fn a_negative_ordinal_is_no_device_when_a_driver_exists() {
        match Context::open(-1) {
            Err(Error::NoDriver { .. } | Error::DriverUnusable { .. }) => {}
            Err(Error::NoDevice { ordinal, .. }) => assert_eq!(ordinal, -1),
            other => panic!("unexpected: {other:?}"),
        }
    }
}
