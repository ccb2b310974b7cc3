//! The reference delegate: runs a reference graph ([`ref_graph`]) on the CPU, updating caller-owned KV caches
//! in place.
//!
//! It is the embedded default backend (`ReferenceBackend`, through [`delegate_root`]) and the worked example
//! of a delegate for third parties. The graph it runs is a payload format of its own crate, [`ref_graph`]
//! (typed ops, builder, validation, the `RGRF` encoding, and the graph's aliases as an
//! [`alias_validate::EngineIntrospect`]); this crate is the code that runs it, in two small parts:
//! - [`exec`]: the executor, which allocates all scratch at init and writes cache updates into the caller's
//!   own cache arguments;
//! - [`delegate`]: the [`delegate_abi::Delegate`] implementation: the blob read and bound by the contract every
//!   executor of reference graphs shares ([`ref_graph_contract`]: blob checks, alias validation through
//!   `alias-validate`, a name-based binding plan computed once at init), per-call argument checks, and the
//!   in-place / copy-back contract for aliased outputs.
//!
//! A blob for this delegate is a native blob (`blob-format`) with backend id [`BACKEND_ID`] and payload kind
//! `reference-graph`, whose payload is [`ref_graph::Graph::encode`]'s output.
//!
//! ## Examples
//!
//! Build a one-op graph, wrap it in a blob, and ask the delegate about it:
//!
//! ```
//! use blob_format::model::{Binding, Dim, DType, Header, PayloadKind, Role};
//! use delegate_abi::{Compatibility, Delegate, InitContext};
//! use ref_graph::{ElemType, GraphBuilder};
//! use reference_delegate::{ReferenceDelegate, BACKEND_ID};
//!
//! let mut b = GraphBuilder::new();
//! let x = b.input("x", ElemType::F32, &[1, 2])?;
//! let y = b.add("y", x, x)?;
//! b.output(y)?;
//! let graph = b.finish()?;
//!
//! let binding = |name: &str, role| Binding {
//!     name: name.to_owned(),
//!     role,
//!     dtype: Some(DType::F32),
//!     shape: Some(vec![Dim::Static(1), Dim::Static(2)]),
//!     threaded: true,
//! };
//! let header = Header {
//!     producer: None,
//!     backend_id: BACKEND_ID.to_owned(),
//!     payload_kind: PayloadKind::ReferenceGraph,
//!     bindings: vec![binding("x", Role::Input), binding("y", Role::Output)],
//!     aliases: vec![],
//!     device_id: 0,
//!     hardware_compatible: false,
//!     hardware_target: None,
//!     engine_library_version: None,
//!     engine_metadata: None,
//! };
//! let blob = blob_format::native::to_vec(&header, &graph.encode());
//!
//! let delegate = ReferenceDelegate::new();
//! assert_eq!(delegate.compatibility(&blob), Compatibility::Supported);
//! let handle = delegate.init(InitContext { blob: &blob, compile_specs: &[], runtime_specs: &[] })?;
//! assert_eq!(handle.plan().args().len(), 2);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Writing your own delegate
//!
//! Follow this crate's layout: a library crate (an rlib, so any host can link it next to other plugins) with
//! a type implementing [`delegate_abi::Delegate`] (see [`delegate::ReferenceDelegate`]),
//! `delegate_abi::export_delegate!(@embedded ...)` on it in the crate root for [`delegate_root`], and
//! validation of the blob's aliases with `alias_validate::validate_with_engine` against your engine's
//! [`alias_validate::EngineIntrospect`] (see [`ref_graph::Graph`]'s implementation); plus a thin `cdylib` crate
//! whose `src/lib.rs` is one `delegate_abi::export_delegate!(...)` line, as `plugins/reference-dylib` is for
//! this one (it builds `libreference_delegate_dylib.so`, the file `delegate-host --plugin-dir` loads).
//!
//! ## Feature Flags
//!
//! None.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod delegate;
pub mod exec;

pub use delegate::{ReferenceDelegate, ReferenceHandle};

/// The ExecuTorch backend id this delegate serves.
pub const BACKEND_ID: &str = "ReferenceBackend";

// The root module for embedding (the host links this crate); the dylib's entry symbol is in
// `plugins/reference-dylib`, so any number of plugin libraries link into one binary.
delegate_abi::export_delegate!(@embedded ReferenceDelegate);
