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
use blob_format::model::Role;
use delegate_abi::check::ArgError;
use delegate_abi::{
    Compatibility, Delegate, DelegateError, ExecuteArgs, InitContext, MemoryKind, PluginInfo,
};
use et_error::{ErrorCode, HasErrorCode};
use ref_graph::Graph;
use ref_graph_contract::{Executor, Opened};

use crate::exec::{self, ArgMap, Executor as GraphExecutor};
use crate::BACKEND_ID;

mod args;
mod shims;

/// The binding plan and argument specs every executor of reference graphs shares (`ref-graph-contract`).
pub use ref_graph_contract::{ArgSpec, BindingPlan};
#[allow(deprecated)]
pub use shims::{
    blob_compatibility, header_mismatch, keeps_sequence_state, payload_compatibility, read_blob,
    reference_graph_info,
};

/// The native wire-format versions this delegate reads: those of every executor of reference graphs.
pub const WIRE_FORMAT_VERSIONS: &str = ref_graph_contract::WIRE_FORMAT_VERSIONS;

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
    /// A refusal of the shared reference-graph contract (`ref-graph-contract`) none of the variants above
    /// names, with its code.
    #[error("{0}")]
    Contract(ref_graph_contract::Error),
}

impl From<ref_graph_contract::Error> for Error {
    fn from(err: ref_graph_contract::Error) -> Self {
        use ref_graph_contract::Error as Contract;
        match err {
            Contract::Blob(err) => Error::Blob(err),
            Contract::Incompatible(reason) => Error::Incompatible(reason),
            Contract::Graph(err) => Error::Graph(err),
            Contract::Alias(err) => Error::Alias(err),
            Contract::UserAlias { output, input } => Error::UserAlias { output, input },
            Contract::Binding { name, problem } => Error::Binding { name, problem },
            other => Error::Contract(other),
        }
    }
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
            Error::Contract(err) => err.error_code(),
        }
    }
}

/// One initialised blob: its graph, binding plan and executor (with all scratch memory).
#[derive(Debug)]
pub struct ReferenceHandle {
    graph: Graph,
    plan: BindingPlan,
    executor: GraphExecutor,
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

/// The reference delegate as an executor of reference graphs: its backend and how it names itself in reasons.
const EXECUTOR: Executor = Executor { backend: BACKEND_ID, name: "the reference delegate" };

/// Where the executor finds each graph input and writes each graph output that is not an in-place slot.
fn arg_map(plan: &BindingPlan) -> ArgMap {
    let positions = |keep: fn(&ArgSpec) -> bool| {
        plan.args().iter().enumerate().filter(|(_, a)| keep(a)).map(|(i, a)| (a.tensor, i)).collect()
    };
    ArgMap {
        inputs: positions(|a| a.role == Role::Input),
        outputs: positions(|a| a.role == Role::Output && a.aliases_arg.is_none()),
    }
}

impl ReferenceDelegate {
    fn init_blob(&self, ctx: &InitContext<'_>) -> Result<ReferenceHandle, Error> {
        let Opened { graph, plan, .. } = EXECUTOR.open(ctx)?;
        let executor = GraphExecutor::new(&graph, &arg_map(&plan))?;
        tracing::debug!(
            target: "reference_delegate",
            ops = graph.ops().len(),
            args = plan.args().len(),
            "initialised a reference graph"
        );
        Ok(ReferenceHandle { graph, plan, executor })
    }

    fn execute_checked(&self, handle: &mut ReferenceHandle, args: &mut ExecuteArgs<'_>) -> Result<(), Error> {
        args::check(&handle.plan, args.args())?;
        handle.executor.run(&handle.graph, args)?;
        for (position, spec) in handle.plan.args().iter().enumerate() {
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
        ref_graph_contract::reference_graph_info(
            "reference-delegate",
            env!("CARGO_PKG_VERSION"),
            BACKEND_ID,
            &MEMORY_KINDS,
        )
    }

    fn compatibility(&self, blob: &[u8]) -> Compatibility {
        EXECUTOR.compatibility(blob)
    }

    fn init(&self, ctx: InitContext<'_>) -> Result<ReferenceHandle, DelegateError> {
        Ok(self.init_blob(&ctx)?)
    }

    fn execute(&self, handle: &mut ReferenceHandle, args: &mut ExecuteArgs<'_>) -> Result<(), DelegateError> {
        Ok(self.execute_checked(handle, args)?)
    }

    fn keeps_sequence_state(&self, handle: &ReferenceHandle) -> bool {
        ref_graph_contract::keeps_sequence_state(&handle.graph)
    }
}
