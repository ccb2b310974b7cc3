//! The run side: a deserialized engine (through trtx-sys, because trtx's safe API lacks
//! `getAliasedInputTensor` and hides the raw engine), its introspection, and payload sniffing.

use std::ffi::{c_char, c_void, CStr, CString};

use alias_validate::engine::{EngineIntrospect, EngineTensor};
use cxx::UniquePtr;
use trtx_sys::nvinfer1::{ICudaEngine, IExecutionContext, IRuntime};

use crate::error::{Error, Result};
use crate::introspect::{dtype_name, AliasPair, EngineIo, IoMode, IoTensor};
use crate::library;
use crate::log::{log_suffix, LogSink};

/// What a plan's first bytes say it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanKind {
    /// A TensorRT-RTX plan (magic `vtrt`), which this build reads.
    TensorRtRtx,
    /// A TensorRT (non-RTX, e.g. TensorRT 10/11) plan (magic `ftrt`), which only an `enterprise` build reads.
    TensorRt,
    /// Neither.
    Unknown,
}

/// Recognises a plan by its magic.
pub fn sniff_plan(plan: &[u8]) -> PlanKind {
    match plan.get(..4) {
        Some(b"vtrt") => PlanKind::TensorRtRtx,
        Some(b"ftrt") => PlanKind::TensorRt,
        _ => PlanKind::Unknown,
    }
}

/// Refuses plans this build cannot read, naming what they are.
pub fn check_plan_kind(plan: &[u8]) -> Result<()> {
    match sniff_plan(plan) {
        PlanKind::TensorRtRtx => Ok(()),
        PlanKind::TensorRt => Err(Error::ForeignPlan(
            "the engine is a TensorRT plan (magic 'ftrt'); this delegate is built for TensorRT-RTX, which cannot \
             read it: rebuild the engine with TensorRT-RTX, or use a delegate built with trtx's `enterprise` \
             feature (TensorRT 11)"
                .to_owned(),
        )),
        PlanKind::Unknown => Err(Error::BadPayload(format!(
            "the engine payload ({} bytes, starting {:02x?}) is not a TensorRT-RTX plan (magic 'vtrt') nor a \
             TensorRT plan (magic 'ftrt')",
            plan.len(),
            &plan[..plan.len().min(4)]
        ))),
    }
}

/// Owns a logger bridge that forwards TensorRT's log into a [`LogSink`].
struct LoggerBridge {
    bridge: *mut trtx_sys::RustLoggerBridge,
    sink: *mut LogSink,
}

unsafe extern "C" fn log_callback(user_data: *mut c_void, severity: i32, msg: *const c_char) {
    if user_data.is_null() || msg.is_null() {
        return;
    }
    // SAFETY: `user_data` is the `LogSink` boxed in `LoggerBridge::new`, alive until the bridge is destroyed
    // (the bridge is destroyed first in `Drop`); `msg` is a NUL-terminated string TensorRT owns for the call.
    let (sink, msg) = unsafe { (&*(user_data as *const LogSink), CStr::from_ptr(msg)) };
    let severity = match severity {
        0 => trtx::Severity::InternalError,
        1 => trtx::Severity::Error,
        2 => trtx::Severity::Warning,
        3 => trtx::Severity::Info,
        _ => trtx::Severity::Verbose,
    };
    sink.record(severity, &msg.to_string_lossy());
}

impl LoggerBridge {
    fn new(sink: LogSink) -> Result<LoggerBridge> {
        let sink = Box::into_raw(Box::new(sink));
        // SAFETY: `log_callback` matches `RustLogCallback`; `sink` stays valid until `Drop` destroys the bridge.
        let bridge = unsafe { trtx_sys::create_rust_logger_bridge(log_callback, sink.cast()) };
        if bridge.is_null() {
            // SAFETY: `sink` came from `Box::into_raw` above and nothing else holds it.
            drop(unsafe { Box::from_raw(sink) });
            return Err(Error::Trt {
                call: "create_rust_logger_bridge",
                message: "returned null".to_owned(),
            });
        }
        Ok(LoggerBridge { bridge, sink })
    }

    fn interface(&self) -> *mut c_void {
        // SAFETY: `bridge` is a live bridge created by `create_rust_logger_bridge`.
        unsafe { trtx_sys::get_logger_interface(self.bridge) }
    }
}

