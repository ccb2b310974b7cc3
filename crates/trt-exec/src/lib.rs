//! Binds TensorRT-RTX engines to caller memory in place, and builds them: the one crate that touches TensorRT.
//!
//! - Build side ([`build_engine`]): a small [`NetworkDesc`] (inputs, constants, matmul, element-wise,
//!   softmax, shuffle, gather, cast, `IKVCacheUpdateLayer`) built ahead of time by TensorRT-RTX, which needs
//!   no GPU to build. The [`BuiltEngine`] carries the plan and the I/O and aliases TensorRT reported for the
//!   network, so a blob's alias table ([`export::header_for`]) is TensorRT's own. [`decoder`] is the
//!   example KV-cache decoder.
//! - Run side: [`Engine::deserialize`] (TensorRT needs a CUDA driver and a supported GPU here; otherwise a
//!   clean [`Error::EngineUnavailable`] carrying TensorRT's own message), [`EngineIo`] introspection
//!   (including `getAliasedInputTensor`) implementing alias-validate's `EngineIntrospect`, and the pure
//!   [`BindingPlan`] / [`CallPlan`] deciding every binding, staging, reflect and synchronisation.
//! - Execute path: [`Runner::new`] makes the `IExecutionContext` and every CUDA resource once ([`cuda`]:
//!   the device's primary context, a per-handle stream, staging buffers, the 1-byte scratch; `libcuda` is
//!   loaded at run time and its absence is a clean [`Error::CudaUnavailable`]); [`Runner::execute`] runs one
//!   call over the delegate ABI's `ExecuteArgs` (staging, `setTensorAddress` with aliased outputs on their
//!   inputs' caller pointers, `enqueueV3`, reflects and read-backs, synchronising only when the caller
//!   needs it) without allocating. TensorRT-RTX 1.7 runs on no GPU of this workplace (the H200 is compute
//!   capability 9.0, refused at deserialize), so `enqueueV3` has never executed here; the CUDA pieces
//!   (context, stream, buffers, copies) were run on the H200.
//!
//! The library is loaded at run time (dlopen): from `KV_TENSORRT_LIB` ([`library::LIB_ENV`]), then the
//! standard loader path. Building this crate needs libclang (trtx-sys generates bindings), not TensorRT.
//!
//! ## Examples
//!
//! Binding plans are pure data, so they are decided and checked without TensorRT:
//!
//! ```
//! use alias_validate::residency::Residency;
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
//! let cache = ArgView { address: 0x1000, nbytes: 16, residency: Residency::Device, dtype: DType::F32, shape: &[4] };
//! // The caller passes one storage for the cache and its aliased output: no copy, no sync on its stream.
//! let call = plan.prepare(&[cache, cache], false, true).unwrap();
//! assert!(call.after.is_empty() && !call.synchronize);
//! ```
//!
//! Building kv-example's decoder as TensorRT engines plus a program manifest:
//! `cargo run -p trt-exec --example export_example -- DIR [--big]` (see `examples/export_example.rs`).
//!
//! ## Feature Flags
//!
//! None. trtx is used with `dlopen_tensorrt_rtx` + `v_1_7` (TensorRT-RTX 1.7, loaded at run time) and cudarc
//! with `driver` + `dynamic-loading` + `cuda-13000` (`libcuda` loaded at run time): neither is needed to
//! build, only libclang (for trtx-sys's bindings).
#![deny(missing_docs)]

pub mod cuda;
pub mod decoder;
mod error;
mod executor;
pub mod export;
mod introspect;
pub mod library;
mod network;
mod plan;
mod runtime;

pub use error::{Error, Result};
pub use executor::{arg_view, check_profile, residency, tensor_bytes, CallStats, ReflectCopy, Runner};
pub use introspect::{AliasPair, EngineIo, IoMode, IoTensor};
pub use network::{build_engine, BinaryOp, BuildOptions, BuiltEngine, NetworkDesc, Node, Op, UnaryOp};
pub use plan::{
    Address, ArgBinding, ArgRole, ArgView, BindingError, BindingPlan, CallPlan, Copy, TensorAddress,
    UnthreadedOutput, TENSOR_ALIGNMENT,
};
pub use runtime::{check_plan_kind, sniff_plan, Engine, PlanKind};
