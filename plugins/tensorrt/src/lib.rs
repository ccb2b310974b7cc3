//! The TensorRT delegate plugin: serves backend `TensorRTBackend` with TensorRT-RTX engines through `trt-exec`.
//!
//! It reads native blobs and upstream Torch-TensorRT TR01/TR02 blobs, refuses engine payloads the loaded
//! library cannot read (a TensorRT `ftrt` plan under TensorRT-RTX), validates the alias table against the
//! engine's own `getAliasedInputTensor`, and computes the binding plan once at `init`.
//!
//! `init` fails cleanly, with TensorRT's own message attached, when the library is missing (`NotSupported`,
//! naming `KV_TENSORRT_LIB`), when there is no CUDA driver (`NotSupported`: TensorRT reports "CUDA driver
//! version is insufficient"), or when the GPU is not one TensorRT-RTX supports (`NotSupported`: e.g. compute
//! capability 9.0). `execute` checks every argument against the binding plan (count, dtype, shape, size, and
//! the residency gate for aliased inputs) and then returns `NotSupported`: the CUDA execute path is not in
//! this build (no GPU of this workplace runs TensorRT-RTX 1.7).
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
#![forbid(unsafe_code)]

use alias_validate::residency::Residency;
use blob_format::model::{DType, Header, PayloadKind, TENSORRT_BACKEND};
use blob_format::Blob;
use delegate_abi::{
    Compatibility, DTypeCode, Delegate, DelegateError, ExecuteArgs, InitContext, MemoryKind, PluginInfo,
    WireFormatSupport,
};
use trt_exec::{ArgView, BindingPlan, Engine, PlanKind};

/// The TensorRT delegate.
#[derive(Debug, Default)]
pub struct TensorRtDelegate {
    _private: (),
}

/// One initialised blob: the deserialized engine and its binding plan.
#[derive(Debug)]
pub struct Handle {
    engine: Engine,
    plan: BindingPlan,
    header: Header,
}

impl Handle {
    /// The binding plan computed at init.
    pub fn plan(&self) -> &BindingPlan {
        &self.plan
    }

    /// The blob header the handle was made from.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The engine's introspection.
    pub fn engine_io(&self) -> &trt_exec::EngineIo {
        self.engine.io()
    }
}

fn err<E: et_error::HasErrorCode + std::error::Error>(e: E) -> DelegateError {
    DelegateError::from(&e)
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

fn residency(kind: MemoryKind) -> Residency {
    match kind {
        MemoryKind::Host => Residency::Host,
        MemoryKind::Pinned => Residency::PinnedHost,
        MemoryKind::Device => Residency::Device,
        MemoryKind::Managed => Residency::Managed,
    }
}

fn dtype(code: DTypeCode) -> Option<DType> {
    DType::from_name(code.name())
}

impl Delegate for TensorRtDelegate {
    type Handle = Handle;

    fn new() -> Self {
        TensorRtDelegate::default()
    }

    fn info() -> PluginInfo {
        PluginInfo {
            name: "tensorrt-delegate".to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            backends: vec![TENSORRT_BACKEND.to_owned()],
            wire_formats: vec![
                WireFormatSupport { format: "native".to_owned(), versions: ">=1.0, <2".to_owned() },
                WireFormatSupport { format: "tr01".to_owned(), versions: "=1".to_owned() },
                WireFormatSupport { format: "tr02".to_owned(), versions: "=2".to_owned() },
            ],
            memory_kinds: MemoryKind::ALL.to_vec(),
            binds_aliases_in_place: true,
        }
    }

    fn is_available(&self) -> bool {
        trt_exec::library::load().is_ok()
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
        Ok(Handle { engine, plan, header: blob.header })
    }

    fn execute(&self, handle: &mut Handle, args: &mut ExecuteArgs<'_>) -> Result<(), DelegateError> {
        let mut views = Vec::with_capacity(args.len());
        for (index, arg) in args.args().iter().enumerate() {
            let dt = dtype(arg.dtype()).ok_or_else(|| {
                DelegateError::invalid_argument(format!(
                    "argument {index} has dtype {}, unknown here",
                    arg.dtype()
                ))
            })?;
            views.push(ArgView {
                address: arg.data as usize as u64,
                nbytes: arg.nbytes,
                residency: residency(arg.memory()),
                dtype: dt,
                shape: arg.dims(),
            });
        }
        let call = handle.plan.prepare(&views, false, args.stream().is_some()).map_err(err)?;
        tracing::debug!(?call, "TensorRT call plan");
        Err(DelegateError::not_supported(
            "the TensorRT execute path (CUDA staging, enqueueV3, reflect) is not in this build; arguments were \
             checked against the binding plan",
        ))
    }
}

delegate_abi::export_delegate!(TensorRtDelegate);
