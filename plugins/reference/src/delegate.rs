//! [`ReferenceDelegate`]: the [`Delegate`] implementation, i.e. blob checks, the binding plan, per-call
//! argument checks, and the aliased-output contract.
//!
//! ## The aliased-output contract
//!
//! A `KvCacheUpdate` output aliases its cache input. Per call:
//! 1. every aliased input passes the residency gate ([`alias_validate::residency::DirectAccess::check`], with [`DIRECT_ACCESS`]);
//! 2. the graph runs; the update lands in the **caller's** cache argument (it is the cache's only storage);
//! 3. for each threaded aliased output whose slot is the input's own storage (the host bound it in place),
//!    nothing more happens: zero bytes copied;
//! 4. for each whose slot is other storage (upstream's layout: ExecuTorch planned a separate buffer), the
//!    updated cache is copied into the slot (a "reflect", counted with [`ExecuteArgs::record_reflect`]), so
//!    the caller's buffer-mutation write-back `copy_(buffer, slot)` writes back what the delegate wrote.
//!
//! The work is done on the calling thread; a caller CUDA stream, if given, is ignored: everything is complete
//! when `execute` returns.
//!
//! ## Element types
//!
//! Graphs in `f32`, `f16` and `bf16` run: every tensor is held in its declared type and every op computes in
//! `f32`, rounding its result to the output's type (see [`crate::exec`]). A cache updated in place must be
//! aligned to its element size (4 bytes for `f32`, 2 for `f16` and `bf16`).

use alias_validate::residency::DirectAccess;
use alias_validate::{validate_with_engine, ArgLayout, ValidKind};
use blob_format::model::{Format, PayloadKind, Role};
use blob_format::Blob;
use delegate_abi::check::{check_arg, check_count, ArgError, Expected};
use delegate_abi::{
    Compatibility, DTypeCode, Delegate, DelegateError, ExecuteArgs, InitContext, MemoryKind, PluginInfo,
    TensorArg,
};
use et_error::{ErrorCode, HasErrorCode};

use crate::exec::{self, ArgMap, Executor};
use crate::BACKEND_ID;
use ref_graph::{Graph, TensorId, PAYLOAD_MAGIC, PAYLOAD_VERSION_MAJOR};

/// The native wire-format versions this delegate reads.
pub const WIRE_FORMAT_VERSIONS: &str = ">=1.0, <2";

/// Memory kinds the delegate accepts: all host-visible ones, since it computes on the CPU.
pub const MEMORY_KINDS: [MemoryKind; 3] = [MemoryKind::Host, MemoryKind::Pinned, MemoryKind::Managed];

/// The memory the delegate updates in place: the same host-visible kinds (the residency gate's set).
pub const DIRECT_ACCESS: DirectAccess = DirectAccess::CPU;

/// The reference delegate. Stateless: everything a blob needs lives in its [`ReferenceHandle`].
#[derive(Debug, Default, Clone, Copy)]
pub struct ReferenceDelegate;

