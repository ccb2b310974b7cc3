//! The CUDA driver resources of the execute path (cudarc, driver API, `libcuda` loaded at run time): the
//! device's primary context, a per-handle stream, and device buffers. All are created at init; the execute
//! path only binds the context to the calling thread and queues copies.
//!
//! cudarc panics when `libcuda` is missing or lacks a symbol; [`Device::open`] probes the library first and
//! catches a loader panic, so a machine without a CUDA driver gets a typed [`Error::CudaUnavailable`].

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, DriverError};

use crate::error::{Error, Result};

/// Whether the device can read and write ordinary host memory coherently: an integrated GPU (one physical
/// memory) that can also access pageable memory without `cudaHostRegister`. Only then may a host pointer be
/// bound to an engine tensor directly; everywhere else host memory is staged.
pub fn host_memory_engine_visible(integrated: bool, pageable_memory_access: bool) -> bool {
    integrated && pageable_memory_access
}

fn driver_err(call: &'static str, err: DriverError) -> Error {
    Error::Cuda { call, message: err.to_string() }
}

/// A CUDA device's primary context (the one the CUDA runtime, and so TensorRT, uses), retained for the
/// lifetime of this value.
#[derive(Debug, Clone)]
pub struct Device {
    ctx: Arc<CudaContext>,
    host_visible: bool,
}

impl Device {
    /// Loads the CUDA driver, initialises it and retains the primary context of device `ordinal`.
    ///
    /// # Errors
    /// [`Error::CudaUnavailable`] (`NotSupported`) when `libcuda` cannot be loaded, lacks a symbol, or the
    /// driver reports no such device (`cuInit` / `cuDeviceGet` failing, e.g. no GPU or an old driver).
    pub fn open(ordinal: u32) -> Result<Device> {
        // SAFETY: `is_culib_present` only tries `dlopen` on the driver's library names and drops what it
        // opened; loading libcuda runs its initialisers, which have no preconditions.
        if !unsafe { sys::is_culib_present() } {
            return Err(Error::CudaUnavailable {
                message: format!(
                    "the CUDA driver library could not be loaded (tried {}); install an NVIDIA driver",
                    candidate_names().join(", ")
                ),
            });
        }
        let ordinal_usize = usize::try_from(ordinal).unwrap_or(usize::MAX);
        let opened = std::panic::catch_unwind(|| {
            let ctx = CudaContext::new(ordinal_usize)?;
            let attr = |a| ctx.attribute(a);
            let integrated = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_INTEGRATED)? != 0;
            let pageable =
                attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS)? != 0;
            Ok::<_, DriverError>((ctx, integrated, pageable))
        });
        match opened {
            Ok(Ok((ctx, integrated, pageable))) => {
                Ok(Device { ctx, host_visible: host_memory_engine_visible(integrated, pageable) })
            }
            Ok(Err(err)) => Err(Error::CudaUnavailable {
                message: format!("CUDA device {ordinal} cannot be used: {err}"),
            }),
            Err(panic) => Err(Error::CudaUnavailable {
                message: format!("the CUDA driver library is unusable: {}", panic_message(&panic)),
            }),
        }
    }

    /// Whether host memory can be bound to engine tensors directly (see [`host_memory_engine_visible`]).
    pub fn host_memory_engine_visible(&self) -> bool {
        self.host_visible
    }

    /// Makes the primary context current on the calling thread (a no-op when it already is).
    pub(crate) fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(|e| driver_err("cuCtxSetCurrent", e))
    }

    /// Waits for all work of the context (used on drop, before freeing memory work may still use).
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.ctx.synchronize().map_err(|e| driver_err("cuCtxSynchronize", e))
    }
}

fn candidate_names() -> Vec<String> {
    ["cuda", "nvcuda"].iter().flat_map(|name| cudarc::get_lib_name_candidates(name)).collect()
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "cudarc panicked".to_owned())
}

/// A stream created by this delegate (blocking flags: it orders with the legacy default stream, so work the
/// caller queued there completes first).
#[derive(Debug)]
pub(crate) struct OwnedStream {
    raw: sys::CUstream,
    device: Device,
}

// SAFETY: a `CUstream` may be used from any host thread (with its context current, which every use binds).
unsafe impl Send for OwnedStream {}

impl OwnedStream {
    pub(crate) fn new(device: &Device) -> Result<OwnedStream> {
        device.bind()?;
        let raw = result::stream::create(result::stream::StreamKind::Default)
            .map_err(|e| driver_err("cuStreamCreate", e))?;
        Ok(OwnedStream { raw, device: device.clone() })
    }

    pub(crate) fn raw(&self) -> sys::CUstream {
        self.raw
    }
}

impl Drop for OwnedStream {
    fn drop(&mut self) {
        if self.device.bind().is_ok() {
            // SAFETY: `raw` was created by `cuStreamCreate` in `new`, is destroyed once, here; pending work
            // completes before the driver releases the stream's resources.
            let _ = unsafe { result::stream::destroy(self.raw) };
        }
    }
}

/// A device allocation owned by this delegate (`cuMemAlloc`, so at least 256-byte aligned as TensorRT
/// requires).
#[derive(Debug)]
pub(crate) struct DeviceBuffer {
    ptr: sys::CUdeviceptr,
    bytes: u64,
    device: Device,
}

// SAFETY: a device pointer is plain data usable from any host thread with its context current.
unsafe impl Send for DeviceBuffer {}

impl DeviceBuffer {
    /// Allocates `bytes` (at least 1) bytes of device memory.
    pub(crate) fn new(device: &Device, bytes: u64) -> Result<DeviceBuffer> {
        device.bind()?;
        let size = usize::try_from(bytes.max(1))
            .map_err(|_| Error::Cuda { call: "cuMemAlloc", message: format!("{bytes} bytes") })?;
        // SAFETY: the context is current (bound above); the allocation is freed once, in `Drop`.
        let ptr = unsafe { result::malloc_sync(size) }.map_err(|e| driver_err("cuMemAlloc", e))?;
        Ok(DeviceBuffer { ptr, bytes: bytes.max(1), device: device.clone() })
    }

    pub(crate) fn ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.bytes
    }

    pub(crate) fn as_void(&self) -> *mut c_void {
        self.ptr as usize as *mut c_void
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.device.bind().is_ok() {
            // SAFETY: `ptr` came from `cuMemAlloc` and is freed once; the owner synchronises the context
            // before dropping buffers (see `Runner`'s `Drop`), so no queued work still uses it.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}
