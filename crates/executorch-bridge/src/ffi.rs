//! The FFI layer: the C structs and entry points of `cpp/bridge.cpp`, the `extern "C"` callbacks ExecuTorch
//! reaches through it, and the raw pointers that cross. This module is the crate's only `unsafe` code.
//!
//! What crosses, and who owns it:
//! - **payload**: `init` receives ExecuTorch's processed buffer (`FreeableBuffer::data()/size()`) and lends it
//!   to the plugin's `init` as a slice, uncopied. ExecuTorch's `BackendDelegate` owns the buffer and frees it
//!   only after our `destroy` returned; the shim never calls `Free()`, so it stays valid for the handle's life.
//! - **arguments**: `execute` receives each DelegateCall argument as `KvdArg` (the tensor's data pointer,
//!   byte size, dtype and shape, read from ExecuTorch's `EValue`s); they go into the plugin's argument list
//!   as they are ([`ArgList::push_raw`]), so the plugin reads and writes ExecuTorch's own memory.
//! - **planned memory**: a Module's methods use the Module's own host buffers, or spans of CUDA managed
//!   memory the runner allocates ([`RawPlanned`], a `HierarchicalAllocator` over them, given to
//!   `Module::load_method`); the runner keeps that memory alive until after the Module is freed.
//! - **copy counts**: the shim loads every method with counting wrappers of ExecuTorch's copy kernels
//!   (`aten::copy_`, the buffer write-back, and the copy/clone `out` kernels) and keeps per-thread byte counts
//!   of what they wrote, read and reset by [`take_copy_counts`].
//! - **errors**: every entry returns an ExecuTorch `Error` value, which our [`ErrorCode`] numbers are. No C++
//!   exception crosses: the shim catches each at its boundary as a code (`MemoryAllocationFailed` for
//!   `std::bad_alloc`, `Internal` otherwise) and keeps its message, which [`RawModule`]'s calls record as this
//!   thread's last error ([`backend::take_last_error`]).
#![allow(unsafe_code)]

use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::AssertUnwindSafe;

use delegate_abi::host::ArgList;
use delegate_abi::{Spec, TensorArg};
use et_error::ErrorCode;

use crate::backend::{self, BackendSlot, Handle};
use crate::planned::{ManagedPlan, SpanError};
use crate::program_file::ProgramFile;

/// Dimensions a `KvdArg` / `KvdTensor` carries (ExecuTorch's own limit is 16).
pub(crate) const KVD_MAX_RANK: usize = 16;

/// One DelegateCall argument (`struct kvd_arg`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct KvdArg {
    pub data: *mut c_void,
    pub nbytes: u64,
    pub shape: [i64; KVD_MAX_RANK],
    pub rank: u32,
    pub scalar_type: i32,
    pub is_tensor: u32,
    pub reserved: u32,
}

/// One compile spec (`struct kvd_spec`).
#[repr(C)]
struct KvdSpec {
    key: *const c_char,
    value: *const u8,
    len: usize,
}

/// The Rust side of one backend (`struct kvd_callbacks`).
#[repr(C)]
struct KvdCallbacks {
    ctx: *mut c_void,
    is_available: extern "C" fn(*mut c_void) -> bool,
    init: extern "C" fn(*mut c_void, *const u8, usize, *const KvdSpec, usize, *mut *mut c_void) -> u32,
    execute: extern "C" fn(*mut c_void, *mut c_void, *const KvdArg, usize) -> u32,
    destroy: extern "C" fn(*mut c_void, *mut c_void),
}

/// A method input or output of the runner (`struct kvd_tensor`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct KvdTensor {
    pub data: *mut c_void,
    pub capacity: u64,
    pub nbytes: u64,
    pub shape: [i64; KVD_MAX_RANK],
    pub rank: u32,
    pub scalar_type: i32,
}

/// One span of caller memory for a method's planned buffers (`struct kvd_span`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct KvdSpan {
    data: *mut c_void,
    len: u64,
}