/// Why `init` or `execute` failed. Converts to [`DelegateError`] with the code of [`HasErrorCode`] (through
/// delegate-abi's `From<E>` for every such error, so `?` needs no `map_err`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The blob does not parse (its code says whether it is malformed or from an unknown format).
    #[error("{0}")]
    Blob(#[from] blob_format::Error),
    /// The blob is not a native reference-graph blob for `ReferenceBackend`. `DelegateInvalidCompatibility`.
    #[error("{0}")]
    Incompatible(String),
    /// The payload is not a valid graph. `InvalidProgram`.
    #[error("reference graph: {0}")]
    Graph(#[from] ref_graph::Error),
    /// The blob's bindings or aliases disagree with the graph. `InvalidProgram` (or as alias-validate says).
    #[error("{0}")]
    Alias(#[from] alias_validate::Error),
    /// A `user` alias: the graph cannot write into an input it does not update itself. `NotSupported`.
    #[error(
        "user alias '{output}' -> '{input}' is not supported: the reference delegate only runs aliases its graph \
         performs (kv_cache_update); export the alias as a kv_cache_update op"
    )]
    UserAlias {
        /// The alias's output.
        output: String,
        /// The alias's input.
        input: String,
    },
    /// A graph tensor the blob binds but whose shape or type the ABI cannot carry. `InvalidProgram`.
    #[error("binding '{name}': {problem}")]
    Binding {
        /// The binding.
        name: String,
        /// What is wrong.
        problem: String,
    },
    /// The call's arguments do not fit the blob's bindings (count, dtype, shape, size, writability, memory):
    /// delegate-abi's shared argument checks and their error. `InvalidArgument`.
    #[error("{0}")]
    Args(#[from] ArgError),
    /// An aliased input failed the residency gate. `InvalidArgument`.
    #[error("argument {position}: {source}")]
    Residency {
        /// The argument position.
        position: usize,
        /// The gate's error.
        #[source]
        source: alias_validate::Error,
    },
    /// The graph failed while running.
    #[error("{0}")]
    Exec(#[from] exec::Error),
}

impl HasErrorCode for Error {
    fn error_code(&self) -> ErrorCode {
        match self {
            Error::Blob(err) => err.error_code(),
            Error::Incompatible(_) => ErrorCode::DelegateInvalidCompatibility,
            Error::Graph(err) => err.error_code(),
            Error::Alias(err) => err.error_code(),
            Error::UserAlias { .. } => ErrorCode::NotSupported,
            Error::Binding { .. } => ErrorCode::InvalidProgram,
            Error::Args(err) => err.error_code(),
            Error::Residency { source, .. } => source.error_code(),
            Error::Exec(err) => err.error_code(),
        }
    }
}

/// What one argument position must carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgSpec {
    /// The graph tensor it binds (by name, from the blob's binding).
    pub tensor: TensorId,
    /// The tensor's name.
    pub name: String,
    /// Input or output of the graph.
    pub role: Role,
    /// Element type.
    pub dtype: DTypeCode,
    /// Extents.
    pub shape: Vec<i64>,
    /// Size in bytes.
    pub nbytes: u64,
    /// Whether an output aliases it: the graph updates it in place.
    pub aliased_input: bool,
    /// For an aliased output slot, the argument position of the input it aliases.
    pub aliases_arg: Option<usize>,
}

impl ArgSpec {
    /// What a call's argument at this position must be, for delegate-abi's [`check_arg`]: written when it is
    /// an output or an input the graph updates in place.
    pub fn expected(&self) -> Expected<'_> {
        Expected {
            name: &self.name,
            dtype: self.dtype,
            shape: &self.shape,
            nbytes: self.nbytes,
            written: self.role == Role::Output || self.aliased_input,
        }
    }
}

/// The binding plan computed once at `init`: every argument position resolved to a graph tensor by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindingPlan {
    args: Vec<ArgSpec>,
}

impl BindingPlan {
    /// Every argument position, in delegate-argument order.
    pub fn args(&self) -> &[ArgSpec] {
        &self.args
    }

    /// The plan of `blob`'s arguments against `graph`: every position resolved to its graph tensor by the
    /// binding's name, with its dtype, extents and aliasing (the alias table checked against the graph). For
    /// every executor of reference graphs; the reference delegate adds its executor's argument map.
    pub fn new(blob: &Blob<'_>, graph: &Graph) -> Result<BindingPlan, Error> {
        Self::build(blob, graph).map(|(plan, _)| plan)
    }

