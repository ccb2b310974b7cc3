//! kv-example's decoder as TensorRT-RTX engines: the example model's network (built from kv-example's own
//! `Config` and `Weights`), its blobs, and the `export_example` program that writes the TensorRT example.
//!
//! It sits next to the example rather than inside the TensorRT runtime: `trt-exec` runs engines, `trt-build`
//! builds them, and this crate describes one model with both. kv-example itself stays free of TensorRT (and
//! of libclang, which trtx's bindings need at build time).
//!
//! ## Examples
//!
//! ```
//! use kv_example::{Config, Weights};
//!
//! let cfg = Config::tiny();
//! let net = kv_example_trt::decoder_network(&cfg, &Weights::generate(&cfg), 1)?;
//! assert_eq!(net.outputs, ["logits", "k_cache_out_0", "v_cache_out_0"]);
//! // Building it needs the TensorRT-RTX library (not a GPU):
//! // `kv_example_trt::decoder_blob(&cfg, &weights, 1, &trt_build::BuildOptions::default())`.
//! # Ok::<(), trt_build::Error>(())
//! ```
//!
//! [`network_from_graph`] translates any `f32` reference graph the same way: the ExecuTorch exporter's
//! `TensorRTBackend` (`python/kv_delegate`) builds its engines with it through the `trt_pack` example
//! (`trt_pack SPEC.json OUT.blob`, the spec of `delegate-pack`).
//!
//! Exporting the TensorRT program (engines for prefill and decode plus `program.toml`):
//! `cargo run -p kv-example-trt --example export_example -- DIR [--big]` (see `examples/export_example.rs`;
//! `cargo xtask export-example --backend tensorrt DIR` installs the library and runs it).
//!
//! ## Feature Flags
//!
//! None. Its dev-dependencies turn on `trt-build`'s `progress` bars for the export example.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod decoder;
mod from_graph;

pub use decoder::{
    arg_order, decoder_blob, decoder_network, k_cache, k_cache_out, reference_order, v_cache, v_cache_out,
};
pub use from_graph::network_from_graph;