/// What the shim's counting copy kernels saw on this thread since the last take (`struct kvd_copy_counts`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct KvdCopyCounts {
    /// `aten::copy_` kernel calls (the program's buffer write-backs).
    pub write_back_calls: u64,
    /// Bytes those calls wrote.
    pub write_back_bytes: u64,
    /// Calls of the other copy kernels (`aten::copy.out`, `aten::clone.out`, ...).
    pub op_calls: u64,
    /// Bytes those calls wrote.
    pub op_bytes: u64,
}

extern "C" {
    fn kvd_take_copy_counts(out: *mut KvdCopyCounts);
    fn kvd_counting_kernels(write_backs: *mut usize) -> usize;
    fn kvd_set_log(log: extern "C" fn(c_char, *const c_char, usize)) -> bool;
    fn kvd_register_backend(name: *const c_char, callbacks: *const KvdCallbacks) -> u32;
    fn kvd_backend_registered(name: *const c_char) -> bool;
    fn kvd_take_exception(out: *mut c_char, cap: usize) -> usize;
    fn kvd_module_new(data: *const u8, len: usize, share_arenas: bool, module: *mut *mut c_void) -> u32;
    fn kvd_module_free(module: *mut c_void);
    fn kvd_module_load(module: *mut c_void) -> u32;
    fn kvd_module_load_method(module: *mut c_void, method: *const c_char) -> u32;
    fn kvd_module_planned_sizes(
        module: *mut c_void,
        method: *const c_char,
        sizes: *mut u64,
        cap: usize,
        n: *mut usize,
    ) -> u32;
    fn kvd_planned_new(spans: *const KvdSpan, n: usize, planned: *mut *mut c_void) -> u32;
    fn kvd_planned_free(planned: *mut c_void);
    fn kvd_module_load_method_planned(
        module: *mut c_void,
        method: *const c_char,
        planned: *mut c_void,
    ) -> u32;
    fn kvd_module_execute(
        module: *mut c_void,
        method: *const c_char,
        inputs: *const KvdTensor,
        n_inputs: usize,
        outputs: *mut KvdTensor,
        n_outputs: usize,
        n_written: *mut usize,
    ) -> u32;
}

fn code(value: u32) -> Result<(), ErrorCode> {
    match ErrorCode::from_u32(value) {
        ErrorCode::Ok => Ok(()),
        other => Err(other),
    }
}

/// The message of the last C++ exception the shim caught on this thread, if any (and forgets it).
fn take_exception() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is writable for its length; the shim writes at most `cap` bytes, NUL included.
    let len = unsafe { kvd_take_exception(buf.as_mut_ptr().cast(), buf.len()) };
    (len > 0).then(|| String::from_utf8_lossy(&buf[..len.min(buf.len())]).into_owned())
}

/// Runs one call into the shim: an exception the shim caught during it becomes this thread's last error
/// (the code says only `Internal` or `MemoryAllocationFailed`; the message says what threw).
fn shim_call(call: impl FnOnce() -> u32) -> Result<(), ErrorCode> {
    take_exception(); // one left by a call whose code did not report it (`is_available`) is not this call's
    let result = code(call());
    if let Some(message) = take_exception() {
        backend::record_error(format!("ExecuTorch's C++ runtime: {message}"));
    }
    result
}

/// Routes ExecuTorch's log messages (stderr by default) to `tracing`, target `executorch`: once per process.
pub(crate) fn route_logs() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: `log_message` is an `extern "C"` function that lives forever; the shim stores it.
        if !unsafe { kvd_set_log(log_message) } {
            tracing::debug!(target: "executorch", "ExecuTorch refused the log hook; its messages go to stderr");
        }
    });
}