    fn build(blob: &Blob<'_>, graph: &Graph) -> Result<(BindingPlan, ArgMap), Error> {
        let aliases = validate_with_engine(&blob.header, graph)?;
        for warning in aliases.warnings() {
            tracing::warn!(target: "reference_delegate", "{warning}");
        }
        if let Some(user) = aliases.aliases().iter().find(|a| a.kind == ValidKind::User) {
            return Err(Error::UserAlias { output: user.output.clone(), input: user.input.clone() });
        }
        // Positions, aliased inputs and in-place slots come from the shared layout; this plan adds what only
        // the graph knows: the tensor, its type and its extents.
        let layout = ArgLayout::new(&blob.header, &aliases)?;
        let mut args = Vec::with_capacity(layout.len());
        for slot in layout.slots() {
            let tensor = graph.find(&slot.name).ok_or_else(|| Error::Binding {
                name: slot.name.clone(),
                problem: "no graph tensor has this name".to_owned(),
            })?;
            let decl = graph.tensor(tensor);
            let shape = decl
                .shape
                .iter()
                .map(|&d| i64::try_from(d))
                .collect::<Result<Vec<_>, _>>()
                .ok()
                .filter(|s| s.len() <= delegate_abi::MAX_RANK)
                .ok_or_else(|| Error::Binding {
                    name: slot.name.clone(),
                    problem: format!("shape {:?} cannot be passed as a tensor argument", decl.shape),
                })?;
            args.push(ArgSpec {
                tensor,
                name: slot.name.clone(),
                role: slot.role,
                dtype: DTypeCode::try_from(decl.dtype.dtype())
                    .map_err(|err| Error::Binding { name: slot.name.clone(), problem: err.to_string() })?,
                shape,
                nbytes: decl.nbytes() as u64,
                aliased_input: slot.is_alias_target(),
                aliases_arg: slot.in_place_of(),
            });
        }
        let map = ArgMap {
            inputs: args
                .iter()
                .enumerate()
                .filter(|(_, a)| a.role == Role::Input)
                .map(|(i, a)| (a.tensor, i))
                .collect(),
            outputs: args
                .iter()
                .enumerate()
                .filter(|(_, a)| a.role == Role::Output && a.aliases_arg.is_none())
                .map(|(i, a)| (a.tensor, i))
                .collect(),
        };
        Ok((BindingPlan { args }, map))
    }

    /// Checks every argument of a call against the plan, before anything runs.
    fn check(&self, args: &[TensorArg]) -> Result<(), Error> {
        if args.len() != self.args.len() {
            // `check_count` collects the names (an allocation), so it runs only to word the refusal: a call
            // allocates nothing (tests/hf_forms.rs counts).
            check_count(self.args.iter().map(|a| a.name.as_str()), args.len())?;
        }
        for (position, (spec, arg)) in self.args.iter().zip(args).enumerate() {
            let bad = |problem: String| Error::from(ArgError::arg(position, &spec.name, problem));
            if spec.aliased_input {
                // This delegate computes on the CPU: host-visible memory is the storage it updates in place.
                // The gate also refuses a zero-byte cache, which would make the update land nowhere.
                DIRECT_ACCESS
                    .check(&spec.name, arg.memory().into(), arg.nbytes)
                    .map_err(|source| Error::Residency { position, source })?;
            }
            check_arg(position, &spec.expected(), arg)?;
            if !arg.memory().is_host_visible() {
                return Err(bad(format!(
                    "is {} memory; the reference delegate computes on the CPU and reads host, pinned or \
                     managed memory",
                    arg.memory()
                )));
            }
            let align = spec.dtype.size_bytes();
            if spec.aliased_input && (arg.data as usize) % align != 0 {
                return Err(bad(format!(
                    "is not {align}-byte aligned, which {} caches updated in place need",
                    spec.dtype.name()
                )));
            }
            // A written argument may share storage only with the input its slot aliases, and only exactly.
            if spec.role == Role::Output || spec.aliased_input {
                for (other, other_arg) in args.iter().enumerate().filter(|&(o, _)| o != position) {
                    let in_place_pair =
                        spec.aliases_arg == Some(other) || self.args[other].aliases_arg == Some(position);
                    if in_place_pair && arg.same_storage(other_arg) {
                        continue;
                    }
                    if arg.overlaps(other_arg) {
                        return Err(bad(format!(
                            "shares storage with argument {other} ('{}'); only an aliased output slot may, and \
                             only as exactly its input's storage",
                            self.args[other].name
                        )));
                    }
                }
            }
        }
        Ok(())
    }
}

