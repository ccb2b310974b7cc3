//! The CUDA delegate: runs reference graphs (`ref-graph`, the payload the reference delegate runs on the
//! CPU) on an NVIDIA GPU, with KV caches the caller owns in device or managed memory updated in place. It is
//! the GPU path of this workspace and the second complete example of a delegate plugin.
//!
//! - [`CudaDelegate`] implements [`delegate_abi::Delegate`] for backend [`BACKEND_ID`] (`CudaBackend`).
//! - At `init`: the blob is checked, every argument position is resolved to its graph tensor by name, the
//!   graph is lowered to kernel launches with the fusions decode wants (`plan`), the kernels are compiled
//!   by NVRTC (once per process, device and element type), constants are uploaded and every intermediate
//!   and scratch buffer is allocated. Nothing is allocated or compiled per call.
//! - At `execute`: arguments are checked against the plan, device pointers are checked with the driver when
//!   they change (the residency gate runs on the real pointer), and the launches are queued on the caller's
//!   CUDA stream; with device-resident arguments nothing is copied and nothing waits.
//!
//! Kernels (`src/kernels.cu`): embedding gather, positions, elementwise add, RMS norm, a split-K GEMV for
//! one-row (and few-row) products that fuses sibling projections and the residual add, an in-place KV-cache
//! update, decode attention split over the cache (flash-decoding: each valid K and V row read once, rows past
//! the position never read) with a combine pass, and argmax. `f32` and `f16` storage, `f32` arithmetic.
//! Positions are read from device memory, so a captured CUDA graph of a decode step replays without update.
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
mod kernels;
mod plan;

pub use delegate::{CudaDelegate, CudaHandle, Error, MEMORY_KINDS, WIRE_FORMAT_VERSIONS};
/// What one argument position carries: the reference delegate's binding plan, shared by every executor of
/// reference graphs.
pub use reference_delegate::delegate::ArgSpec;

/// The ExecuTorch backend id this delegate serves.
pub const BACKEND_ID: &str = "CudaBackend";

/// The CUDA C source of the kernels, for tools that want to compile or inspect it.
pub const KERNEL_SOURCE: &str = kernels::SOURCE;

delegate_abi::export_delegate!(@embedded CudaDelegate);