impl Drop for LoggerBridge {
    fn drop(&mut self) {
        // SAFETY: the bridge is live and destroyed exactly once; after that no callback can reach `sink`,
        // which came from `Box::into_raw` in `new`.
        unsafe {
            trtx_sys::destroy_rust_logger_bridge(self.bridge);
            drop(Box::from_raw(self.sink));
        }
    }
}

/// A deserialized TensorRT-RTX engine and its introspection.
///
/// Field order is drop order: the engine goes before its runtime, the runtime before the logger.
pub struct Engine {
    engine: UniquePtr<ICudaEngine>,
    _runtime: UniquePtr<IRuntime>,
    _logger: LoggerBridge,
    sink: LogSink,
    io: EngineIo,
}

// SAFETY: TensorRT documents `IRuntime` and `ICudaEngine` as usable from any thread (not concurrently for the
// runtime); `Engine` exposes no shared mutation, and the logger bridge's sink is `Send + Sync`.
unsafe impl Send for Engine {}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("io", &self.io).finish_non_exhaustive()
    }
}

impl Engine {
    /// Deserializes a TensorRT-RTX plan and reads its I/O and aliases.
    ///
    /// # Errors
    /// [`Error::LibraryNotFound`] without a library; [`Error::BadPayload`] for a non-RTX plan;
    /// [`Error::EngineUnavailable`] (`NotSupported`) when TensorRT cannot load the plan on this machine (no
    /// CUDA driver, unsupported GPU), with TensorRT's own messages attached.
    pub fn deserialize(plan: &[u8]) -> Result<Engine> {
        check_plan_kind(plan)?;
        let lib = library::load()?;
        let sink = LogSink::default();
        let logger = LoggerBridge::new(sink.clone())?;
        // SAFETY: `logger.interface()` is a valid `ILogger*` kept alive by `Engine::logger`, which drops after
        // the runtime (field order).
        let raw = unsafe { lib.create_runtime(logger.interface())? };
        if raw.is_null() {
            return Err(Error::EngineUnavailable {
                message: "createInferRuntime returned null".to_owned(),
                log: sink.take_errors(),
            });
        }
        // SAFETY: `raw` is a non-null `IRuntime*` we own; TensorRT objects are deleted with `delete`.
        let mut runtime = unsafe { UniquePtr::from_raw(raw.cast::<IRuntime>()) };
        let Some(rt) = runtime.as_mut() else {
            return Err(Error::Trt { call: "createInferRuntime", message: "null runtime".to_owned() });
        };
        // SAFETY: `plan` is valid for reads of `plan.len()` bytes for the call; TensorRT copies what it keeps.
        let engine = unsafe { rt.deserializeCudaEngine(plan.as_ptr().cast(), plan.len()) };
        if engine.is_null() {
            let log = sink.take_errors();
            return Err(Error::EngineUnavailable {
                message: format!(
                    "deserializeCudaEngine failed for a {}-byte plan ({})",
                    plan.len(),
                    lib.version.describe()
                ),
                log,
            });
        }
        // SAFETY: non-null `ICudaEngine*` we own, created by `runtime`, which outlives it (field order).
        let engine = unsafe { UniquePtr::from_raw(engine) };
        let io = read_io(&engine, &lib.version)?;
        Ok(Engine { engine, _runtime: runtime, _logger: logger, sink, io })
    }

    /// The engine's I/O and aliases as plain data.
    pub fn io(&self) -> &EngineIo {
        &self.io
    }

    /// TensorRT's error messages logged since the last call (attached to our errors).
    pub(crate) fn take_log_errors(&self) -> Vec<String> {
        self.sink.take_errors()
    }

    /// `createExecutionContext(kSTATIC)`: a context owning its activation memory for the engine's lifetime.
    /// The caller must drop the context before this engine.
    pub(crate) fn create_execution_context(&mut self) -> Result<UniquePtr<IExecutionContext>> {
        let engine = self
            .engine
            .as_mut()
            .ok_or(Error::Trt { call: "createExecutionContext", message: "null engine".to_owned() })?;
        let raw = engine.createExecutionContext(trtx_sys::ExecutionContextAllocationStrategy::kSTATIC.into());
        if raw.is_null() {
            return Err(Error::Trt {
                call: "createExecutionContext",
                message: format!("returned null{}", log_suffix(&self.take_log_errors())),
            });
        }
        // SAFETY: a non-null `IExecutionContext*` we own, created by this engine; TensorRT objects are deleted
        // with `delete`; the caller drops it before the engine (documented above).
        Ok(unsafe { UniquePtr::from_raw(raw) })
    }

