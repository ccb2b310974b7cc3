//! The workspace's one CUDA layer: device contexts, memory, streams, events, copies, pointer queries, NVRTC
//! modules and cuBLAS, over cudarc, with every library loaded at run time; no other crate names cudarc.
//!
//! - [`Context`]: a device's primary context (the one the CUDA runtime, TensorRT and cuBLAS use), opened by
//!   ordinal (`i32`, as CUDA's `int device`); [`Contexts`] opens them on demand, one per ordinal.
//! - [`Allocation<K>`]: one owning allocation type for [`Device`], [`Managed`] and [`Pinned`] memory,
//!   freed on drop after the context has retired queued work; synchronous reads, writes, memsets and
//!   device-to-device copies, and in-place host views where the kind allows them.
//! - [`Stream`] (owned) and [`StreamRef`] (borrowed: [`StreamRef::from_raw`] wraps a caller's
//!   `cudaStream_t`), [`Event`], and the asynchronous copies ([`Context::copy_htod_async`] and friends,
//!   `unsafe`: their pointers are the caller's promise).
//! - [`Context::pointer_info`]: whether an address is device, managed, registered host or unknown memory.
//! - [`Context::compile_module`]: NVRTC compiles a CUDA C source once per process per device, keyed by the
//!   source's hash and the options; [`Module::function`], [`Function::launch`].
//! - [`Blas`]: a cuBLAS handle per context, each call on the caller's stream.
//! - [`Graph`]: CUDA graphs by stream capture ([`Stream::begin_capture`], [`Stream::end_capture`],
//!   [`Graph::launch`]).
//! - [`stats`]: the process-wide count of host synchronisations ([`stats::host_syncs`]).
//!
//! cudarc panics when `libcuda` (or NVRTC, or cuBLAS) is missing or lacks an entry point; this crate probes
//! the library first and catches any such panic, so a machine without a driver gets a typed
//! [`Error::NoDriver`] (`NotSupported`), never a panic. Every error is one [`Error`] carrying an ExecuTorch
//! code (`et_error::HasErrorCode`).
//!
//! ## Examples
//!
//! ```
//! use cuda_rt::{Allocation, Context, Device};
//! use et_error::{ErrorCode, HasErrorCode};
//!
//! match Context::open(0) {
//!     Ok(ctx) => {
//!         let mut buffer = Allocation::<Device>::zeroed(&ctx, 1024)?;
//!         buffer.write(&[7; 1024])?;
//!         assert_eq!(buffer.read()?, vec![7; 1024]);
//!     }
//!     // No driver or no GPU (every CI machine): a typed error, never a panic.
//!     Err(err) => assert_eq!(err.error_code(), ErrorCode::NotSupported),
//! }
//! # Ok::<(), cuda_rt::Error>(())
//! ```
//!
//! ## Feature Flags
//!
//! None. cudarc is used with `driver`, `nvrtc`, `cublas`, `dynamic-loading` and `cuda-13000`: `libcuda`,
//! `libnvrtc` and `libcublas` are opened at run time, so building needs nothing of CUDA.
//!
//! ## Safety
//!
//! This crate is the FFI layer: it holds the workspace's CUDA `unsafe` code, each block with a `// SAFETY:`
//! comment. Functions whose soundness depends on raw addresses the caller supplies (asynchronous copies,
//! kernel launches, cuBLAS products, wrapping a raw stream) are `unsafe fn`s with their contract written
//! down; everything else is safe.
#![deny(missing_docs)]

mod blas;
mod context;
mod driver;
mod error;
mod graph;
pub mod memory;
mod nvrtc;
mod pointer;
pub mod stats;
mod stream;

pub use blas::{Blas, GemmEx, GemmType, Sgemm};
pub use context::{Context, Contexts};
pub use error::{CompileFailure, Error, Result};
pub use graph::Graph;
pub use memory::{Allocation, Device, DevicePtr, IpcHandle, IpcMapping, Managed, MemoryKind, Pinned};
pub use nvrtc::{compile_ptx, Function, LaunchConfig, Module};
pub use pointer::{PointerInfo, PointerKind};
pub use stream::{Event, Stream, StreamRef};