extern "C" fn log_message(level: c_char, message: *const c_char, len: usize) {
    let text = if message.is_null() || len == 0 {
        String::new()
    } else {
        // SAFETY: ExecuTorch passes `len` bytes of message, valid during the call.
        let bytes = unsafe { std::slice::from_raw_parts(message.cast::<u8>(), len) };
        String::from_utf8_lossy(bytes).trim_end().to_owned()
    };
    let _ = std::panic::catch_unwind(|| match level as u8 {
        b'E' | b'F' => tracing::warn!(target: "executorch", "{text}"),
        b'I' => tracing::info!(target: "executorch", "{text}"),
        _ => tracing::debug!(target: "executorch", "{text}"),
    });
}

/// Registers `slot` (leaked: ExecuTorch keeps the backend for the process's life) under its id.
pub(crate) fn register(slot: &'static BackendSlot) -> Result<(), ErrorCode> {
    route_logs();
    // Leaked on purpose: ExecuTorch's registry keeps the name pointer for the process's life.
    let name: &'static CStr =
        Box::leak(CString::new(slot.id.as_str()).map_err(|_| ErrorCode::InvalidArgument)?.into_boxed_c_str());
    let callbacks = KvdCallbacks {
        ctx: std::ptr::from_ref(slot).cast_mut().cast(),
        is_available: cb_is_available,
        init: cb_init,
        execute: cb_execute,
        destroy: cb_destroy,
    };
    // SAFETY: `name` is a NUL-terminated string that lives forever; `callbacks` is read (copied) during the
    // call; its `ctx` is a `&'static BackendSlot`, which the callbacks below turn back into one.
    shim_call(|| unsafe { kvd_register_backend(name.as_ptr(), &callbacks) })
}

/// Whether ExecuTorch's registry has a backend called `name`.
pub(crate) fn is_registered(name: &str) -> bool {
    let Ok(name) = CString::new(name) else { return false };
    // SAFETY: a NUL-terminated string valid for the call; the shim only reads it.
    unsafe { kvd_backend_registered(name.as_ptr()) }
}

fn slot<'a>(ctx: *mut c_void) -> &'a BackendSlot {
    // SAFETY: every `ctx` the shim passes back is the `&'static BackendSlot` given to `register`.
    unsafe { &*ctx.cast::<BackendSlot>() }
}

/// Runs `f`, turning a panic into `Internal` (a panic must not unwind into C++).
fn guarded(what: &str, f: impl FnOnce() -> Result<(), ErrorCode>) -> u32 {
    match std::panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => 0,
        Ok(Err(code)) => code.as_u32(),
        Err(_) => {
            backend::record_error(format!("executorch-bridge: {what} panicked"));
            ErrorCode::Internal.as_u32()
        }
    }
}

extern "C" fn cb_is_available(ctx: *mut c_void) -> bool {
    std::panic::catch_unwind(AssertUnwindSafe(|| slot(ctx).is_available())).unwrap_or(false)
}

extern "C" fn cb_init(
    ctx: *mut c_void,
    data: *const u8,
    len: usize,
    specs: *const KvdSpec,
    n_specs: usize,
    handle: *mut *mut c_void,
) -> u32 {
    guarded("init", || {
        let blob: &[u8] = if len == 0 {
            &[]
        } else {
            // SAFETY: `data`/`len` are ExecuTorch's processed buffer, valid (and never freed by us) at least
            // until `destroy`; the plugin's `init` reads it during the call only.
            unsafe { std::slice::from_raw_parts(data, len) }
        };
        let raw_specs: &[KvdSpec] = if n_specs == 0 {
            &[]
        } else {
            // SAFETY: the shim built `n_specs` contiguous `kvd_spec`s that live for this call.
            unsafe { std::slice::from_raw_parts(specs, n_specs) }
        };
        let mut compile = Vec::with_capacity(raw_specs.len());
        for spec in raw_specs {
            if spec.key.is_null() {
                return Err(ErrorCode::InvalidProgram);
            }
            // SAFETY: ExecuTorch's compile spec keys are NUL-terminated strings of the loaded program.
            let key = unsafe { CStr::from_ptr(spec.key) }.to_str().map_err(|_| ErrorCode::InvalidProgram)?;
            let value: &[u8] = if spec.len == 0 || spec.value.is_null() {
                &[]
            } else {
                // SAFETY: the spec value buffer of the loaded program, `len` bytes, valid during `init`.
                unsafe { std::slice::from_raw_parts(spec.value, spec.len) }
            };
            compile.push(Spec { key, value });
        }
        let made = slot(ctx).init(blob, &compile)?;
        // SAFETY: `handle` is the shim's out-parameter, valid for one write.
        unsafe { *handle = Box::into_raw(Box::new(made)).cast() };
        Ok(())
    })
}

