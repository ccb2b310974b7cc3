//! The TensorRT delegate plugin: serves backend `TensorRTBackend` with TensorRT-RTX engines through `trt-exec`.
//!
//! It reads native blobs and upstream Torch-TensorRT TR01/TR02 blobs, refuses engine payloads the loaded
//! library cannot read (a TensorRT `ftrt` plan under TensorRT-RTX), validates the alias table against the
//! engine's own `getAliasedInputTensor`, and computes the binding plan once at `init`.
//!
//! `init` fails cleanly, with TensorRT's own message attached, when the library is missing (`NotSupported`,
//! naming `KV_TENSORRT_LIB`), when there is no CUDA driver (`NotSupported`: TensorRT reports "CUDA driver
//! version is insufficient"), or when the GPU is not one TensorRT-RTX supports (`NotSupported`: e.g. compute
//! capability 9.0). After a successful deserialize, `init` creates the execution context and every CUDA
//! resource once ([`trt_exec::Runner`]); `execute` adapts the ABI's arguments and stream to the runner's own
//! (`trt_exec::IoArg`, `cuda_rt::StreamRef`: the crate's one `unsafe` block, in `adapt`), which checks every
//! argument against the binding plan (count, dtype, shape, size, device, alignment, and the residency gate
//! for aliased inputs), stages host inputs, binds aliased outputs to their caches' caller pointers, runs
//! `enqueueV3` on the caller's stream (or the handle's own), reflects and reads back as needed, and
//! synchronises only when the caller needs it; the staged and reflected bytes it reports are recorded in the
//! ABI's statistics. The run path has not executed on a GPU here: no GPU of this workplace runs
//! TensorRT-RTX 1.7. The plugin links `trt-exec` and `cuda-rt`, not the engine builder.
//!
//! ## Examples
//!
//! ```
//! use delegate_abi::Delegate;
//! use tensorrt_delegate::TensorRtDelegate;
//!
//! let info = TensorRtDelegate::info();
//! assert_eq!(info.backends, ["TensorRTBackend"]);
//! // A blob that is not a blob: a header-only refusal, no TensorRT needed.
//! let delegate = TensorRtDelegate::new();
//! assert!(matches!(delegate.compatibility(b"nope"), delegate_abi::Compatibility::Unsupported { .. }));
//! ```
//!
//! ## Feature Flags
//!
//! None.
#![deny(missing_docs)]
// Only `adapt` may use `unsafe` (it vouches for the ABI's arguments to the runner).
#![deny(unsafe_code)]

mod adapt;

use blob_format::model::{Header, PayloadKind, TENSORRT_BACKEND};
use blob_format::Blob;
use delegate_abi::{
    Compatibility, Delegate, DelegateError, ExecuteArgs, InitContext, MemoryKind, PluginInfo,
};
use trt_exec::{BindingPlan, Engine, PlanKind, Runner};

/// The TensorRT delegate.
#[derive(Debug, Default)]
pub struct TensorRtDelegate {
    _private: (),
}

/// One initialised blob: the engine, its binding plan, execution context and CUDA resources.
#[derive(Debug)]
pub struct Handle {
    runner: Runner,
    header: Header,
}

impl Handle {
    /// The binding plan computed at init.
    pub fn plan(&self) -> &BindingPlan {
        self.runner.plan()
    }

    /// The blob header the handle was made from.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The engine's introspection.
    pub fn engine_io(&self) -> &trt_exec::EngineIo {
        self.runner.engine().io()
    }
}

fn err<E: et_error::HasErrorCode + std::error::Error>(e: E) -> DelegateError {
    DelegateError::from(e)
}

/// The blob's header and engine after the checks that need no TensorRT (format, backend, payload kind, plan
/// magic, payload checksum, alias table).
fn check_blob<'a>(bytes: &'a [u8]) -> Result<Blob<'a>, DelegateError> {
    let blob = Blob::parse(bytes).map_err(err)?;
    if blob.header.backend_id != TENSORRT_BACKEND {
        return Err(DelegateError::new(
            et_error::ErrorCode::DelegateInvalidCompatibility,
            format!(
                "the blob is for backend '{}', this delegate serves '{TENSORRT_BACKEND}'",
                blob.header.backend_id
            ),
        ));
    }
    if blob.header.payload_kind != PayloadKind::TensorRtPlan {
        return Err(DelegateError::invalid_program(format!(
            "the blob's payload is '{}', this delegate runs 'tensorrt-plan' payloads",
            blob.header.payload_kind
        )));
    }
    trt_exec::check_plan_kind(blob.engine).map_err(err)?;
    blob.verify_payload().map_err(err)?;
    alias_validate::validate_format(&blob.header).map_err(err)?;
    Ok(blob)
}

impl Delegate for TensorRtDelegate {
    type Handle = Handle;

    fn new() -> Self {
        TensorRtDelegate::default()
    }

    fn info() -> PluginInfo {
        PluginInfo::new("tensorrt-delegate", env!("CARGO_PKG_VERSION"))
            .with_backend(TENSORRT_BACKEND)
            .with_wire_format("native", ">=1.0, <2")
            .with_wire_format("tr01", "=1")
            .with_wire_format("tr02", "=2")
            .with_memory_kinds(MemoryKind::ALL)
            .with_binds_aliases_in_place(true)
            // What hosts relied on before capabilities were stated: enqueueV3 on the caller's stream, captured
            // into the decode graph; caches bound where they are in device and managed memory.
            .with_capabilities(
                delegate_abi::Capabilities::default()
                    .with_in_place_memory_kinds([MemoryKind::Device, MemoryKind::Managed])
                    .with_caller_stream(true)
                    .with_cuda_graph_capturable(true),
            )
    }

    fn availability(&self) -> Result<(), DelegateError> {
        trt_exec::library::load().map(drop).map_err(|err| DelegateError::not_supported(err.to_string()))
    }

    fn compatibility(&self, blob: &[u8]) -> Compatibility {
        match check_blob(blob) {
            Ok(blob) => match trt_exec::sniff_plan(blob.engine) {
                PlanKind::TensorRtRtx => Compatibility::Supported,
                other => Compatibility::Unsupported { reason: format!("engine payload is {other:?}") },
            },
            Err(e) => Compatibility::Unsupported { reason: e.to_string() },
        }
    }

    fn init(&self, ctx: InitContext<'_>) -> Result<Handle, DelegateError> {
        let blob = check_blob(ctx.blob)?;
        let engine = Engine::deserialize(blob.engine).map_err(err)?;
        let aliases = alias_validate::validate_with_engine(&blob.header, engine.io()).map_err(err)?;
        for warning in aliases.warnings() {
            tracing::warn!("{warning}");
        }
        let plan = BindingPlan::new(&blob.header, engine.io(), &aliases).map_err(err)?;
        let device = blob.header.device_id;
        if device < 0 {
            return Err(DelegateError::invalid_program(format!("the blob's device id {device} is negative")));
        }
        let runner = Runner::new(engine, plan, device).map_err(err)?;
        Ok(Handle { runner, header: blob.header })
    }

    fn execute(&self, handle: &mut Handle, args: &mut ExecuteArgs<'_>) -> Result<(), DelegateError> {
        let stats = adapt::execute(&mut handle.runner, args).map_err(err)?;
        tracing::trace!(?stats, "TensorRT call");
        Ok(())
    }
}

// The root module for embedding; the dylib's entry symbol is in `plugins/tensorrt-dylib`.
delegate_abi::export_delegate!(@embedded TensorRtDelegate);