    /// Whether TensorRT expects the tensor's address in host memory (`TensorLocation::kHOST`, shape tensors).
    pub(crate) fn tensor_on_host(&self, name: &CStr) -> bool {
        self.engine.as_ref().is_some_and(|engine| {
            // SAFETY: `name` is a NUL-terminated engine tensor name (< 4096 bytes).
            let location = unsafe { engine.getTensorLocation(name.as_ptr()) };
            trtx_sys::TensorLocation::from(location) == trtx_sys::TensorLocation::kHOST
        })
    }

    /// The optimisation profile 0's minimum and maximum shape of input `name`.
    pub(crate) fn profile_bounds(&self, name: &CStr) -> Option<(Vec<i64>, Vec<i64>)> {
        let engine = self.engine.as_ref()?;
        let dims = |select: trtx_sys::OptProfileSelector| {
            // SAFETY: `name` is a NUL-terminated engine input name (< 4096 bytes); profile 0 always exists.
            let d = unsafe { engine.getProfileShape(name.as_ptr(), 0, select.into()) };
            let rank = usize::try_from(d.nbDims).ok().filter(|&r| r <= 8)?;
            Some(d.d[..rank].to_vec())
        };
        Some((dims(trtx_sys::OptProfileSelector::kMIN)?, dims(trtx_sys::OptProfileSelector::kMAX)?))
    }
}

fn read_io(engine: &UniquePtr<ICudaEngine>, version: &library::LibraryVersion) -> Result<EngineIo> {
    let engine =
        engine.as_ref().ok_or(Error::Trt { call: "deserializeCudaEngine", message: "null".to_owned() })?;
    let mut tensors = Vec::new();
    let mut aliases = Vec::new();
    for index in 0..engine.getNbIOTensors() {
        let name_ptr = engine.getIOTensorName(index);
        if name_ptr.is_null() {
            return Err(Error::Trt { call: "getIOTensorName", message: format!("null for index {index}") });
        }
        // SAFETY: TensorRT returns a NUL-terminated name owned by the engine, valid while it lives.
        let name = unsafe { CStr::from_ptr(name_ptr) }.to_string_lossy().into_owned();
        let cname = CString::new(name.clone())
            .map_err(|_| Error::Trt { call: "getIOTensorName", message: "name with NUL".to_owned() })?;
        // SAFETY: `cname` is a NUL-terminated tensor name (< 4096 bytes: it came from the engine).
        let (mode, dims, dtype) = unsafe {
            (
                trtx::TensorIOMode::from(engine.getTensorIOMode(cname.as_ptr())),
                engine.getTensorShape(cname.as_ptr()),
                trtx::DataType::from(engine.getTensorDataType(cname.as_ptr())),
            )
        };
        let mode = match mode {
            trtx::TensorIOMode::kINPUT => IoMode::Input,
            trtx::TensorIOMode::kOUTPUT => IoMode::Output,
            _ => continue,
        };
        let rank = usize::try_from(dims.nbDims).unwrap_or(0).min(8);
        let shape = dims.d[..rank].to_vec();
        if mode == IoMode::Output && version.reports_aliases() {
            // SAFETY: as above; the returned pointer is null or a NUL-terminated name owned by the engine.
            let aliased = unsafe { engine.getAliasedInputTensor(cname.as_ptr()) };
            if !aliased.is_null() {
                // SAFETY: non-null, NUL-terminated, owned by the engine.
                let input = unsafe { CStr::from_ptr(aliased) }.to_string_lossy().into_owned();
                aliases.push(AliasPair { output: name.clone(), input });
            }
        }
        tensors.push(IoTensor { name, mode, dtype: dtype_name(dtype), shape });
    }
    Ok(EngineIo {
        library: Some(version.describe()),
        reports_aliases: version.reports_aliases(),
        tensors,
        aliases,
    })
}

impl EngineIntrospect for Engine {
    fn tensors(&self) -> Vec<EngineTensor> {
        self.io.tensors()
    }

    fn reports_aliases(&self) -> bool {
        self.io.reports_aliases
    }

    fn aliased_input(&self, output: &str) -> Option<String> {
        self.io.aliased_input(output)
    }
}