extern "C" fn cb_execute(ctx: *mut c_void, handle: *mut c_void, args: *const KvdArg, n_args: usize) -> u32 {
    guarded("execute", || {
        if handle.is_null() {
            return Err(ErrorCode::DelegateInvalidHandle);
        }
        // SAFETY: a non-null handle is the `Box<Handle>` made by `cb_init`, not yet destroyed; ExecuTorch
        // runs one execute per handle at a time.
        let handle = unsafe { &mut *handle.cast::<Handle>() };
        let args: &[KvdArg] = if n_args == 0 {
            &[]
        } else {
            // SAFETY: the shim's array of `n_args` args, alive during this call.
            unsafe { std::slice::from_raw_parts(args, n_args) }
        };
        slot(ctx).execute(handle, args)
    })
}

extern "C" fn cb_destroy(_ctx: *mut c_void, handle: *mut c_void) {
    if handle.is_null() {
        return;
    }
    // SAFETY: the `Box<Handle>` made by `cb_init`; ExecuTorch destroys each handle once.
    let handle = unsafe { Box::from_raw(handle.cast::<Handle>()) };
    // A panicking plugin `destroy` must not unwind into C++.
    let _ = std::panic::catch_unwind(AssertUnwindSafe(move || drop(handle)));
}

/// Pushes one ExecuTorch argument into `list` with `flags`, after converting its dtype and rank.
pub(crate) fn push_arg(
    list: &mut ArgList<'static>,
    arg: &TensorArg,
) -> Result<delegate_abi::host::Slot, delegate_abi::host::ArgError> {
    // SAFETY: `arg.data` is the data pointer of a tensor of the DelegateCall being executed, `arg.nbytes`
    // bytes of host memory (ExecuTorch's CPU tensors, or the bridge's managed planned memory, which
    // `arg.memory()` says), valid for the whole call; the list is only passed to
    // the plugin during that call and recycled (its borrows released) before `execute` returns. Written args
    // are ExecuTorch's outputs and mutable buffers, which nothing else touches while the delegate runs; a
    // written arg shares storage with another only when ExecuTorch planned a KV output on its buffer, at the
    // same address and size, and `backend` then pushes it with `push_output_in_place` instead.
    unsafe { list.push_raw(*arg) }
}

/// Returns and resets this thread's counts of the copy kernels ExecuTorch ran.
pub(crate) fn take_copy_counts() -> KvdCopyCounts {
    let mut counts = KvdCopyCounts::default();
    // SAFETY: `counts` is a writable `kvd_copy_counts` (same layout, `#[repr(C)]`); the shim writes it once.
    unsafe { kvd_take_copy_counts(&mut counts) };
    counts
}

/// How many kernels the counting registry wraps, and how many of them are `aten::copy_`'s.
pub(crate) fn counting_kernels() -> (usize, usize) {
    let mut write_backs = 0usize;
    // SAFETY: `write_backs` is writable for one `size_t`; the shim reads ExecuTorch's registry only.
    let n = unsafe { kvd_counting_kernels(&mut write_backs) };
    (n, write_backs)
}

