//! The execute path: a deserialized [`Engine`], its [`BindingPlan`], an `IExecutionContext` and every CUDA
//! resource (through `cuda-rt`), all made once by [`Runner::new`]; [`Runner::execute`] then runs one call over
//! caller memory, described by [`IoArg`]s, on the caller's stream or the runner's own. Like wgpu-hal below
//! wgpu-core, it takes its own argument views and a stream, not a plugin ABI's types: the delegate adapts.
//!
//! One call, in stream order (the caller's stream when given, else the runner's own):
//! 1. [`IoArg::view`] (device check) and [`BindingPlan::prepare_into`]: count, dtype, shape, size, null and
//!    alignment checks, and the residency gate for aliased inputs, before anything is queued.
//! 2. `setInputShape` for dynamic-shape inputs (checked against optimisation profile 0 first).
//! 3. Host-resident ordinary inputs: `cuMemcpyHtoDAsync` into their staging buffers.
//! 4. `setTensorAddress` for every engine tensor: the caller's pointer, a staging buffer, or the 1-byte
//!    scratch for zero-byte tensors; an aliased output gets its aliased input's caller pointer (TensorRT:
//!    "the output performs in-place updates on the cache tensor, so they must share the same device memory
//!    address").
//! 5. `enqueueV3`.
//! 6. Read-backs of host-resident ordinary outputs, and reflects (the aliased input's storage copied into a
//!    separate output slot) — device-to-device, or device-to-host when the slot is host memory.
//! 7. `cuStreamSynchronize` when anything was staged, read back or reflected, or no caller stream was given;
//!    with a caller stream and all I/O device-resident, `execute` returns with the work queued.
//!
//! If anything fails after work was queued, the stream is synchronised before the error is returned, so no
//! copy touches caller memory after `execute` returns.

use std::ffi::{c_void, CString};

use blob_format::model::{DType, Dim};
use cuda_rt::{Allocation, Context, Device, DevicePtr, Stream, StreamRef};
use cxx::UniquePtr;
use et_error::MemoryKind;
use smallvec::SmallVec;
use trtx_sys::nvinfer1::IExecutionContext;

use crate::error::{Error, Result};
use crate::log::log_suffix;
use crate::plan::{Address, ArgBinding, ArgRole, ArgView, BindingError, BindingPlan, CallPlan, Copy};
use crate::runtime::Engine;

/// Arguments held inline per call before spilling to the heap (the tiny decoder has 7, `big` 35).
const INLINE_ARGS: usize = 64;

/// Where a reflect copy writes: the output slot's residency decides the copy's direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReflectCopy {
    /// `cuMemcpyDtoDAsync`: the slot is device or managed memory.
    DeviceToDevice,
    /// `cuMemcpyDtoHAsync`: the slot is host memory (pageable or pinned).
    DeviceToHost,
}

impl ReflectCopy {
    /// The copy into a slot of residency `slot` (the source, an aliased input, is always device-visible).
    pub fn into_slot(slot: MemoryKind) -> ReflectCopy {
        match slot {
            MemoryKind::Device | MemoryKind::Managed => ReflectCopy::DeviceToDevice,
            MemoryKind::Host | MemoryKind::Pinned => ReflectCopy::DeviceToHost,
        }
    }
}

/// Checks a dynamic-shape input's extents against the optimisation profile's bounds.
///
/// # Errors
/// [`BindingError::OutsideProfile`] when the rank differs or an extent is outside `min..=max`.
pub fn check_profile(
    index: usize,
    name: &str,
    shape: &[i64],
    min: &[i64],
    max: &[i64],
) -> Result<(), BindingError> {
    let fits = shape.len() == min.len()
        && shape.len() == max.len()
        && shape.iter().zip(min.iter().zip(max)).all(|(s, (lo, hi))| lo <= s && s <= hi);
    if fits {
        Ok(())
    } else {
        Err(BindingError::OutsideProfile {
            index,
            name: name.to_owned(),
            got: shape.to_vec(),
            min: min.to_vec(),
            max: max.to_vec(),
        })
    }
}

