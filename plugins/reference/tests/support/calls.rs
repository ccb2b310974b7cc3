//! What this delegate's in-process tests share: blobs of a graph bound with the graph's own types, `init`,
//! one `execute` of an argument list, and the check of a refusal.
// Each test binary uses a subset of these helpers.
#![allow(dead_code)]

use blob_format::model::{Alias, Binding, Dim, Header, PayloadKind, Role};
use delegate_abi::host::ArgList;
use delegate_abi::{Delegate, DelegateError, ErrorCode, ExecStats, ExecuteArgs, InitContext};
use ref_graph::Graph;
use reference_delegate::{ReferenceDelegate, ReferenceHandle, BACKEND_ID};

/// A binding of `graph`'s tensor `name` with the graph's own dtype and shape.
pub fn graph_binding(graph: &Graph, name: &str, role: Role) -> Binding {
    let decl = graph.tensor(graph.find(name).expect("declared"));
    Binding {
        name: name.to_owned(),
        role,
        dtype: Some(decl.dtype.dtype()),
        shape: Some(decl.shape.iter().map(|&d| Dim::Static(d)).collect()),
        threaded: true,
    }
}

/// A blob of `graph` for this backend with `bindings` and `aliases` (no producer, device 0, no engine facts).
pub fn graph_blob(graph: &Graph, bindings: Vec<Binding>, aliases: Vec<Alias>) -> Vec<u8> {
    let header = Header::new(BACKEND_ID, PayloadKind::ReferenceGraph, bindings, aliases);
    blob_format::native::to_vec(&header, &graph.encode())
}

/// A blob of `graph` whose bindings are `inputs` then `outputs`, each with the graph's own dtype and shape.
pub fn plain_blob(graph: &Graph, inputs: &[&str], outputs: &[&str]) -> Vec<u8> {
    let inputs = inputs.iter().map(|n| graph_binding(graph, n, Role::Input));
    let outputs = outputs.iter().map(|n| graph_binding(graph, n, Role::Output));
    graph_blob(graph, inputs.chain(outputs).collect(), vec![])
}

/// `delegate.init` of `blob`, without compile or runtime specs.
pub fn init(delegate: &ReferenceDelegate, blob: &[u8]) -> Result<ReferenceHandle, DelegateError> {
    delegate.init(InitContext { blob, compile_specs: &[], runtime_specs: &[] })
}

/// One `execute` of `list` on `handle`; its statistics.
pub fn run_list(
    delegate: &ReferenceDelegate,
    handle: &mut ReferenceHandle,
    list: &ArgList<'_>,
) -> Result<ExecStats, DelegateError> {
    let mut stats = ExecStats::default();
    // SAFETY: `ArgList` built every argument from live Rust borrows (shared for inputs, exclusive for inouts
    // and outputs) that outlive this call, and shares storage only between an inout and its in-place output,
    // at the same address and size: exactly `ExecuteArgs::new`'s contract.
    let mut args = unsafe { ExecuteArgs::new(list.as_slice(), None, &mut stats) };
    delegate.execute(handle, &mut args)?;
    Ok(stats)
}

/// Asserts `result` is refused with `code` and a message containing `fragment`.
pub fn expect_code(result: Result<impl std::fmt::Debug, DelegateError>, code: ErrorCode, fragment: &str) {
    let err = result.expect_err("the call is wrong");
    assert_eq!(err.code, code, "{err}");
    assert!(err.message.contains(fragment), "'{}' does not contain '{fragment}'", err.message);
}