/// Copies `src` into the storage of the DelegateCall argument `dst` (a mutable buffer), after the plugin ran.
/// Returns the bytes copied.
pub(crate) fn write_back(dst: &KvdArg, src: &[u8]) -> u64 {
    let len = src.len().min(usize::try_from(dst.nbytes).unwrap_or(0));
    if len == 0 || dst.data.is_null() {
        return 0;
    }
    // SAFETY: `dst` is a tensor argument of the DelegateCall still executing (ExecuTorch's mutable buffer,
    // `nbytes` bytes of host memory or of the bridge's managed planned memory, host-visible, whose delegate
    // work the bridge waited for; nothing else touches it during the call); `src` is the handle's own
    // scratch, another allocation, so the ranges do not overlap; `len` fits both.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.data.cast::<u8>(), len) };
    len as u64
}

/// An ExecuTorch `Module` (`executorch::extension::Module`) over the program bytes it owns, and the managed
/// planned memory its methods use when it has some (both freed after the Module).
pub(crate) struct RawModule {
    module: *mut c_void,
    managed: Option<(ManagedPlan, Vec<RawPlanned>)>,
    /// The bytes ExecuTorch loads from (its `BufferDataLoader` reads them in place); dropped after the Module.
    program: ProgramFile,
}

/// Why [`RawModule::load_method_managed`] failed.
#[derive(Debug)]
pub(crate) enum LoadFailure {
    /// The managed plan gave no spans for the method (not sized for it, or no memory for its own buffers).
    Plan(SpanError),
    /// ExecuTorch's code.
    Code(ErrorCode),
}

impl RawModule {
    /// A Module that loads `program`'s bytes (and only them: ExecuTorch opens no file) and owns them.
    pub(crate) fn new(program: ProgramFile, share_arenas: bool) -> Result<RawModule, ErrorCode> {
        route_logs();
        let bytes = program.bytes();
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: `bytes` are `bytes.len()` readable bytes on the heap, owned by `program`, which the returned
        // `RawModule` keeps (moving it does not move the heap buffer) and drops only after freeing the Module:
        // they outlive every use ExecuTorch makes of them. ExecuTorch takes them as `const` (its
        // `BufferDataLoader`) and reads the program, payloads and constants from them in place; no delegate is
        // handed one of them to write, since `runner::Module` makes a `RawModule` only after `crate::written`
        // found every argument a delegate writes to be planned memory (this module's test makes one over an
        // empty program, which has no call). `ptr` is writable for one pointer.
        shim_call(|| unsafe { kvd_module_new(bytes.as_ptr(), bytes.len(), share_arenas, &mut ptr) })?;
        if ptr.is_null() {
            return Err(ErrorCode::MemoryAllocationFailed);
        }
        Ok(RawModule { module: ptr, managed: None, program })
    }

    /// The program bytes this Module loads from.
    pub(crate) fn program(&self) -> &ProgramFile {
        &self.program
    }

    pub(crate) fn load(&mut self) -> Result<(), ErrorCode> {
        // SAFETY: `self.module` is a live Module (freed only on drop); `&mut self` keeps calls exclusive.
        shim_call(|| unsafe { kvd_module_load(self.module) })
    }

    pub(crate) fn load_method(&mut self, method: &CStr) -> Result<(), ErrorCode> {
        // SAFETY: as in `load`; the name is NUL-terminated and copied.
        shim_call(|| unsafe { kvd_module_load_method(self.module, method.as_ptr()) })
    }

    /// The sizes of `method`'s memory-planned buffers, mem_id 1 first (`MethodMeta`).
    pub(crate) fn planned_sizes(&mut self, method: &CStr) -> Result<Vec<u64>, ErrorCode> {
        let mut sizes = vec![0u64; 16];
        loop {
            let mut n = 0usize;
            // SAFETY: as in `load`; `sizes` is writable for `sizes.len()` values and the shim writes at most
            // that many; `n` is writable for one `size_t`.
            shim_call(|| unsafe {
                kvd_module_planned_sizes(
                    self.module,
                    method.as_ptr(),
                    sizes.as_mut_ptr(),
                    sizes.len(),
                    &mut n,
                )
            })?;
            if n <= sizes.len() {
                sizes.truncate(n);
                return Ok(sizes);
            }
            sizes.resize(n, 0);
        }
    }