/// One initialised blob: its graph, binding plan and executor (with all scratch memory).
#[derive(Debug)]
pub struct ReferenceHandle {
    graph: Graph,
    plan: BindingPlan,
    executor: Executor,
}

impl ReferenceHandle {
    /// The decoded graph.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The binding plan.
    pub fn plan(&self) -> &BindingPlan {
        &self.plan
    }
}

/// Why a blob's header does not fit an executor of reference graphs that serves `backend`, or `None` when it
/// does; `delegate` names the executor in the reason ("the reference delegate"). Public so that every executor
/// of this payload (the CUDA delegate runs the same graphs) refuses blobs for the same reasons, in the same words.
pub fn header_mismatch(blob: &Blob<'_>, backend: &str, delegate: &str) -> Option<String> {
    if !matches!(blob.format, Format::Native { major: 1, .. }) {
        return Some(format!(
            "{delegate} reads native {WIRE_FORMAT_VERSIONS} blobs, this one is {}",
            blob.format
        ));
    }
    if blob.header.backend_id != backend {
        return Some(format!("the blob is for backend '{}', not '{backend}'", blob.header.backend_id));
    }
    if blob.header.payload_kind != PayloadKind::ReferenceGraph {
        return Some(format!(
            "the blob's payload is '{}', not '{}'",
            blob.header.payload_kind,
            PayloadKind::ReferenceGraph
        ));
    }
    None
}

/// How the reference delegate names itself in reasons.
const DELEGATE: &str = "the reference delegate";

/// Reads a blob for an executor of reference graphs that serves `backend` (named `delegate` in reasons): the
/// blob parsed, its header fit for it ([`header_mismatch`], else [`Error::Incompatible`]), its payload verified
/// and decoded into a valid graph. Shared with the CUDA delegate, so both refuse a blob at `init` for the same
/// reasons.
pub fn read_blob<'a>(bytes: &'a [u8], backend: &str, delegate: &str) -> Result<(Blob<'a>, Graph), Error> {
    let blob = Blob::parse(bytes)?;
    if let Some(reason) = header_mismatch(&blob, backend, delegate) {
        return Err(Error::Incompatible(reason));
    }
    blob.verify_payload()?;
    let graph = Graph::decode(blob.engine)?;
    Ok((blob, graph))
}

