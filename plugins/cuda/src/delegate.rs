//! [`CudaDelegate`]: the [`Delegate`] implementation: blob checks, the binding plan (each argument position
//! resolved to its graph tensor by name, once), per-call argument checks, and the aliased-output contract.
//!
//! ## The aliased-output contract
//!
//! A `KvCacheUpdate` output aliases its cache input. Per call:
//! 1. every aliased input passes the residency gate on the **real pointer**: the driver
//!    (`cuPointerGetAttributes`) must report device or managed memory on the blob's device (host and pinned
//!    caches are refused with upstream's message). The query runs when an argument's address changes, not
//!    every step;
//! 2. the kernels write the update into the caller's cache, in place: zero bytes copied;
//! 3. an aliased output bound to separate storage (a copy-back host) gets the updated cache copied into it,
//!    device to device, on the same stream, counted with [`ExecuteArgs::record_reflect`].
//!
//! ## Streams
//!
//! With a caller stream, `execute` queues its kernels on it and returns: no stream or context
//! synchronisation on the decode path (host-memory inputs and outputs are copied on the stream; a copy into
//! pageable host memory is synchronous by CUDA's rules, so keep decode I/O on the device). Without one, the
//! instance's own stream runs the call and `execute` waits for it.
#![forbid(unsafe_code)]

use delegate_abi::check::{check_arg, check_count, ArgError};
use delegate_abi::{
    Compatibility, Delegate, DelegateError, ExecuteArgs, InitContext, MemoryKind, PluginInfo, TensorArg,
};
use et_error::{ErrorCode, HasErrorCode};
use ref_graph::TensorId;
use ref_graph_contract::{keeps_sequence_state, reference_graph_info, ArgSpec, Executor, Opened};

use crate::engine::Engine;
use crate::plan::{Plan, Unsupported};
use crate::BACKEND_ID;

/// The native wire-format versions this delegate reads: those of every executor of reference graphs, whose
/// header checks it shares (`ref-graph-contract`).
pub const WIRE_FORMAT_VERSIONS: &str = ref_graph_contract::WIRE_FORMAT_VERSIONS;

/// Memory kinds the delegate accepts. Caches must be device or managed memory (the residency gate); host
/// and pinned inputs and outputs are staged through device buffers.
pub const MEMORY_KINDS: [MemoryKind; 4] =
    [MemoryKind::Device, MemoryKind::Managed, MemoryKind::Host, MemoryKind::Pinned];

/// The CUDA delegate. Stateless: each blob's device state lives in its [`CudaHandle`].
#[derive(Debug, Default, Clone, Copy)]
pub struct CudaDelegate;