    /// Makes `plan` this Module's planned memory: methods loaded with [`RawModule::load_method_managed`]
    /// from now on place their planned tensors in it. The Module owns it, and frees it after itself.
    pub(crate) fn use_managed(&mut self, plan: ManagedPlan) {
        self.managed = Some((plan, Vec::new()));
    }

    /// This Module's managed planned memory, when it has some.
    pub(crate) fn managed(&self) -> Option<&ManagedPlan> {
        self.managed.as_ref().map(|(plan, _)| plan)
    }

    /// Loads `method` with its planned buffers in this Module's managed memory ([`RawModule::use_managed`]):
    /// the shared buffers, then allocations of its own, under a `HierarchicalAllocator` ExecuTorch places its
    /// tensors with (instead of buffers the Module allocates). A method the plan was not sized for is refused
    /// before ExecuTorch sees a span ([`ManagedPlan::spans`]).
    pub(crate) fn load_method_managed(&mut self, method: &CStr) -> Result<(), LoadFailure> {
        let sizes = self.planned_sizes(method).map_err(LoadFailure::Code)?;
        let (plan, allocators) = self.managed.as_mut().ok_or(LoadFailure::Code(ErrorCode::InvalidState))?;
        let spans = plan.spans(&method.to_string_lossy(), &sizes).map_err(LoadFailure::Plan)?;
        let allocator = RawPlanned::new(&spans).map_err(LoadFailure::Code)?;
        let planned = allocator.0;
        allocators.push(allocator);
        // SAFETY: as in `load`; `planned` is a live `PlannedSpans` over `plan`'s allocations, each span no
        // longer than its allocation (`spans` gives the shared buffers only to the methods they were sized for,
        // at their largest size). Both are owned by `self.managed`, which `Drop` frees only after the Module
        // (and with it every method and delegate that uses them); nothing else uses that memory.
        shim_call(|| unsafe { kvd_module_load_method_planned(self.module, method.as_ptr(), planned) })
            .map_err(LoadFailure::Code)
    }

    /// Runs `method`; the outputs' `data`/`capacity` must describe writable caller memory.
    pub(crate) fn execute(
        &mut self,
        method: &CStr,
        inputs: &[KvdTensor],
        outputs: &mut [KvdTensor],
    ) -> Result<usize, ErrorCode> {
        let mut written = 0usize;
        // SAFETY: as in `load`. Each input points at caller memory of `nbytes` bytes, alive for the call (the
        // Module copies them into its planned inputs); the shim reads an input only when `nbytes` is exactly its
        // shape x dtype and every size fits ExecuTorch's 32-bit sizes (the safe wrapper checked both, and so does
        // the shim). Each output's `data` is writable for `capacity` bytes (the safe wrapper built them from
        // `&mut [u8]`), and the shim writes at most that many.
        shim_call(|| unsafe {
            kvd_module_execute(
                self.module,
                method.as_ptr(),
                inputs.as_ptr(),
                inputs.len(),
                outputs.as_mut_ptr(),
                outputs.len(),
                &mut written,
            )
        })
        .map(|()| written)
    }
}

/// A `HierarchicalAllocator` over caller memory (the shim's `PlannedSpans`).
pub(crate) struct RawPlanned(*mut c_void);

