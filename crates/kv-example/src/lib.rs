//! The example KV-cache decoder: its config and deterministic weights, its export as reference-graph blobs
//! plus a program manifest, and an independent `f64` oracle with the acceptance checks.
//!
//! The model is upstream's test model (UPSTREAM.md section 6) generalised to several layers: token and
//! position embeddings, per layer an RMS norm, Q/K/V projections, an in-place update of caller-owned K and V
//! caches at `input_pos`, causal attention over cache rows `0..=pos`, an output projection with a residual,
//! and a final RMS norm and projection to logits. See [`model`] for the graph and [`oracle`] for the
//! independent computation.
//!
//! Both graphs also output `next_token`, the argmax of the last logits row (so a host can feed the token
//! back without reading the logits). A [`Config`] computes in `f32` or `f16` ([`Config::dtype`]); the
//! presets of the GPU benchmarks are [`Config::bench`]. [`export::program`] writes a program for an
//! [`export::Target`]: the reference or the CUDA backend, and the memory kind of buffers, inputs and outputs.
//!
//! The crate depends on formats only: the graph is a [`ref_graph::Graph`] and the manifest a
//! [`program_manifest::ProgramSpec`]. Running the exported blobs is a host's or a delegate's business (the
//! reference delegate's tests run this example end to end through its `Delegate` impl and the plugin ABI).
//!
//! ## Examples
//!
//! ```
//! use kv_example::{Config, Oracle};
//!
//! let cfg = Config::tiny();
//! let mut oracle = Oracle::new(&cfg);
//! let prompt_logits = oracle.prefill(&cfg.prompt)?;
//! assert_eq!(prompt_logits.len(), 4);
//! let next = oracle.decode(5, cfg.prompt.len())?;
//! assert_eq!(next.len(), cfg.vocab);
//!
//! let dir = std::env::temp_dir().join(format!("kv-example-doctest-{}", std::process::id()));
//! let program = kv_example::export::reference(&cfg, &dir)?;
//! assert!(program.manifest_path.ends_with("program.toml"));
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Feature Flags
//!
//! None.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod check;
mod config;
mod config_json;
pub mod export;
pub mod model;
pub mod oracle;
mod weights;

pub use check::{argmax, Report, Verifier};
pub use config::{BenchConfig, Config, ConfigError};
pub use export::{Backend, ExportError, ExportedProgram, Target};
pub use oracle::{Oracle, OracleError};
pub use weights::{LayerWeights, Weights};
