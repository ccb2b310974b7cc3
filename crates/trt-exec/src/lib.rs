//! Runs TensorRT-RTX engines over caller memory, in place: the run side of TensorRT (the build side is
//! `trt-build`).
//!
//! - [`library`]: TensorRT-RTX is loaded at run time (dlopen) from `KV_TENSORRT_LIB` ([`library::LIB_ENV`]),
//!   then the standard loader path.
//! - [`Engine::deserialize`] (TensorRT needs a CUDA driver and a supported GPU here; otherwise a clean
//!   [`Error::EngineUnavailable`] carrying TensorRT's own message) and [`EngineIo`] introspection (including
//!   `getAliasedInputTensor`), implementing alias-validate's `EngineIntrospect`; [`sniff_plan`] /
//!   [`check_plan_kind`] tell TensorRT-RTX plans from TensorRT ones.
//! - The pure [`BindingPlan`] / [`CallPlan`] deciding every binding, staging, reflect and synchronisation.
//! - [`Runner`], the executor: [`Runner::new`] makes the `IExecutionContext` and every CUDA resource once
//!   (through `cuda-rt`: the device's primary context, a per-handle stream, staging buffers, the 1-byte
//!   scratch; without a driver a clean `NotSupported` [`Error::Cuda`]); [`Runner::execute`] runs one call
//!   over the caller's [`IoArg`]s on the caller's stream (a `cuda_rt::StreamRef`), without allocating. It
//!   takes its own argument views, not a plugin ABI's, the way wgpu-hal's backends sit below wgpu-core: the
//!   TensorRT delegate adapts its ABI's arguments. TensorRT-RTX 1.7 runs on no GPU of this workplace (the
//!   H200 is compute capability 9.0, refused at deserialize), so `enqueueV3` has never executed here; the CUDA
//!   pieces were run on the H200.
//! - [`LogSink`], [`dtype_name`] and [`trt_dtype`] are shared with the build side.
//!
//! Building this crate needs libclang (trtx-sys generates bindings), not TensorRT or CUDA.
//!
//! ## Examples
//!
//! Binding plans are pure data, so they are decided and checked without TensorRT:
//!
//! ```
//! use et_error::MemoryKind;
//! use blob_format::model::{Alias, AliasKind, Binding, DType, Header, PayloadKind, Role};
//! use trt_exec::{ArgView, BindingPlan, EngineIo};
//!
//! let io = EngineIo::from_json(r#"{"library": null, "reports_aliases": true,
//!   "tensors": [{"name": "k_cache", "mode": "input", "dtype": "f32", "shape": [4]},
//!               {"name": "k_cache_out", "mode": "output", "dtype": "f32", "shape": [4]}],
//!   "aliases": [{"output": "k_cache_out", "input": "k_cache"}]}"#).unwrap();
//! let header = Header {
//!     producer: None, backend_id: "TensorRTBackend".into(), payload_kind: PayloadKind::TensorRtPlan,
//!     bindings: vec![Binding::untyped("k_cache", Role::Input), Binding::untyped("k_cache_out", Role::Output)],
//!     aliases: vec![Alias { output: "k_cache_out".into(), input: "k_cache".into(), kind: AliasKind::KvCacheUpdate }],
//!     device_id: 0, hardware_compatible: false, hardware_target: None,
//!     engine_library_version: None, engine_metadata: None,
//! };
//! let aliases = alias_validate::validate_with_engine(&header, &io).unwrap();
//! let plan = BindingPlan::new(&header, &io, &aliases).unwrap();
//! let cache = ArgView { address: 0x1000, nbytes: 16, residency: MemoryKind::Device, dtype: DType::F32, shape: &[4] };
//! // The caller passes one storage for the cache and its aliased output: no copy, no sync on its stream.
//! let call = plan.prepare(&[cache, cache], false, true).unwrap();
//! assert!(call.after.is_empty() && !call.synchronize);
//! ```
//!
//! ## Feature Flags
//!
//! None. trtx is used with `dlopen_tensorrt_rtx` + `v_1_7` (TensorRT-RTX 1.7, loaded at run time): it is not
//! needed to build, only libclang (for trtx-sys's bindings).
#![deny(missing_docs)]

mod error;
mod executor;
mod introspect;
pub mod library;
mod log;
mod plan;
mod runtime;

pub use error::{Error, Result};
pub use executor::{
    check_profile, host_memory_engine_visible, tensor_bytes, CallStats, IoArg, ReflectCopy, Runner,
};
pub use introspect::{dtype_name, trt_dtype, AliasPair, EngineIo, IoMode, IoTensor};
pub use log::{log_suffix, LogSink};
pub use plan::{
    Address, ArgBinding, ArgRole, ArgView, BindingError, BindingPlan, CallPlan, Copy, TensorAddress,
    UnthreadedOutput, TENSOR_ALIGNMENT,
};
pub use runtime::{check_plan_kind, sniff_plan, Engine, PlanKind};