impl RawPlanned {
    /// Describes `spans` (pointer, length; span i is mem_id i + 1) to ExecuTorch. The memory is not touched
    /// here: only a method loaded with it (see [`RawModule::load_method_planned`]) uses it.
    pub(crate) fn new(spans: &[(*mut c_void, u64)]) -> Result<RawPlanned, ErrorCode> {
        let raw: Vec<KvdSpan> = spans.iter().map(|&(data, len)| KvdSpan { data, len }).collect();
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: `raw` holds `raw.len()` spans, read (copied) during the call; `ptr` is writable for one pointer.
        shim_call(|| unsafe { kvd_planned_new(raw.as_ptr(), raw.len(), &mut ptr) })?;
        if ptr.is_null() {
            return Err(ErrorCode::MemoryAllocationFailed);
        }
        Ok(RawPlanned(ptr))
    }
}

impl Drop for RawPlanned {
    fn drop(&mut self) {
        // SAFETY: the `PlannedSpans` made by `kvd_planned_new`, freed once, here (after the Module that used
        // it: the runner's `Module` drops its `RawModule` first).
        unsafe { kvd_planned_free(self.0) }
    }
}

/// `stream` as the caller stream a plugin queues its work on.
pub(crate) fn caller_stream(stream: &cuda_rt::Stream) -> Option<delegate_abi::CudaStream> {
    // SAFETY: a stream this process created on device 0's primary context (the device of the managed plan
    // whose memory the call's arguments are), kept alive by the `Arc` the executing Module holds for the whole
    // call; the bridge obeys the completion rule: it waits for the stream right after the call
    // (`backend::Handle`'s execute), before ExecuTorch or the caller touch any argument memory.
    unsafe { delegate_abi::CudaStream::from_raw(stream.as_ref().as_raw()) }
}

impl Drop for RawModule {
    fn drop(&mut self) {
        // SAFETY: the Module made by `kvd_module_new`, freed once, here. Its planned memory (`self.managed`)
        // and its program bytes (`self.program`) are dropped after this body, once nothing uses them.
        unsafe { kvd_module_free(self.module) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Calls the shim's `kvd_module_execute` with `n_inputs` inputs that do not exist: the shim reserves room
    /// for them before it reads one, so a count no vector can hold makes it throw there.
    fn execute_with_inputs(n_inputs: usize) -> (Result<(), ErrorCode>, Option<String>) {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("empty.pte");
        std::fs::write(&path, b"").expect("write");
        let program = ProgramFile::read(&path).expect("an empty file reads");
        let module = RawModule::new(program, true).expect("a Module (loads lazily)");
        let mut written = 0usize;
        take_exception();
        backend::take_last_error();
        // SAFETY: `module.module` is a live Module. The shim's first use of `inputs` is reserving `n_inputs`
        // entries, which throws for the counts below before any input is read, so the dangling pointer is never
        // dereferenced; there are no outputs.
        let result = shim_call(|| unsafe {
            kvd_module_execute(
                module.module,
                c"forward".as_ptr(),
                std::ptr::NonNull::<KvdTensor>::dangling().as_ptr(),
                n_inputs,
                std::ptr::null_mut(),
                0,
                &mut written,
            )
        });
        drop(module);
        (result, backend::take_last_error())
    }

    #[test]
    fn a_cpp_exception_at_the_boundary_is_an_executorch_code_and_its_message_reaches_rust() {
        // More than the address space: `operator new` throws std::bad_alloc.
        let (result, message) = execute_with_inputs(1 << 44);
        assert_eq!(result, Err(ErrorCode::MemoryAllocationFailed));
        let message = message.expect("the exception's message");
        assert!(message.contains("kvd_module_execute threw std::bad_alloc"), "{message}");
        // More than `max_size()`: `reserve` throws std::length_error.
        let (result, message) = execute_with_inputs(usize::MAX);
        assert_eq!(result, Err(ErrorCode::Internal));
        let message = message.expect("the exception's message");
        assert!(message.contains("kvd_module_execute threw") && message.contains("reserve"), "{message}");
        // The message is taken once: the next failure does not inherit it.
        assert_eq!(take_exception(), None);
    }
}