/// Bytes of a tensor of `shape` and `dtype`, `None` for negative extents or overflow.
pub fn tensor_bytes(dtype: DType, shape: &[i64]) -> Option<u64> {
    shape.iter().try_fold(dtype.size_bytes() as u64, |acc, &d| u64::try_from(d).ok()?.checked_mul(acc))
}

/// Whether the device can read and write ordinary host memory coherently: an integrated GPU (one physical
/// memory) that can also access pageable memory without `cudaHostRegister`. Only then may a host pointer be
/// bound to an engine tensor directly; everywhere else host memory is staged.
pub fn host_memory_engine_visible(integrated: bool, pageable_memory_access: bool) -> bool {
    integrated && pageable_memory_access
}

/// One argument of a call, in delegate-argument order: where its bytes are and what they hold. The caller
/// (a delegate adapting its plugin ABI's arguments) vouches for the memory when it calls
/// [`Runner::execute`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoArg<'a> {
    /// Address of the first byte: host memory for [`MemoryKind::Host`] / [`MemoryKind::Pinned`], a device
    /// address for [`MemoryKind::Device`] / [`MemoryKind::Managed`].
    pub ptr: *mut c_void,
    /// Size in bytes.
    pub nbytes: u64,
    /// Where the storage lives.
    pub residency: MemoryKind,
    /// The CUDA device of device and managed memory (ignored for host memory).
    pub device: i32,
    /// Element type.
    pub dtype: DType,
    /// Extents.
    pub shape: &'a [i64],
}

impl IoArg<'_> {
    /// The argument as the binding plan sees it, for an engine on CUDA device `device`.
    ///
    /// # Errors
    /// [`BindingError::WrongDevice`] for device or managed memory (with bytes) of another device.
    pub fn view(&self, index: usize, device: i32) -> Result<ArgView<'_>, BindingError> {
        let on_device = matches!(self.residency, MemoryKind::Device | MemoryKind::Managed);
        if on_device && self.nbytes > 0 && self.device != device {
            return Err(BindingError::WrongDevice { index, device: self.device, expected: device });
        }
        Ok(ArgView {
            address: self.ptr as usize as u64,
            nbytes: self.nbytes,
            residency: self.residency,
            dtype: self.dtype,
            shape: self.shape,
        })
    }
}

/// A dynamic-shape input: its argument, name and profile bounds.
#[derive(Debug)]
struct DynamicInput {
    arg: usize,
    name: CString,
    min: Vec<i64>,
    max: Vec<i64>,
}

/// What one call did: bytes copied (for the delegate's statistics) and whether it synchronised.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallStats {
    /// Bytes staged host -> device before the engine.
    pub staged_bytes: u64,
    /// Bytes reflected from aliased inputs into separate output slots after the engine.
    pub reflect_bytes: u64,
    /// Whether `execute` synchronised the stream before returning.
    pub synchronized: bool,
}

/// An engine ready to run: execution context, per-handle stream, staging buffers and scratch, made once.
///
/// Field order is drop order: the execution context goes before the engine, buffers and stream before the
/// device context; [`Drop`] first waits for the device so nothing queued still uses a buffer.
pub struct Runner {
    context: UniquePtr<IExecutionContext>,
    staging: Vec<Option<Allocation<Device>>>,
    scratch: Allocation<Device>,
    stream: Stream,
    /// `setTensorAddress` names, index for index with `call.bindings`.
    names: Vec<CString>,
    dynamic_inputs: Vec<DynamicInput>,
    /// Ordinary and aliased outputs with dynamic extents: (argument, name).
    dynamic_outputs: Vec<(usize, CString)>,
    call: CallPlan,
    plan: BindingPlan,
    engine: Engine,
    host_visible: bool,
    device: Context,
}

