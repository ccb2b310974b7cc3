//! The CUDA delegate: runs reference graphs (`ref-graph`, the payload the reference delegate runs on the
//! CPU) on an NVIDIA GPU, with KV caches the caller owns in device or managed memory updated in place. It is
//! the GPU path of this workspace and the second complete example of a delegate plugin.
//!
//! - [`CudaDelegate`] implements [`delegate_abi::Delegate`] for backend [`BACKEND_ID`] (`CudaBackend`).
//! - At `init`: the blob is checked, every argument position is resolved to its graph tensor by name, the
//!   graph is lowered to kernel launches (`plan`: the fusions decode wants where a graph matches them, one
//!   launch per op otherwise, none for a reshape), the kernels are compiled by NVRTC (once per process,
//!   device and element type), constants are uploaded and every intermediate and scratch buffer is
//!   allocated. Nothing is allocated or compiled per call.
//! - Products of many rows (a prefill's chunk of the prompt: two rows or more, `gemm::GEMM_MIN_ROWS`) run as
//!   cuBLAS GEMMs on tensor cores (f16 and bf16 with f32 accumulation, f32 without TF32), what their GEMV
//!   would fuse (the norm, bias, residual, activation, SwiGLU, cache rows) as launches over all the rows; the
//!   cuBLAS handle, its workspace and the scratch are made at `init`, and the products run on the caller's
//!   stream (capturable). A decode step of one row keeps its fused GEMVs.
//! - At `execute`: arguments are checked against the plan, device pointers are checked with the driver when
//!   they change (the residency gate runs on the real pointer), and the launches are queued on the caller's
//!   CUDA stream; with device-resident arguments nothing is copied and nothing waits.
//! - [`report`]: the launches `init` would plan for a payload, fused or not and why, computed on the CPU
//!   (`delegate-host inspect X.pte --plan`).
//!
//! Every op and form of reference-graph payload 1.3 runs, so Hugging Face decoders exported by the Python
//! lowering run on the GPU (Llama/Qwen2-style, and GPT-2, GPT-NeoX, Phi, StableLM, StarCoder2 and Falcon in
//! the same fused launches: LayerNorm, GELU, Q/K/V cut from one product, partial rotaries and parallel
//! blocks read as what they spell). Typed kernels (`src/kernels.cu`, `src/kernels/linear.cu`, one
//! module per float type a graph uses): embedding gather (indices of any rank), elementwise add, RMS norm over
//! the last axis, one row-dot GEMV for every product (a warp per output column over `[N, K]` weights:
//! `nn.Linear`'s as stored, `[K, N]` constants transposed once at upload) that fuses sibling projections with
//! their own widths, biases and weight rows, the RMS norm or LayerNorm before them, a GELU after a lone
//! product, a (partial) rotate-half RoPE, the residual adds and the cache update, an in-place
//! KV-cache update (token- or head-major updates, `[H, L, Dh]` or `[1, H, L, Dh]` caches), decode attention
//! split over the cache (flash-decoding: each valid K and V row read once, rows past the position never read;
//! grouped-query attention reads each KV head's rows for its query heads, never a repeated copy; q head- or
//! token-major; an optional scale) that merges its ranges in the same launch, and argmax of the last row.
//! Untyped kernels (`src/kernels/general.cu`, the element type a parameter): broadcasting add/sub/mul/div
//! (i64 add/sub/mul too), the unary functions, mean, cast, strided copies (permute, slice, concat), positions,
//! rotate-half RoPE, RoPE's cos/sin tables of a step in one launch and up to eight StaticCache counters in
//! one launch. Before lowering, the planner puts the graph in one canonical form (views as names, what
//! depends on the position alone first, sibling products adjacent), so a transformers export reaches the
//! same fused launches as a hand-built graph. `f32`, `f16` and `bf16` storage, `f32` arithmetic. Positions and token ids are read
//! from device memory and checked there (a bad one sets an error bit the call reports), so a captured CUDA
//! graph of a decode step replays without update. On sm_90 and later every kernel after the first of a call
//! is launched overlapping the one before it (programmatic dependent launch).
//!
//! ## Examples
//!
//! ```
//! use cuda_delegate::{CudaDelegate, BACKEND_ID};
//! use delegate_abi::Delegate;
//!
//! assert_eq!(CudaDelegate::info().backends, [BACKEND_ID]);
//! // Without a driver (every CI machine) the delegate says why instead of failing later.
//! if let Err(err) = CudaDelegate.availability() {
//!     assert_eq!(err.code, et_error::ErrorCode::NotSupported);
//! }
//! ```
//!
//! ## Feature Flags
//!
//! None. CUDA libraries are loaded at run time (through `cuda-rt`): building needs no CUDA.
#![deny(missing_docs)]

mod delegate;
mod engine;
mod gemm;
mod kernels;
mod plan;
pub mod report;

pub use delegate::{CudaDelegate, CudaHandle, Error, MEMORY_KINDS, WIRE_FORMAT_VERSIONS};
/// What one argument position carries: the binding plan every executor of reference graphs shares
/// (`ref-graph-contract`).
pub use ref_graph_contract::ArgSpec;

/// The ExecuTorch backend id this delegate serves.
pub const BACKEND_ID: &str = "CudaBackend";

/// The CUDA C source of the typed kernels (compiled with `-DKV_F16`, `-DKV_BF16` or neither), for tools that
/// want to compile or inspect it.
pub const KERNEL_SOURCE: &str = kernels::SOURCE;

/// The CUDA C source of the untyped kernels of the general path (the element type a launch parameter).
pub const GENERAL_KERNEL_SOURCE: &str = kernels::general::SOURCE;

delegate_abi::export_delegate!(@embedded CudaDelegate);