/// Whether an executor of reference graphs that serves `backend` (named `delegate` in reasons) can take
/// `blob`: a native blob for that backend ([`header_mismatch`]), then the executor's own `refuse` reason if it
/// has one, then the payload's major version ([`payload_compatibility`]). Shared with the CUDA delegate, so
/// both answer `compatibility` by one rule.
pub fn blob_compatibility(
    blob: &[u8],
    backend: &str,
    delegate: &str,
    refuse: impl FnOnce(&Blob<'_>) -> Option<String>,
) -> Compatibility {
    let parsed = match Blob::parse(blob) {
        Ok(parsed) => parsed,
        Err(err) => return Compatibility::Unsupported { reason: err.to_string() },
    };
    if let Some(reason) = header_mismatch(&parsed, backend, delegate).or_else(|| refuse(&parsed)) {
        return Compatibility::Unsupported { reason };
    }
    payload_compatibility(parsed.engine)
}

/// The self-description of an executor of reference graphs: `name` at `version` serving `backend`, native
/// blobs of [`WIRE_FORMAT_VERSIONS`], arguments in `memory_kinds`, aliased outputs bound in place. Shared with
/// the CUDA delegate.
pub fn reference_graph_info(
    name: &str,
    version: &str,
    backend: &str,
    memory_kinds: &[MemoryKind],
) -> PluginInfo {
    PluginInfo::new(name, version)
        .with_backend(backend)
        .with_wire_format("native", WIRE_FORMAT_VERSIONS)
        .with_memory_kinds(memory_kinds.iter().copied())
        .with_binds_aliases_in_place(true)
        // Updates the caller's memory in place. Not `rewind_fork_without_reinit`: that is a statement about
        // every instance, and an instance of a graph with delegate-owned `state` (payload 1.2) keeps its
        // caches itself; each instance answers for its own graph (`keeps_sequence_state`).
        .with_capabilities(
            delegate_abi::Capabilities::default().with_in_place_memory_kinds(memory_kinds.iter().copied()),
        )
}

/// Whether an executor of `graph` keeps sequence state of its own: its delegate-owned `state` (payload 1.2),
/// the caches it holds across calls, which no rewind, restored cache or fork of the caller's caches carries.
/// The answer of [`Delegate::keeps_sequence_state`] for every executor of reference graphs (shared with the
/// CUDA delegate).
pub fn keeps_sequence_state(graph: &Graph) -> bool {
    !graph.state().is_empty()
}

/// Whether `payload` is a reference graph of a major version this build reads, from its first six bytes.
pub fn payload_compatibility(payload: &[u8]) -> Compatibility {
    match payload.get(..6) {
        Some([a, b, c, d, lo, hi]) if [*a, *b, *c, *d] == PAYLOAD_MAGIC => {
            let major = u16::from_le_bytes([*lo, *hi]);
            if major == PAYLOAD_VERSION_MAJOR {
                Compatibility::Supported
            } else {
                Compatibility::Unsupported {
                    reason: format!(
                        "reference-graph payload version {major}.x; this build reads {PAYLOAD_VERSION_MAJOR}.x"
                    ),
                }
            }
        }
        _ => Compatibility::Unsupported { reason: "the payload is not a reference graph".to_owned() },
    }
}

impl ReferenceDelegate {
    fn init_blob(&self, bytes: &[u8]) -> Result<ReferenceHandle, Error> {
        let (blob, graph) = read_blob(bytes, BACKEND_ID, DELEGATE)?;
        let (plan, map) = BindingPlan::build(&blob, &graph)?;
        let executor = Executor::new(&graph, &map)?;
        tracing::debug!(
            target: "reference_delegate",
            ops = graph.ops().len(),
            args = plan.args.len(),
            "initialised a reference graph"
        );
        Ok(ReferenceHandle { graph, plan, executor })
    }

    fn execute_checked(&self, handle: &mut ReferenceHandle, args: &mut ExecuteArgs<'_>) -> Result<(), Error> {
        handle.plan.check(args.args())?;
        handle.executor.run(&handle.graph, args)?;
        for (position, spec) in handle.plan.args.iter().enumerate() {
            let Some(input) = spec.aliases_arg else { continue };
            let same = args
                .arg(input)
                .and_then(|i| Ok(i.same_storage(args.arg(position)?)))
                .map_err(exec::Error::from)?;
            if same {
                continue; // bound in place: the slot already holds the update
            }
            let ([src], [dst]) = args.borrow([input], [position]).map_err(exec::Error::from)?;
            dst.copy_from_slice(src);
            args.record_reflect(spec.nbytes);
        }
        Ok(())
    }
}

impl Delegate for ReferenceDelegate {
    type Handle = ReferenceHandle;

    fn new() -> Self {
        ReferenceDelegate
    }

    fn info() -> PluginInfo {
        reference_graph_info("reference-delegate", env!("CARGO_PKG_VERSION"), BACKEND_ID, &MEMORY_KINDS)
    }

    fn compatibility(&self, blob: &[u8]) -> Compatibility {
        blob_compatibility(blob, BACKEND_ID, DELEGATE, |_| None)
    }

    fn init(&self, ctx: InitContext<'_>) -> Result<ReferenceHandle, DelegateError> {
        for spec in ctx.compile_specs.iter().chain(ctx.runtime_specs) {
            tracing::debug!(target: "reference_delegate", key = spec.key, "ignoring a spec this delegate has no use for");
        }
        Ok(self.init_blob(ctx.blob)?)
    }

    fn execute(&self, handle: &mut ReferenceHandle, args: &mut ExecuteArgs<'_>) -> Result<(), DelegateError> {
        Ok(self.execute_checked(handle, args)?)
    }

    fn keeps_sequence_state(&self, handle: &ReferenceHandle) -> bool {
        keeps_sequence_state(&handle.graph)
    }
}
