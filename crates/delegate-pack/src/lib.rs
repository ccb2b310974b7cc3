//! Writes native delegate blobs from a graph description: the seam between exporters written in other
//! languages and our wire format.
//!
//! The ExecuTorch partitioner (`python/kv_delegate`) lowers a delegated subgraph to a reference graph, but
//! the blob it must produce is ours: a native header that names, in the delegate's argument order, which graph
//! tensor each argument binds, plus the `RGRF` payload. Rather than re-implement both encodings in Python, the
//! exporter writes a [`Spec`] (JSON) and a constants file and runs `delegate-pack SPEC.json OUT.blob`; this
//! crate checks the graph ([`ref_graph::Graph::from_description_extents`]: every constant's extent in the
//! constants file, its bytes left there), derives the alias table from it (every
//! `kv_cache_update` or `assign` output that is a delegate output aliases the input it writes in place, declared
//! with the engine's own in-place kind `kv_cache_update`), checks the header against the
//! graph exactly as a delegate's `init` will ([`alias_validate::validate_with_engine`]), and writes the blob,
//! copying the constants from their file into it a chunk at a time ([`pack_file`]): a model's weights are never
//! in the packer's memory, so that exporting a model takes no more memory than the exporter's own.
//! A spec that would give a blob some delegate refuses is refused here, naming what is wrong.
//!
//! ## The spec
//!
//! ```json
//! {
//!   "backend": "ReferenceBackend",
//!   "graph": { "tensors": [...], "inputs": [...], "outputs": [...], "constants": [...], "ops": [...] },
//!   "constants_file": "constants.bin",
//!   "bindings": [{"name": "tokens", "role": "input"}, {"name": "logits", "role": "output"}],
//!   "producer": {"name": "kv_delegate", "version": "0.1.0"}
//! }
//! ```
//!
//! - `backend`: a backend that runs reference-graph payloads: `ReferenceBackend` or `CudaBackend`.
//! - `graph`: the payload's JSON description, as `ref-graph` documents it (its constants' offsets point into
//!   `constants_file`, a path relative to the spec's directory; may be omitted when there are no constants).
//! - `bindings`: one per delegate argument, in the order the delegate receives them (ExecuTorch's order,
//!   taken from the lowered program); dtype and shape come from the graph. Every graph input and output is
//!   bound exactly once; delegate-owned `state` is never bound.
//! - `producer`: recorded in the header.
//!
//! ## Examples
//!
//! ```
//! use delegate_pack::{pack, Spec};
//!
//! let spec: Spec = serde_json::from_str(r#"{
//!     "backend": "ReferenceBackend",
//!     "graph": {
//!         "tensors": [
//!             {"name": "x", "dtype": "f32", "shape": [1, 2]},
//!             {"name": "y", "dtype": "f32", "shape": [1, 2]},
//!             {"name": "sum", "dtype": "f32", "shape": [1, 2]}
//!         ],
//!         "inputs": ["x", "y"], "outputs": ["sum"], "constants": [],
//!         "ops": [{"op": "add", "a": "x", "b": "y", "out": "sum"}]
//!     },
//!     "bindings": [{"name": "y", "role": "input"}, {"name": "x", "role": "input"},
//!                  {"name": "sum", "role": "output"}],
//!     "producer": {"name": "doc", "version": "0"}
//! }"#)?;
//! let blob = pack(&spec, &[])?;
//! let read = blob_format::Blob::parse(&blob)?;
//! let names: Vec<&str> = read.header.bindings.iter().map(|b| b.name.as_str()).collect();
//! assert_eq!(names, ["y", "x", "sum"]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Feature Flags
//!
//! None.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod packing;

use std::collections::HashSet;
use std::path::PathBuf;

use blob_format::model::{Alias, AliasKind, Binding, Dim, Header, PayloadKind, Producer, Role};
use et_error::{ErrorCode, HasErrorCode};
use ref_graph::{Graph, TensorId};
use serde::Deserialize;

pub use packing::pack_file;

/// Backends whose payload is a reference graph, the only payload this packer writes.
pub const BACKENDS: [&str; 2] = ["ReferenceBackend", "CudaBackend"];