// SAFETY: TensorRT allows an `IExecutionContext` to be used from any one thread at a time; `Runner` is only
// used through `&mut self`, the CUDA handles are thread-agnostic (the context is bound per call), and the
// engine is `Send`.
unsafe impl Send for Runner {}

impl std::fmt::Debug for Runner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner")
            .field("plan", &self.plan)
            .field("staging", &self.staging)
            .field("dynamic_inputs", &self.dynamic_inputs)
            .finish_non_exhaustive()
    }
}

/// Refuses engines with host-resident (shape) tensors: this delegate binds device tensors only.
fn refuse_host_tensors(engine: &Engine) -> Result<()> {
    for tensor in &engine.io().tensors {
        if engine.tensor_on_host(&c_name(&tensor.name)?) {
            return Err(Error::NotSupported(format!(
                "engine tensor '{}' is a host-resident shape tensor; this delegate binds device tensors only",
                tensor.name
            )));
        }
    }
    Ok(())
}

/// Dynamic inputs with their profile bounds, each set to its maximum once, so the largest output shapes are
/// known for sizing staging buffers.
fn dynamic_inputs_at_max(
    plan: &BindingPlan,
    engine: &Engine,
    context: &mut UniquePtr<IExecutionContext>,
) -> Result<Vec<DynamicInput>> {
    let mut dynamic_inputs = Vec::new();
    for (arg, binding) in plan.args().iter().enumerate() {
        let is_input = matches!(binding.role, ArgRole::Input { .. } | ArgRole::AliasedInput { .. });
        if !is_input || binding.shape.iter().all(|d| matches!(d, Dim::Static(_))) {
            continue;
        }
        let name = c_name(&binding.tensor)?;
        let (min, max) = engine.profile_bounds(&name).ok_or_else(|| Error::Trt {
            call: "getProfileShape",
            message: format!("no profile shape for '{}'", binding.tensor),
        })?;
        set_input_shape(context, engine, &name, &max)?;
        dynamic_inputs.push(DynamicInput { arg, name, min, max });
    }
    Ok(dynamic_inputs)
}

/// A static shape's extents as TensorRT dimensions.
fn static_extents(shape: &[Dim]) -> Vec<i64> {
    shape
        .iter()
        .map(|d| match d {
            Dim::Static(n) => i64::try_from(*n).unwrap_or(i64::MAX),
            Dim::Dynamic => -1,
        })
        .collect()
}

/// The staging buffer of `binding` at its `largest` shape; `None` for a zero-byte tensor.
fn staging_allocation(
    device: &Context,
    binding: &ArgBinding,
    largest: &[i64],
) -> Result<Option<Allocation<Device>>> {
    let bytes = tensor_bytes(binding.dtype, largest).ok_or_else(|| Error::Trt {
        call: "getTensorShape",
        message: format!("'{}' has no bounded size ({largest:?})", binding.tensor),
    })?;
    if bytes == 0 {
        return Ok(None);
    }
    let bytes = usize::try_from(bytes).map_err(|_| Error::Trt {
        call: "getTensorShape",
        message: format!("'{}' needs {bytes} bytes", binding.tensor),
    })?;
    Ok(Some(Allocation::uninit(device, bytes)?))
}

fn c_name(name: &str) -> Result<CString> {
    CString::new(name)
        .map_err(|_| Error::Trt { call: "setTensorAddress", message: format!("{name:?} has a NUL") })
}

