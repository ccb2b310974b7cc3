//! The in-memory model every wire format reads into and writes from.
//!
//! The model is format-independent: a TR01/TR02 blob and a native blob of any version parse to the same
//! [`Header`]. Metadata is owned (it is small); the engine payload is borrowed by [`crate::Blob`].

use std::fmt;

/// Which wire format a blob was read from, with its version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// Upstream Torch-TensorRT 2.13+ layout with magic `TR01` (no aliased I/O).
    Tr01,
    /// Upstream Torch-TensorRT 2.14 layout with magic `TR02` (aliased I/O present).
    Tr02,
    /// Our native format at the given version.
    Native {
        /// Format major version: a reader refuses a newer major.
        major: u16,
        /// Format minor version: a newer minor reads, its unknown fields ignored.
        minor: u16,
    },
}

impl Format {
    /// The short name used by `delegate-host inspect --json`: `"tr01"`, `"tr02"` or `"native"`.
    pub fn name(self) -> &'static str {
        match self {
            Format::Tr01 => "tr01",
            Format::Tr02 => "tr02",
            Format::Native { .. } => "native",
        }
    }

    /// The version as text: `"1"` for TR01, `"2"` for TR02, `"MAJOR.MINOR"` for native.
    pub fn version(self) -> String {
        match self {
            Format::Tr01 => "1".to_owned(),
            Format::Tr02 => "2".to_owned(),
            Format::Native { major, minor } => format!("{major}.{minor}"),
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.name(), self.version())
    }
}

/// Whether an engine tensor is read or written by the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// The engine reads it.
    Input,
    /// The engine writes it.
    Output,
}

impl Role {
    /// `"input"` or `"output"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Input => "input",
            Role::Output => "output",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Element type of a tensor: the workspace's one dtype vocabulary, [`et_error::DType`].
pub use et_error::DType;

/// One dimension of a declared shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dim {
    /// A fixed extent.
    Static(u64),
    /// Decided per call (within the engine's optimisation profile).
    Dynamic,
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Static(n) => write!(f, "{n}"),
            Dim::Dynamic => f.write_str("?"),
        }
    }
}

/// Formats a shape as `[2, ?, 16]`.
pub struct DisplayShape<'a>(pub &'a [Dim]);

impl fmt::Display for DisplayShape<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, dim) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{dim}")?;
        }
        f.write_str("]")
    }
}

/// What one delegate argument position binds: an engine tensor, named.
///
/// Bindings are listed in delegate-argument order; a binding binds by [`Binding::name`], never by position
/// in the engine (UPSTREAM.md section 3, the output-order hazard).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Binding {
    /// The engine tensor's name.
    pub name: String,
    /// Input or output of the engine.
    pub role: Role,
    /// Element type, when the writer recorded it (upstream blobs never do).
    pub dtype: Option<DType>,
    /// Declared shape, when the writer recorded it (upstream blobs never do).
    pub shape: Option<Vec<Dim>>,
    /// Whether this engine tensor is threaded as a delegate argument at all. An unthreaded output (e.g. an
    /// aliased output whose cache is not a registered buffer) has no argument position: the delegate binds it
    /// to its aliased input's storage and the caller passes nothing for it.
    pub threaded: bool,
}

impl Binding {
    /// A threaded binding with unknown dtype and shape, as upstream blobs record them.
    pub fn untyped(name: impl Into<String>, role: Role) -> Binding {
        Binding { name: name.into(), role, dtype: None, shape: None, threaded: true }
    }
}

/// Why an output is aliased onto an input.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum AliasKind {
    /// `kv_cache_update`: the engine itself writes the input in place (TensorRT's `IKVCacheUpdateLayer`). The
    /// default when a blob leaves the kind out.
    #[default]
    KvCacheUpdate,
    /// `user`: the exporter declared the alias; the engine cannot see it.
    User,
    /// A kind this build does not know, kept verbatim so validation can refuse it by name.
    Unknown(String),
}

impl AliasKind {
    /// The wire spelling of the default kind.
    pub const KV_CACHE_UPDATE: &'static str = "kv_cache_update";
    /// The wire spelling of the user kind.
    pub const USER: &'static str = "user";

    /// Reads a wire spelling; anything unrecognised is kept as [`AliasKind::Unknown`].
    pub fn from_wire(kind: &str) -> AliasKind {
        match kind {
            Self::KV_CACHE_UPDATE => AliasKind::KvCacheUpdate,
            Self::USER => AliasKind::User,
            other => AliasKind::Unknown(other.to_owned()),
        }
    }