/// What an exporter asks for (see the crate docs for the JSON).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    /// The backend id the blob is for.
    pub backend: String,
    /// The reference graph's JSON description.
    pub graph: serde_json::Value,
    /// The constants section, relative to the spec's directory.
    #[serde(default)]
    pub constants_file: Option<PathBuf>,
    /// The delegate's arguments, in order.
    pub bindings: Vec<SpecBinding>,
    /// Who wrote the blob.
    pub producer: SpecProducer,
}

/// One delegate argument.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpecBinding {
    /// The graph tensor it binds.
    pub name: String,
    /// `input` or `output`.
    pub role: SpecRole,
}

/// A binding's direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SpecRole {
    /// A graph input.
    Input,
    /// A graph output.
    Output,
}

/// The producer recorded in the header.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpecProducer {
    /// Exporter name.
    pub name: String,
    /// Exporter version.
    pub version: String,
}

/// Why no blob was written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A constant could not be copied from the constants file into the blob: the file is shorter than when
    /// the spec was checked, or reading it failed.
    #[error("{path}: {source}")]
    Constants {
        /// The constants file.
        path: PathBuf,
        /// The constant and the I/O error.
        source: ref_graph::StreamError,
    },
    /// The spec is not JSON of the documented shape.
    #[error("spec {path}: {source}")]
    Spec {
        /// The spec file.
        path: PathBuf,
        /// The JSON error, with line and column.
        source: serde_json::Error,
    },
    /// The backend does not run reference-graph payloads.
    #[error("backend '{0}' does not run reference-graph payloads (this packer writes blobs for: {list})", list = BACKENDS.join(", "))]
    Backend(String),
    /// The graph is invalid.
    #[error("the graph: {0}")]
    Graph(#[from] ref_graph::Error),
    /// A binding names no graph tensor of its role, binds one twice, or a graph tensor is left unbound.
    #[error("binding {index} ('{name}'): {problem}")]
    Binding {
        /// Position in the spec's `bindings` (the delegate argument), or the number of bindings for an
        /// unbound graph tensor.
        index: usize,
        /// The tensor.
        name: String,
        /// What is wrong.
        problem: String,
    },
    /// The header is too large for the native format.
    #[error(transparent)]
    Write(#[from] blob_format::WriteError),
    /// The header disagrees with the graph by the rules every delegate's `init` applies.
    #[error("the blob would be refused at init: {0}")]
    Validate(#[from] alias_validate::Error),
}

impl HasErrorCode for Error {
    fn error_code(&self) -> ErrorCode {
        match self {
            Error::Io { .. } => ErrorCode::AccessFailed,
            Error::Constants { source, .. } => source.error_code(),
            Error::Spec { .. } | Error::Binding { .. } | Error::Backend(_) => ErrorCode::InvalidArgument,
            Error::Graph(err) => err.error_code(),
            Error::Write(err) => err.error_code(),
            Error::Validate(err) => err.error_code(),
        }
    }
}

/// The native blob for `spec`, whose graph's constant offsets point into `constants`, built in memory
/// ([`pack_file`] writes the same bytes without holding the constants).
pub fn pack(spec: &Spec, constants: &[u8]) -> Result<Vec<u8>, Error> {
    let graph = Graph::from_description(&description(spec)?, constants)?;
    let header = spec_header(spec, &graph)?;
    Ok(blob_format::native::to_vec(&header, &graph.encode()))
}

/// The graph description of `spec`, for a backend this packer writes.
fn description(spec: &Spec) -> Result<Vec<u8>, Error> {
    if !BACKENDS.contains(&spec.backend.as_str()) {
        return Err(Error::Backend(spec.backend.clone()));
    }
    serde_json::to_vec(&spec.graph).map_err(|source| Error::Spec { path: "(graph)".into(), source })
}

/// The header of `graph` with `spec`'s bindings and producer, checked against the graph.
fn spec_header<C>(spec: &Spec, graph: &Graph<C>) -> Result<Header, Error> {
    let bindings = bindings(spec, graph)?;
    let producer = Producer { name: spec.producer.name.clone(), version: spec.producer.version.clone() };
    header(graph, &spec.backend, Some(producer), bindings)
}

/// The native blob of `graph`, already built, for `backend`: its inputs then its outputs, in the graph's
/// order, as the delegate's arguments; aliases and checks as [`pack`]'s (what tests and Rust exporters that
/// build a [`Graph`] with `ref_graph::GraphBuilder` need, without a spec).
///
/// # Errors
/// [`Error::Backend`] for a backend that does not run reference-graph payloads; [`Error::Validate`] and
/// [`Error::Write`] as [`pack`].
pub fn pack_graph(graph: &Graph, backend: &str) -> Result<Vec<u8>, Error> {
    if !BACKENDS.contains(&backend) {
        return Err(Error::Backend(backend.to_owned()));
    }
    let inputs = graph.inputs().iter().map(|&id| typed_binding(graph, id, Role::Input));
    let bindings =
        inputs.chain(graph.outputs().iter().map(|&id| typed_binding(graph, id, Role::Output))).collect();
    let header = header(graph, backend, None, bindings)?;
    Ok(blob_format::native::to_vec(&header, &graph.encode()))
}

/// A threaded binding of graph tensor `id`, typed from the graph.
fn typed_binding<C>(graph: &Graph<C>, id: TensorId, role: Role) -> Binding {
    let decl = graph.tensor(id);
    Binding {
        name: decl.name.clone(),
        role,
        dtype: Some(decl.dtype.dtype()),
        shape: Some(decl.shape.iter().map(|&d| Dim::Static(d)).collect()),
        threaded: true,
    }
}

/// The header of `graph` with `bindings`: every in-place pair whose output is bound declared as an alias, the
/// payload version named, checked against the graph by the rules every delegate's `init` applies.
fn header<C>(
    graph: &Graph<C>,
    backend: &str,
    producer: Option<Producer>,
    bindings: Vec<Binding>,
) -> Result<Header, Error> {
    let bound: HashSet<&str> = bindings.iter().map(|b| b.name.as_str()).collect();
    let aliases = graph
        .in_place_pairs()
        .filter(|(out, _)| bound.contains(graph.tensor(*out).name.as_str()))
        .map(|(out, cache)| Alias {
            output: graph.tensor(out).name.clone(),
            input: graph.tensor(cache).name.clone(),
            kind: AliasKind::KvCacheUpdate,
        })
        .collect();
    let (major, minor) = graph.payload_version();
    let header = Header {
        producer,
        backend_id: backend.to_owned(),
        payload_kind: PayloadKind::ReferenceGraph,
        bindings,
        aliases,
        device_id: 0,
        hardware_compatible: false,
        hardware_target: None,
        engine_library_version: Some(format!("ref-graph payload {major}.{minor}")),
        engine_metadata: None,
    };
    alias_validate::validate_with_engine(&header, graph)?;
    blob_format::native::check_header(&header)?;
    Ok(header)
}

/// The header's bindings in the spec's order, typed from the graph; every graph input and output bound once.
fn bindings<C>(spec: &Spec, graph: &Graph<C>) -> Result<Vec<Binding>, Error> {
    let mut seen = HashSet::with_capacity(spec.bindings.len());
    let mut out = Vec::with_capacity(spec.bindings.len());
    for (index, binding) in spec.bindings.iter().enumerate() {
        let problem = |problem: String| Error::Binding { index, name: binding.name.clone(), problem };
        let (role, list, what) = match binding.role {
            SpecRole::Input => (Role::Input, graph.inputs(), "graph input"),
            SpecRole::Output => (Role::Output, graph.outputs(), "graph output"),
        };
        let id = graph.find(&binding.name).filter(|id| list.contains(id)).ok_or_else(|| {
            problem(match graph.find(&binding.name) {
                Some(id) if graph.is_state(id) => {
                    "is delegate-owned state, which is never a delegate argument".to_owned()
                }
                Some(_) => format!("is a tensor of the graph but not a {what}"),
                None => "is not a tensor of the graph".to_owned(),
            })
        })?;
        if !seen.insert(id) {
            return Err(problem("is bound twice".to_owned()));
        }
        out.push(typed_binding(graph, id, role));
    }
    let unbound = graph.inputs().iter().chain(graph.outputs()).find(|id: &&TensorId| !seen.contains(*id));
    if let Some(&id) = unbound {
        return Err(Error::Binding {
            index: spec.bindings.len(),
            name: graph.tensor(id).name.clone(),
            problem: "is a graph input or output that no binding names: every one is a delegate argument"
                .to_owned(),
        });
    }
    Ok(out)
}