impl Runner {
    /// Creates the execution context and every CUDA resource for `engine` on CUDA device `device_id`:
    /// the primary context, a stream for calls without one, one staging buffer per ordinary input or output
    /// (sized for the largest shape the engine accepts), and the 1-byte scratch for zero-byte tensors.
    ///
    /// # Errors
    /// [`Error::Cuda`] (`NotSupported`) without a CUDA driver or device; [`Error::NotSupported`] for engines
    /// with host-resident (shape) tensors; [`Error::Trt`] / [`Error::Cuda`] when TensorRT or the driver
    /// refuse.
    pub fn new(mut engine: Engine, plan: BindingPlan, device_id: i32) -> Result<Runner> {
        let device = Context::open(device_id)?;
        device.bind()?;
        let host_visible =
            host_memory_engine_visible(device.is_integrated(), device.pageable_memory_access());
        refuse_host_tensors(&engine)?;
        let mut context = engine.create_execution_context()?;
        let call = plan.new_call();
        let names = call.bindings.iter().map(|b| c_name(&b.tensor)).collect::<Result<Vec<_>>>()?;
        let dynamic_inputs = dynamic_inputs_at_max(&plan, &engine, &mut context)?;
        let mut dynamic_outputs = Vec::new();
        let mut staging: Vec<Option<Allocation<Device>>> = (0..plan.staging_slots()).map(|_| None).collect();
        for (arg, binding) in plan.args().iter().enumerate() {
            let name = c_name(&binding.tensor)?;
            let is_output = matches!(binding.role, ArgRole::Output { .. } | ArgRole::AliasedOutput { .. });
            let dynamic = binding.shape.iter().any(|d| matches!(d, Dim::Dynamic));
            let largest: Vec<i64> = if !dynamic {
                static_extents(&binding.shape)
            } else if is_output {
                dynamic_outputs.push((arg, name.clone()));
                let dims = context_dims(&context, &name);
                dims_slice(&dims).to_vec()
            } else {
                dynamic_inputs.iter().find(|d| d.arg == arg).map(|d| d.max.clone()).unwrap_or_default()
            };
            if let ArgRole::Input { staging_slot } | ArgRole::Output { staging_slot } = binding.role {
                staging[staging_slot] = staging_allocation(&device, binding, &largest)?;
            }
        }
        let scratch = Allocation::uninit(&device, 1)?;
        let stream = Stream::new(&device)?;
        warm_up(&device, stream.as_ref(), &scratch)?;
        Ok(Runner {
            context,
            staging,
            scratch,
            stream,
            names,
            dynamic_inputs,
            dynamic_outputs,
            call,
            plan,
            engine,
            host_visible,
            device,
        })
    }

