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
    ordinal: u32,
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
            let pageable = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS)? != 0;
            Ok::<_, DriverError>((ctx, integrated, pageable))
        });
        match opened {
            Ok(Ok((ctx, integrated, pageable))) => {
                Ok(Device { ctx, ordinal, host_visible: host_memory_engine_visible(integrated, pageable) })
            }
            Ok(Err(err)) => Err(Error::CudaUnavailable {
                message: format!("CUDA device {ordinal} cannot be used: {err}"),
            }),
            Err(panic) => Err(Error::CudaUnavailable {
                message: format!("the CUDA driver library is unusable: {}", panic_message(&panic)),
            }),
        }
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
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
    let mut names: Vec<String> = Vec::new();
    for name in cudarc::get_lib_name_candidates("cuda") {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
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

fn bytes_usize(call: &'static str, bytes: u64) -> Result<usize> {
    usize::try_from(bytes).map_err(|_| Error::Cuda { call, message: format!("{bytes} bytes") })
}

/// `cuMemcpyHtoDAsync`: `bytes` from host `src` to device `dst`, ordered on `stream`.
///
/// # Safety
/// The context owning `stream` is current; `dst` is device memory valid for writes of `bytes` and `src` host
/// memory valid for reads of `bytes` until the stream has executed the copy.
pub(crate) unsafe fn copy_htod_async(
    dst: sys::CUdeviceptr,
    src: *const c_void,
    bytes: u64,
    stream: sys::CUstream,
) -> Result<()> {
    let n = bytes_usize("cuMemcpyHtoDAsync", bytes)?;
    // SAFETY: forwarded contract.
    unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src, n, stream) }
        .result()
        .map_err(|e| driver_err("cuMemcpyHtoDAsync", e))
}

/// `cuMemcpyDtoHAsync`: `bytes` from device `src` to host `dst`, ordered on `stream`.
///
/// # Safety
/// The context owning `stream` is current; `src` is device memory valid for reads of `bytes` and `dst` host
/// memory valid for writes of `bytes` until the stream has executed the copy.
pub(crate) unsafe fn copy_dtoh_async(
    dst: *mut c_void,
    src: sys::CUdeviceptr,
    bytes: u64,
    stream: sys::CUstream,
) -> Result<()> {
    let n = bytes_usize("cuMemcpyDtoHAsync", bytes)?;
    // SAFETY: forwarded contract.
    unsafe { sys::cuMemcpyDtoHAsync_v2(dst, src, n, stream) }
        .result()
        .map_err(|e| driver_err("cuMemcpyDtoHAsync", e))
}

/// `cuMemcpyDtoDAsync`: `bytes` from device `src` to device `dst` (not overlapping), ordered on `stream`.
///
/// # Safety
/// The context owning `stream` is current; both are device (or managed) memory valid for `bytes` until the
/// stream has executed the copy.
pub(crate) unsafe fn copy_dtod_async(
    dst: sys::CUdeviceptr,
    src: sys::CUdeviceptr,
    bytes: u64,
    stream: sys::CUstream,
) -> Result<()> {
    let n = bytes_usize("cuMemcpyDtoDAsync", bytes)?;
    // SAFETY: forwarded contract.
    unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, n, stream) }
        .result()
        .map_err(|e| driver_err("cuMemcpyDtoDAsync", e))
}

/// `cuStreamSynchronize`.
///
/// # Safety
/// `stream` is a valid stream (or null, the legacy default stream) of the current context.
pub(crate) unsafe fn stream_synchronize(stream: sys::CUstream) -> Result<()> {
    // SAFETY: forwarded contract.
    unsafe { sys::cuStreamSynchronize(stream) }.result().map_err(|e| driver_err("cuStreamSynchronize", e))
}

/// Resolves and exercises, with 1-byte copies on `stream`, every driver entry point the execute path uses
/// (cudarc resolves a symbol on its first call, allocating its name and panicking when it is missing), so
/// that happens here at init and never on the execute path.
///
/// # Errors
/// [`Error::CudaUnavailable`] when the driver lacks an entry point; [`Error::Cuda`] when a copy fails.
pub(crate) fn warm_up(device: &Device, stream: &OwnedStream, scratch: &DeviceBuffer) -> Result<()> {
    let other = DeviceBuffer::new(device, 1)?;
    let mut byte = [0u8; 1];
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: the context is current (`DeviceBuffer::new` bound it); both buffers hold one byte; `byte`
        // outlives the synchronise that ends this block.
        unsafe {
            copy_htod_async(scratch.ptr(), byte.as_ptr().cast(), 1, stream.raw())?;
            copy_dtod_async(other.ptr(), scratch.ptr(), 1, stream.raw())?;
            copy_dtoh_async(byte.as_mut_ptr().cast(), other.ptr(), 1, stream.raw())?;
            stream_synchronize(stream.raw())
        }
    }));
    match outcome {
        Ok(result) => result,
        Err(panic) => Err(Error::CudaUnavailable {
            message: format!("the CUDA driver library is unusable: {}", panic_message(&panic)),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a machine with a CUDA driver (the `device` tool's H200), the resources and copies the execute path
    /// uses work as the run path assumes: host -> staging -> device -> device -> host round trip on our own
    /// stream, then a synchronise. Without a driver: the clean `CudaUnavailable` error.
    #[test]
    fn stream_buffers_and_copies_round_trip_where_a_driver_exists() {
        let device = match Device::open(0) {
            Ok(device) => device,
            Err(err) => {
                assert!(matches!(err, Error::CudaUnavailable { .. }), "{err}");
                assert!(!std::path::Path::new("/dev/nvidiactl").exists(), "a driver exists but: {err}");
                return;
            }
        };
        eprintln!(
            "opened CUDA device 0; host memory engine-visible: {}",
            device.host_memory_engine_visible()
        );
        let stream = OwnedStream::new(&device).expect("stream");
        let src: Vec<u8> = (0..=255u8).cycle().take(4096).collect();
        let a = DeviceBuffer::new(&device, 4096).expect("alloc a");
        let b = DeviceBuffer::new(&device, 4096).expect("alloc b");
        let scratch = DeviceBuffer::new(&device, 0).expect("1-byte scratch");
        assert_eq!(scratch.capacity(), 1);
        warm_up(&device, &stream, &scratch).expect("every execute-path entry point resolves");
        for buffer in [&a, &b, &scratch] {
            assert_eq!(buffer.ptr() % crate::plan::TENSOR_ALIGNMENT, 0, "cuMemAlloc is 256-byte aligned");
        }
        let mut back = vec![0u8; 4096];
        device.bind().expect("bind");
        // SAFETY: the buffers hold 4096 bytes, `src` and `back` live until the synchronise below.
        unsafe {
            copy_htod_async(a.ptr(), src.as_ptr().cast(), 4096, stream.raw()).expect("h2d");
            copy_dtod_async(b.ptr(), a.ptr(), 4096, stream.raw()).expect("d2d");
            copy_dtoh_async(back.as_mut_ptr().cast(), b.ptr(), 4096, stream.raw()).expect("d2h");
            stream_synchronize(stream.raw()).expect("sync");
        }
        assert_eq!(back, src);
        // The legacy default stream (a caller passing a null stream) is accepted too.
        // SAFETY: null is the legacy default stream of the current context.
        unsafe { stream_synchronize(std::ptr::null_mut()) }.expect("default stream");
        drop((a, b, scratch, stream));
        device.synchronize().expect("context synchronise");
    }
}
