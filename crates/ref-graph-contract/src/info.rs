//! What an executor of reference graphs says about itself.

use delegate_abi::{Capabilities, MemoryKind, PluginInfo};
use ref_graph::Graph;

use crate::WIRE_FORMAT_VERSIONS;

/// The self-description of an executor of reference graphs: `name` at `version` serving `backend`, native
/// blobs of [`WIRE_FORMAT_VERSIONS`], arguments in `memory_kinds`, aliased outputs bound in place.
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
        .with_capabilities(Capabilities::default().with_in_place_memory_kinds(memory_kinds.iter().copied()))
}

/// Whether an executor of `graph` keeps sequence state of its own: its delegate-owned `state` (payload 1.2),
/// the caches it holds across calls, which no rewind, restored cache or fork of the caller's caches carries.
/// The answer of [`delegate_abi::Delegate::keeps_sequence_state`] for every executor of reference graphs.
pub fn keeps_sequence_state(graph: &Graph) -> bool {
    !graph.state().is_empty()
}
