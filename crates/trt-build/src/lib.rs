//! Builds TensorRT-RTX engines ahead of time, on CPU, from a small network description, and wraps them in
//! blobs whose alias table is what TensorRT reported: the build side of TensorRT (the run side is
//! `trt-exec`, whose library loader, introspection types and log sink it shares).
//!
//! - [`NetworkDesc`]: inputs, constants, matmul, element-wise, reduce-mean, unary, softmax, shuffle, gather,
//!   cast and `IKVCacheUpdateLayer`, in topological order.
//! - [`build_engine`]: TensorRT-RTX builds it without a GPU; the [`BuiltEngine`] carries the plan plus the
//!   I/O and KV-cache aliases TensorRT reported for the network.
//! - [`export`]: blob headers binding engine tensors by name in the caller's argument order, native blobs
//!   and upstream TR02 blobs.
//!
//! A delegate that only runs engines links `trt-exec`, not this crate.
//!
//! ## Examples
//!
//! ```no_run
//! use blob_format::model::DType;
//! use trt_build::{build_engine, BuildOptions, NetworkDesc, Node, Op};
//!
//! // One KV cache updated in place at `write_idx`: TensorRT reports `k_cache_out` as aliasing `k_cache`.
//! let input = |name: &str, dtype, shape: &[i64]| Node {
//!     name: name.into(),
//!     op: Op::Input { dtype, shape: shape.to_vec() },
//! };
//! let net = NetworkDesc {
//!     nodes: vec![
//!         input("k_cache", DType::F32, &[1, 2, 16, 8]),
//!         input("update", DType::F32, &[1, 2, 1, 8]),
//!         input("write_idx", DType::I32, &[1]),
//!         Node {
//!             name: "k_cache_out".into(),
//!             op: Op::KvCacheUpdate {
//!                 cache: "k_cache".into(),
//!                 update: "update".into(),
//!                 write_indices: "write_idx".into(),
//!             },
//!         },
//!     ],
//!     outputs: vec!["k_cache_out".into()],
//! };
//! let built = build_engine(&net, &BuildOptions::default())?; // needs KV_TENSORRT_LIB, not a GPU
//! let (header, blob) = trt_build::export::native_blob(&built, &["k_cache", "update", "write_idx", "k_cache_out"])?;
//! assert_eq!(header.aliases.len(), 1);
//! # Ok::<(), trt_build::Error>(())
//! ```
//!
//! ## Feature Flags
//!
//! - `progress`: an indicatif progress bar per build phase TensorRT reports ([`BuildOptions`]'s `progress`
//!   field). Off by default.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod error;
pub mod export;
mod layers;
mod network;
pub mod samples;

pub use error::{Error, Result};
pub use network::{build_engine, BinaryOp, BuildOptions, BuiltEngine, NetworkDesc, Node, Op, UnaryOp};
