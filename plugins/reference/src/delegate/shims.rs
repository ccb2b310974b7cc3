//! The reference-graph contract's functions at their 0.2.0 paths (`reference_delegate::delegate::read_blob`,
//! ...), kept one release for callers: the contract is `ref-graph-contract` now.

use blob_format::Blob;
use delegate_abi::{Compatibility, MemoryKind, PluginInfo};
use ref_graph::Graph;

use super::Error;

/// Why a blob's header does not fit an executor of reference graphs that serves `backend`.
#[deprecated(since = "0.2.1", note = "use `ref_graph_contract::header_mismatch`")]
pub fn header_mismatch(blob: &Blob<'_>, backend: &str, delegate: &str) -> Option<String> {
    ref_graph_contract::header_mismatch(blob, backend, delegate)
}

/// Reads a blob for an executor of reference graphs that serves `backend` (named `delegate` in reasons).
#[deprecated(since = "0.2.1", note = "use `ref_graph_contract::read_blob`")]
pub fn read_blob<'a>(bytes: &'a [u8], backend: &str, delegate: &str) -> Result<(Blob<'a>, Graph), Error> {
    Ok(ref_graph_contract::read_blob(bytes, backend, delegate)?)
}

/// Whether an executor of reference graphs that serves `backend` (named `delegate` in reasons) can take `blob`.
#[deprecated(since = "0.2.1", note = "use `ref_graph_contract::blob_compatibility`")]
pub fn blob_compatibility(
    blob: &[u8],
    backend: &str,
    delegate: &str,
    refuse: impl FnOnce(&Blob<'_>) -> Option<String>,
) -> Compatibility {
    ref_graph_contract::blob_compatibility(blob, backend, delegate, refuse)
}

/// The self-description of an executor of reference graphs.
#[deprecated(since = "0.2.1", note = "use `ref_graph_contract::reference_graph_info`")]
pub fn reference_graph_info(
    name: &str,
    version: &str,
    backend: &str,
    memory_kinds: &[MemoryKind],
) -> PluginInfo {
    ref_graph_contract::reference_graph_info(name, version, backend, memory_kinds)
}

/// Whether an executor of `graph` keeps sequence state of its own.
#[deprecated(since = "0.2.1", note = "use `ref_graph_contract::keeps_sequence_state`")]
pub fn keeps_sequence_state(graph: &Graph) -> bool {
    ref_graph_contract::keeps_sequence_state(graph)
}

/// Whether `payload` is a reference graph of a major version this build reads.
#[deprecated(since = "0.2.1", note = "use `ref_graph_contract::payload_compatibility`")]
pub fn payload_compatibility(payload: &[u8]) -> Compatibility {
    ref_graph_contract::payload_compatibility(payload)
}