    /// The wire spelling.
    pub fn as_str(&self) -> &str {
        match self {
            AliasKind::KvCacheUpdate => Self::KV_CACHE_UPDATE,
            AliasKind::User => Self::USER,
            AliasKind::Unknown(kind) => kind,
        }
    }
}

impl fmt::Display for AliasKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An output that writes in place into an input's storage.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Alias {
    /// The output tensor's name.
    pub output: String,
    /// The input tensor's name whose storage the output aliases.
    pub input: String,
    /// Why they alias.
    pub kind: AliasKind,
}

/// The program that wrote a blob.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Producer {
    /// Tool name, e.g. `"kv-delegate xtask"` or `"torch_tensorrt"`.
    pub name: String,
    /// Tool version.
    pub version: String,
}

/// What the engine payload is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PayloadKind {
    /// A serialized TensorRT or TensorRT-RTX plan (`ICudaEngine`). Upstream blobs always carry one.
    TensorRtPlan,
    /// The reference delegate's typed op graph.
    ReferenceGraph,
    /// A kind this build does not know, kept verbatim: also the route for a third-party delegate's own payload.
    /// Such a delegate writes its own kind string (e.g. `"acme-graph"`; anything but the spellings above),
    /// which reads back as `Other("acme-graph")`; its `compatibility` and `init` check the string and refuse
    /// other kinds with a reason. The format never interprets the payload of any kind.
    Other(String),
}

impl PayloadKind {
    /// The wire spelling: `"tensorrt-plan"`, `"reference-graph"`, or the unknown text.
    pub fn as_str(&self) -> &str {
        match self {
            PayloadKind::TensorRtPlan => "tensorrt-plan",
            PayloadKind::ReferenceGraph => "reference-graph",
            PayloadKind::Other(kind) => kind,
        }
    }

    /// Reads a wire spelling.
    pub fn from_wire(kind: &str) -> PayloadKind {
        match kind {
            "tensorrt-plan" => PayloadKind::TensorRtPlan,
            "reference-graph" => PayloadKind::ReferenceGraph,
            other => PayloadKind::Other(other.to_owned()),
        }
    }
}

impl fmt::Display for PayloadKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The backend id of Torch-TensorRT's delegate; every upstream blob implies it.
pub const TENSORRT_BACKEND: &str = "TensorRTBackend";

/// Everything a blob says besides the engine bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Header {
    /// The program that wrote the blob, when recorded (upstream blobs do not record it).
    pub producer: Option<Producer>,
    /// The ExecuTorch backend id the blob is for, e.g. [`TENSORRT_BACKEND`].
    pub backend_id: String,
    /// What the engine payload is.
    pub payload_kind: PayloadKind,
    /// Engine tensors in delegate-argument order (threaded ones; unthreaded ones keep their place in the list
    /// but take no argument position).
    pub bindings: Vec<Binding>,
    /// The alias table, as written (defaults resolved, unknown kinds kept).
    pub aliases: Vec<Alias>,
    /// CUDA device ordinal the engine was built for.
    pub device_id: i32,
    /// Upstream `hardware_compatible`: the plan was built for hardware compatibility (Ampere+).
    pub hardware_compatible: bool,
    /// Hardware target (upstream `target_platform`), when known; empty is normalised to `None`.
    pub hardware_target: Option<String>,
    /// Version of the engine library that built the payload, e.g. `"TensorRT-RTX 1.7.1"`, when known.
    pub engine_library_version: Option<String>,
    /// Upstream `serialized_metadata`, an opaque string carried verbatim; empty is normalised to `None`.
    pub engine_metadata: Option<String>,
}

impl Header {
    /// A header for `backend_id` with these bindings (in delegate-argument order) and aliases, and every other
    /// field at its default: no producer, device 0, not hardware-compatible, no target, library version or
    /// engine metadata. Set those fields afterwards when they matter.
    pub fn new(
        backend_id: impl Into<String>,
        payload_kind: PayloadKind,
        bindings: Vec<Binding>,
        aliases: Vec<Alias>,
    ) -> Header {
        Header {
            producer: None,
            backend_id: backend_id.into(),
            payload_kind,
            bindings,
            aliases,
            device_id: 0,
            hardware_compatible: false,
            hardware_target: None,
            engine_library_version: None,
            engine_metadata: None,
        }
    }

    /// Threaded bindings of the given role, in delegate-argument order.
    pub fn threaded(&self, role: Role) -> impl Iterator<Item = &Binding> + '_ {
        self.bindings.iter().filter(move |b| b.threaded && b.role == role)
    }

    /// The binding named `name`, if any.
    pub fn binding(&self, name: &str) -> Option<&Binding> {
        self.bindings.iter().find(|b| b.name == name)
    }
}
