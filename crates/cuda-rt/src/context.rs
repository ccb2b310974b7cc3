//! A device's primary context (the one the CUDA runtime, and so TensorRT and cuBLAS, use) and the set of
//! contexts a program opens on demand.

use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext};

use crate::driver::{self, describe, guard};
use crate::error::{Error, Result};

/// The primary context of one CUDA device, retained while any clone (or anything allocated in it) lives.
#[derive(Clone)]
pub struct Context {
    ctx: Arc<CudaContext>,
    ordinal: i32,
    integrated: bool,
    pageable_memory_access: bool,
    compute_capability: (i32, i32),
    multiprocessors: u32,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("ordinal", &self.ordinal)
            .field("integrated", &self.integrated)
            .field("pageable_memory_access", &self.pageable_memory_access)
            .field("compute_capability", &self.compute_capability)
            .field("multiprocessors", &self.multiprocessors)
            .finish()
    }
}

impl PartialEq for Context {
    /// The same device's primary context (opened once or several times: it is the same driver context).
    fn eq(&self, other: &Context) -> bool {
        self.ordinal == other.ordinal && *self.ctx == *other.ctx
    }
}

impl Context {
    /// Loads the CUDA driver, initialises it and retains the primary context of device `ordinal`.
    ///
    /// # Errors
    /// [`Error::NoDriver`] when `libcuda` cannot be loaded, [`Error::DriverUnusable`] when `cuInit` fails or
    /// the library lacks an entry point, [`Error::NoDevice`] for an ordinal the driver does not see,
    /// [`Error::DeviceUnusable`] when the context cannot be retained; all `NotSupported`.
    pub fn open(ordinal: i32) -> Result<Context> {
        if !driver::driver_present() {
            return Err(driver::no_driver());
        }
        let unusable = |message: String| Error::DriverUnusable {
            reason: format!("the driver library is unusable: {message}"),
        };
        guard(unusable, || {
            result::init()
                .map_err(|e| Error::DriverUnusable { reason: format!("cuInit: {}", describe(e)) })?;
            let count = result::device::get_count().map_err(|e| Error::DriverUnusable {
                reason: format!("cuDeviceGetCount: {}", describe(e)),
            })?;
            let index = usize::try_from(ordinal).ok().filter(|_| ordinal < count);
            let index = index.ok_or(Error::NoDevice { ordinal, count })?;
            let unusable = |e| Error::DeviceUnusable { ordinal, reason: describe(e) };
            let ctx = CudaContext::new(index).map_err(unusable)?;
            let attribute = |a| ctx.attribute(a).map_err(unusable);
            let integrated = attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_INTEGRATED)? != 0;
            let pageable_memory_access =
                attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS)? != 0;
            let compute_capability = (
                attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
                attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
            );
            let multiprocessors =
                attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
            let multiprocessors = u32::try_from(multiprocessors).unwrap_or(1).max(1);
            Ok(Context {
                ctx,
                ordinal,
                integrated,
                pageable_memory_access,
                compute_capability,
                multiprocessors,
            })
        })
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> i32 {
        self.ordinal
    }

    /// Whether the device is integrated (shares one physical memory with the host).
    pub fn is_integrated(&self) -> bool {
        self.integrated
    }

    /// Whether the device can access pageable host memory coherently (`PAGEABLE_MEMORY_ACCESS`).
    pub fn pageable_memory_access(&self) -> bool {
        self.pageable_memory_access
    }

    /// The device's compute capability, `(major, minor)`.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.compute_capability
    }

    /// The device's streaming multiprocessors (at least 1).
    pub fn multiprocessors(&self) -> u32 {
        self.multiprocessors
    }

    /// Whether kernels can be launched overlapping the previous kernel of their stream (programmatic
    /// dependent launch, [`crate::Function::launch_overlapped`]): compute capability 9.0 and later.
    pub fn overlaps_launches(&self) -> bool {
        self.compute_capability.0 >= 9
    }

    /// Makes the context current on the calling thread (a no-op when it already is; allocates nothing).
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver refuses.
    pub fn bind(&self) -> Result<()> {
        driver::call("cuCtxSetCurrent", self.ordinal, || self.ctx.bind_to_thread())
    }

    /// Waits for all work queued in the context (a host synchronisation, counted by [`crate::stats`]).
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver reports an error of queued work.
    pub fn synchronize(&self) -> Result<()> {
        crate::stats::count_host_sync();
        driver::call("cuCtxSynchronize", self.ordinal, || self.ctx.synchronize())
    }
}

/// Contexts opened on demand, one per device ordinal: a program that never asks for CUDA never loads the
/// driver.
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
    ///
    /// # Errors
    /// As [`Context::open`]; a failed open is tried again on the next call.
    pub fn get(&mut self, ordinal: i32) -> Result<Context> {
        if let Some(ctx) = self.open.iter().find(|c| c.ordinal == ordinal) {
            return Ok(ctx.clone());
        }
        let ctx = Context::open(ordinal)?;
        self.open.push(ctx.clone());
        Ok(ctx)
    }
}