/// Why `init` or `execute` failed; converts to [`DelegateError`] with its [`HasErrorCode`] code.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The blob does not parse, is not a native reference-graph blob for `CudaBackend`
    /// (`DelegateInvalidCompatibility`), its payload is not a valid graph (`InvalidProgram`), or its bindings
    /// or aliases do not fit the graph: the blob reading and binding plan every executor of reference graphs
    /// shares (`ref-graph-contract`).
    #[error("{0}")]
    Plan(#[from] ref_graph_contract::Error),
    /// A valid graph this delegate cannot run. `NotSupported`.
    #[error("{0}")]
    Unsupported(#[from] Unsupported),
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
    /// CUDA refused something (no driver, no device, out of memory, a failed launch).
    #[error("{action}: {source}")]
    Cuda {
        /// What the delegate was doing.
        action: String,
        /// CUDA's error.
        #[source]
        source: cuda_rt::Error,
    },
    /// A kernel met a bad value in device memory (a kernel cannot fail a call itself). `InvalidArgument`.
    #[error("{}: {bits}; the step's outputs are not valid", if *earlier { "an earlier call on the caller's stream read" } else { "the call read" })]
    Kernel {
        /// What the kernels saw.
        bits: String,
        /// Whether it happened in an earlier, asynchronous call (reported at the next call).
        earlier: bool,
    },
    /// The ABI refused an argument access.
    #[error("{0}")]
    Abi(DelegateError),
}

impl HasErrorCode for Error {
    fn error_code(&self) -> ErrorCode {
        match self {
            Error::Plan(err) => err.error_code(),
            Error::Unsupported(_) => ErrorCode::NotSupported,
            Error::Args(err) => err.error_code(),
            Error::Kernel { .. } => ErrorCode::InvalidArgument,
            Error::Residency { source, .. } => source.error_code(),
            Error::Cuda { source, .. } => source.error_code(),
            Error::Abi(err) => err.code,
        }
    }
}

/// Checks a call's arguments against the plan: count, dtype, shape, size, writability. Memory kinds and
/// devices are checked with the driver by the engine when an address changes.
fn check(specs: &[ArgSpec], args: &[TensorArg]) -> Result<(), Error> {
    check_count(specs.iter().map(|a| a.name.as_str()), args.len())?;
    for (position, (spec, arg)) in specs.iter().zip(args).enumerate() {
        check_arg(position, &spec.expected(), arg)?;
        if arg.nbytes > 0 && arg.data.is_null() {
            return Err(ArgError::arg(position, &spec.name, "is a null pointer").into());
        }
    }
    Ok(())
}

/// One initialised blob: its argument plan and its device state.
#[derive(Debug)]
pub struct CudaHandle {
    specs: Vec<ArgSpec>,
    engine: Engine,
    /// Whether its graph keeps sequence state of its own (delegate-owned `state`; [`Plan::new`] refuses such
    /// a graph today, so `false`), answered by [`Delegate::keeps_sequence_state`].
    keeps_state: bool,
}

impl CudaHandle {
    /// Every argument position, in delegate-argument order.
    pub fn args(&self) -> &[ArgSpec] {
        &self.specs
    }

    /// The CUDA device it runs on.
    pub fn device(&self) -> i32 {
        self.engine.device()
    }
}

/// How the CUDA delegate names itself in reasons.
pub(crate) const DELEGATE: &str = "the CUDA delegate";

/// The CUDA delegate as an executor of reference graphs: its backend and how it names itself in reasons.
const EXECUTOR: Executor = Executor { backend: BACKEND_ID, name: DELEGATE };

impl CudaDelegate {
    fn init_blob(&self, ctx: &InitContext<'_>) -> Result<CudaHandle, Error> {
        let Opened { blob, graph, plan: plan_args } = EXECUTOR.open(ctx)?;
        let specs = plan_args.args().to_vec();
        let plan = Plan::new(&graph)?;
        let ordinal = blob.header.device_id; // 0 or more: both blob readers refuse a negative one
        let ctx = cuda_rt::Context::open(ordinal)
            .map_err(|source| Error::Cuda { action: format!("opening CUDA device {ordinal}"), source })?;
        let io: Vec<TensorId> =
            specs.iter().filter(|s| s.aliases_arg.is_none() && !s.aliased_input).map(|s| s.tensor).collect();
        let engine = Engine::new(ctx, &graph, plan, &io)?;
        tracing::debug!(
            target: "cuda_delegate",
            ops = graph.ops().len(),
            launches = engine.plan().steps.len(),
            device = ordinal,
            "initialised a reference graph on the GPU"
        );
        Ok(CudaHandle { specs, engine, keeps_state: keeps_sequence_state(&graph) })
    }
}

impl Delegate for CudaDelegate {
    type Handle = CudaHandle;

    fn new() -> Self {
        CudaDelegate
    }

    fn info() -> PluginInfo {
        let info =
            reference_graph_info("cuda-delegate", env!("CARGO_PKG_VERSION"), BACKEND_ID, &MEMORY_KINDS);
        let capabilities = info
            .capabilities
            .clone()
            .with_in_place_memory_kinds([MemoryKind::Device, MemoryKind::Managed])
            .with_caller_stream(true)
            .with_cuda_graph_capturable(true)
            .with_device_positions(true)
            // Every instance: `Plan::new` refuses a graph with delegate-owned state, so all of an instance's
            // sequence state is in the caller's caches (each instance says so too: `keeps_sequence_state`).
            .with_rewind_fork_without_reinit(true);
        info.with_capabilities(capabilities)
    }

    fn availability(&self) -> Result<(), DelegateError> {
        cuda_rt::Context::open(0).map(drop).map_err(|err| DelegateError::not_supported(err.to_string()))
    }

    fn compatibility(&self, blob: &[u8]) -> Compatibility {
        EXECUTOR.compatibility(blob)
    }

    fn init(&self, ctx: InitContext<'_>) -> Result<CudaHandle, DelegateError> {
        Ok(self.init_blob(&ctx)?)
    }

    fn execute(&self, handle: &mut CudaHandle, args: &mut ExecuteArgs<'_>) -> Result<(), DelegateError> {
        check(&handle.specs, args.args())?;
        Ok(handle.engine.run(&handle.specs, args)?)
    }

    fn keeps_sequence_state(&self, handle: &CudaHandle) -> bool {
        handle.keeps_state
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_names_the_backend_and_memory_kinds() {
        let info = CudaDelegate::info();
        assert_eq!(info.backends, [BACKEND_ID]);
        assert!(info.memory_kinds.contains(&MemoryKind::Device));
        assert!(info.binds_aliases_in_place);
        let c = &info.capabilities;
        assert!(c.caller_stream && c.cuda_graph_capturable && c.device_positions, "{c:?}");
        assert!(c.rewind_fork_without_reinit, "no instance keeps state of its own: {c:?}");
    }

    #[test]
    fn compatibility_refuses_other_backends_and_garbage() {
        let d = CudaDelegate;
        match d.compatibility(b"nope") {
            Compatibility::Unsupported { .. } => {}
            other => panic!("garbage accepted: {other:?}"),
        }
        let cfg = kv_example::Config::tiny();
        let weights = kv_example::Weights::generate(&cfg);
        let blob = |backend| kv_example::export::blob(&cfg, &weights, 1, backend).expect("blob");
        assert_eq!(d.compatibility(&blob(kv_example::Backend::Cuda)), Compatibility::Supported);
        match d.compatibility(&blob(kv_example::Backend::Reference)) {
            Compatibility::Unsupported { reason } => {
                assert_eq!(reason, "the blob is for backend 'ReferenceBackend', not 'CudaBackend'")
            }
            other => panic!("a ReferenceBackend blob accepted: {other:?}"),
        }
    }
}