    /// The binding plan.
    pub fn plan(&self) -> &BindingPlan {
        &self.plan
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Whether host memory is bound directly (integrated GPU with coherent pageable access) or staged.
    pub fn host_memory_engine_visible(&self) -> bool {
        self.host_visible
    }

    /// The CUDA device the engine runs on.
    pub fn device(&self) -> i32 {
        self.device.ordinal()
    }

    /// Runs one call over the caller's arguments (delegate-argument order) on the caller's `stream`, or on
    /// the runner's own stream when none is given, and reports the staged and reflected bytes.
    ///
    /// When this returns `Ok`, everything the caller reads is complete, or (caller stream, all I/O
    /// device-resident: [`CallStats::synchronized`] false) ordered on the caller's stream. When it returns
    /// `Err`, nothing queued is still running. Allocates nothing for up to 64 arguments.
    ///
    /// # Safety
    /// For every argument with bytes, `ptr` is memory of its `residency` (host memory for host and pinned
    /// host, a device or managed allocation of `device` otherwise) valid for reads of `nbytes` bytes, and for
    /// writes when it is an output or an aliased input, used by nothing else until the call's work is
    /// complete: when this returns, or, when it returns without synchronising, until `stream` has executed
    /// what was queued. `stream`, when given, is a valid stream of the device's primary context for as long.
    ///
    /// # Errors
    /// [`Error::Binding`] (`InvalidArgument`) when an argument does not fit the plan or lives on another
    /// device (nothing queued); [`Error::Trt`] when TensorRT refuses a binding or the enqueue, with
    /// TensorRT's messages attached; [`Error::Cuda`] when a copy or synchronisation fails.
    pub unsafe fn execute(&mut self, args: &[IoArg<'_>], stream: Option<StreamRef<'_>>) -> Result<CallStats> {
        let mut views: SmallVec<[ArgView<'_>; INLINE_ARGS]> = SmallVec::new();
        for (index, arg) in args.iter().enumerate() {
            views.push(arg.view(index, self.device.ordinal())?);
        }
        self.plan.prepare_into(&views, self.host_visible, stream.is_some(), &mut self.call)?;
        self.device.bind()?;
        let mut queued = false;
        let ran = self.enqueue(&views, stream, &mut queued);
        let stream = stream.unwrap_or_else(|| self.stream.as_ref());
        match ran {
            Ok(()) if self.call.synchronize => self.device.synchronize_stream(stream)?,
            Ok(()) => {}
            Err(err) => {
                if queued {
                    // Nothing queued may touch caller memory after we return.
                    let _ = self.device.synchronize_stream(stream);
                }
                return Err(err);
            }
        }
        Ok(CallStats {
            staged_bytes: self.call.staged_bytes,
            reflect_bytes: self.call.reflect_bytes,
            synchronized: self.call.synchronize,
        })
    }

    /// Steps 2 to 6 (see the module docs); `queued` turns true once anything is on the stream.
    fn enqueue(
        &mut self,
        views: &[ArgView<'_>],
        caller: Option<StreamRef<'_>>,
        queued: &mut bool,
    ) -> Result<()> {
        self.set_input_shapes(views)?;
        self.check_output_shapes(views)?;
        self.stage_inputs(views, caller, queued)?;
        self.set_tensor_addresses(views)?;
        self.enqueue_v3(caller, queued)?;
        self.copy_after(views, caller)
    }

    /// The caller's stream, or the runner's own.
    fn stream<'s>(&'s self, caller: Option<StreamRef<'s>>) -> StreamRef<'s> {
        caller.unwrap_or_else(|| self.stream.as_ref())
    }

    /// Step 2: `setInputShape` for every dynamic-shape input, checked against the profile first.
    fn set_input_shapes(&mut self, views: &[ArgView<'_>]) -> Result<()> {
        for input in &self.dynamic_inputs {
            let view = &views[input.arg];
            let name = &self.plan.args()[input.arg].tensor;
            check_profile(input.arg, name, view.shape, &input.min, &input.max)?;
            set_input_shape(&mut self.context, &self.engine, &input.name, view.shape)?;
        }
        Ok(())
    }

    /// Every dynamic-shape output's argument has the shape the engine now computes for it.
    fn check_output_shapes(&self, views: &[ArgView<'_>]) -> Result<()> {
        for (arg, name) in &self.dynamic_outputs {
            let dims = context_dims(&self.context, name);
            let engine_shape = dims_slice(&dims);
            if engine_shape != views[*arg].shape {
                return Err(BindingError::ArgShape {
                    index: *arg,
                    name: self.plan.args()[*arg].tensor.clone(),
                    expected: engine_shape
                        .iter()
                        .map(|&d| u64::try_from(d).map_or(Dim::Dynamic, Dim::Static))
                        .collect(),
                    got: views[*arg].shape.to_vec(),
                }
                .into());
            }
        }
        Ok(())
    }

    /// Step 3: host-resident ordinary inputs copied into their staging buffers.
    fn stage_inputs(
        &self,
        views: &[ArgView<'_>],
        caller: Option<StreamRef<'_>>,
        queued: &mut bool,
    ) -> Result<()> {
        let stream = self.stream(caller);
        for copy in &self.call.before {
            if let Copy::Stage { arg, slot, bytes } = *copy {
                let buffer = staging_buffer(&self.staging, slot, bytes)?;
                *queued = true;
                let source = views[arg].address as usize as *const c_void;
                // SAFETY: `buffer` holds at least `bytes` (checked); the argument is host memory valid for reads
                // of `bytes` until the stream is synchronised, which `execute` does before returning whenever
                // anything was staged (`execute`'s contract covers the pointer, `prepare_into` checked it is
                // non-null and `bytes` is its size).
                unsafe { self.device.copy_htod_async(buffer.device_ptr(), source, bytes, stream) }?;
            }
        }
        Ok(())
    }

    /// Step 4: `setTensorAddress` for every engine tensor.
    fn set_tensor_addresses(&mut self, views: &[ArgView<'_>]) -> Result<()> {
        for (binding, name) in self.call.bindings.iter().zip(&self.names) {
            let pointer: *mut c_void = match binding.address {
                Address::Arg(n) => views[n].address as usize as *mut c_void,
                Address::Staging(slot) => staging_buffer(&self.staging, slot, 1)?.as_ptr(),
                Address::Scratch => self.scratch.as_ptr(),
            };
            let context = self
                .context
                .as_mut()
                .ok_or(Error::Trt { call: "setTensorAddress", message: "null context".to_owned() })?;
            // SAFETY: `name` is a NUL-terminated engine tensor name; `pointer` is non-null, 256-byte aligned
            // (checked by `prepare_into`, or a `cuMemAlloc` buffer) device-visible memory of the tensor's size,
            // valid until the stream work completes (`execute`'s contract for caller memory; buffers live as
            // long as the runner, which synchronises before freeing them).
            let ok = unsafe { context.setTensorAddress(name.as_ptr(), pointer.cast()) };
            if !ok {
                return Err(Error::Trt {
                    call: "setTensorAddress",
                    message: format!(
                        "refused '{}'{}",
                        binding.tensor,
                        log_suffix(&self.engine.take_log_errors())
                    ),
                });
            }
        }
        Ok(())
    }

    /// Step 5: `enqueueV3` on the call's stream.
    fn enqueue_v3(&mut self, caller: Option<StreamRef<'_>>, queued: &mut bool) -> Result<()> {
        let stream = caller.unwrap_or_else(|| self.stream.as_ref());
        let context = self
            .context
            .as_mut()
            .ok_or(Error::Trt { call: "enqueueV3", message: "null context".to_owned() })?;
        *queued = true;
        // SAFETY: every I/O tensor has a valid address (set by step 4: the plan binds every engine tensor); the
        // stream is the caller's (valid per `execute`'s contract) or ours, in the bound primary context.
        let ok = unsafe { context.enqueueV3(stream.as_raw().cast()) };
        if !ok {
            return Err(Error::Trt {
                call: "enqueueV3",
                message: format!("returned false{}", log_suffix(&self.engine.take_log_errors())),
            });
        }
        Ok(())
    }

    /// Step 6: read-backs of host-resident ordinary outputs, and reflects into separate output slots.
    fn copy_after(&self, views: &[ArgView<'_>], caller: Option<StreamRef<'_>>) -> Result<()> {
        let stream = self.stream(caller);
        for copy in &self.call.after {
            match *copy {
                Copy::ReadBack { slot, arg, bytes } => {
                    let buffer = staging_buffer(&self.staging, slot, bytes)?;
                    // SAFETY: `buffer` holds `bytes` written by the engine (stream-ordered before this copy);
                    // the argument is host memory valid for writes of `bytes` (`execute`'s contract); the
                    // stream is synchronised before `execute` returns (a read-back forces it).
                    unsafe {
                        self.device.copy_dtoh_async(
                            views[arg].address as usize as *mut c_void,
                            buffer.device_ptr(),
                            bytes,
                            stream,
                        )
                    }?;
                }
                Copy::Reflect { from_arg, to_arg, bytes } => {
                    self.reflect(views[from_arg].address, &views[to_arg], bytes, stream)?;
                }
                Copy::Stage { .. } => {}
            }
        }
        Ok(())
    }

    /// Copies an aliased input's storage at `source` into its separate output slot `to`.
    fn reflect(&self, source: DevicePtr, to: &ArgView<'_>, bytes: u64, stream: StreamRef<'_>) -> Result<()> {
        let slot = to.address;
        match ReflectCopy::into_slot(to.residency) {
            ReflectCopy::DeviceToDevice => {
                // SAFETY: both are device-visible allocations of `bytes` (the plan checked equal sizes) that do
                // not share storage (`same_storage` was false); stream-ordered after the engine wrote the
                // source; synchronised before `execute` returns (a reflect forces it).
                unsafe { self.device.copy_dtod_async(slot, source, bytes, stream) }?;
            }
            ReflectCopy::DeviceToHost => {
                let slot = slot as usize as *mut c_void;
                // SAFETY: as for device-to-device, with the slot host memory valid for writes of `bytes`.
                unsafe { self.device.copy_dtoh_async(slot, source, bytes, stream) }?;
            }
        }
        Ok(())
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        // Work queued on a caller's stream may still use the staging buffers or the context's memory.
        let _ = self.device.bind().and_then(|()| self.device.synchronize());
    }
}

fn staging_buffer(
    staging: &[Option<Allocation<Device>>],
    slot: usize,
    bytes: u64,
) -> Result<&Allocation<Device>> {
    staging.get(slot).and_then(Option::as_ref).filter(|b| b.len() as u64 >= bytes).ok_or_else(|| Error::Trt {
        call: "staging",
        message: format!("staging buffer {slot} cannot hold {bytes} bytes (sized at init from the engine)"),
    })
}

/// Resolves and exercises, with 1-byte copies on `stream`, every driver entry point the execute path uses
/// (cuda-rt resolves a driver symbol on its first call, allocating its name), so that happens here at init and
/// never on the execute path.
///
/// # Errors
/// [`Error::Cuda`]: `NotSupported` when the driver lacks an entry point, `Internal` when a copy fails.
fn warm_up(device: &Context, stream: StreamRef<'_>, scratch: &Allocation<Device>) -> Result<()> {
    let other = Allocation::<Device>::uninit(device, 1)?;
    let mut byte = [0u8; 1];
    // SAFETY: both buffers hold one byte and are used by nothing else; `byte` outlives the synchronise below,
    // which runs whether or not a copy was refused.
    let queued = unsafe {
        device
            .copy_htod_async(scratch.device_ptr(), byte.as_ptr().cast(), 1, stream)
            .and_then(|()| device.copy_dtod_async(other.device_ptr(), scratch.device_ptr(), 1, stream))
            .and_then(|()| device.copy_dtoh_async(byte.as_mut_ptr().cast(), other.device_ptr(), 1, stream))
    };
    let synchronized = device.synchronize_stream(stream);
    queued.and(synchronized)?;
    Ok(())
}

fn set_input_shape(
    context: &mut UniquePtr<IExecutionContext>,
    engine: &Engine,
    name: &CString,
    shape: &[i64],
) -> Result<()> {
    let context =
        context.as_mut().ok_or(Error::Trt { call: "setInputShape", message: "null context".to_owned() })?;
    let dims = trtx_sys::Dims64::from_slice(shape);
    // SAFETY: `name` is a NUL-terminated engine input name; `dims` lives for the call.
    if unsafe { context.setInputShape(name.as_ptr(), &dims) } {
        Ok(())
    } else {
        Err(Error::Trt {
            call: "setInputShape",
            message: format!("{name:?} {shape:?}{}", log_suffix(&engine.take_log_errors())),
        })
    }
}

/// The context's current shape of tensor `name` (rank 0 without a context).
fn context_dims(context: &UniquePtr<IExecutionContext>, name: &CString) -> trtx_sys::Dims64 {
    match context.as_ref() {
        // SAFETY: `name` is a NUL-terminated engine tensor name.
        Some(c) => unsafe { c.getTensorShape(name.as_ptr()) },
        None => trtx_sys::Dims64::from_slice(&[]),
    }
}

fn dims_slice(dims: &trtx_sys::Dims64) -> &[i64] {
    &dims.d[..usize::try_from(dims.nbDims).unwrap_or(0).min(dims.d.len())]
}
