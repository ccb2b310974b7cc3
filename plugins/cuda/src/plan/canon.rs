//! The canonical form of a graph the fast path matches, whatever order and views an exporter wrote it in:
//!
//! - **Views are names, not ops.** A `Reshape`, or a `Permute` that moves no element, is no launch: its
//!   output is another name of its input's value ([`Canon::value`]), and every fusion compares values, not
//!   names. A view that is a graph output lends its storage the other way: the value it names is computed
//!   straight into the caller's buffer (the logits of an export, a reshape of the last product), so nothing
//!   is copied, unless that value is an input, a constant or another output.
//! - **What depends on the position alone runs first.** An op that reads only constants and inputs nothing
//!   writes (RoPE's cos and sin, a cache's counters, the embedding) is scheduled before the first layer,
//!   once a step, so no such op sits between a product and what consumes it.
//! - **Sibling products are adjacent.** A product is followed by every later product of the same value by a
//!   constant weight of the same layout (Q, K and V; gate and up), which then share one launch.
//!
//! The schedule is a topological order of the graph's dataflow: a product moved ahead reads a value already
//! computed and constants; an op moved to the front reads nothing any op writes.

use ref_graph::{Graph, Op, TensorId};

use super::general::keeps_memory_order;

/// A graph's canonical schedule and the value each tensor names.
#[derive(Debug, Clone)]
pub(super) struct Canon {
    /// The ops to lower (every op but the views), in the order to lower them.
    pub order: Vec<usize>,
    /// Per tensor: the tensor holding its value (itself unless it is a view, or a value an output view
    /// names).
    pub value: Vec<TensorId>,
}

impl Canon {
    pub(super) fn new(graph: &Graph) -> Canon {
        let (value, view) = views(graph);
        let order = schedule(graph, &value, &view);
        Canon { order, value }
    }
}

/// Whether `op` moves no element: a reshape, or a permute of axes of extent 1 only.
fn is_view(graph: &Graph, op: &Op<TensorId>) -> Option<(TensorId, TensorId)> {
    match *op {
        Op::Reshape { input, out, .. } => Some((input, out)),
        Op::Permute { input, ref dims, out } if keeps_memory_order(&graph.tensor(input).shape, dims) => {
            Some((input, out))
        }
        _ => None,
    }
}

/// The value each tensor names, and which ops are views. A view that is a graph output stays an op (a copy)
/// when the value it names cannot live in the caller's buffer: an input, a constant, an output, or a value
/// another output view names.
fn views(graph: &Graph) -> (Vec<TensorId>, Vec<bool>) {
    let mut value: Vec<TensorId> = (0..graph.tensors().len()).map(TensorId).collect();
    let mut view = vec![false; graph.ops().len()];
    let fixed_home = |id: TensorId| {
        graph.inputs().contains(&id) || graph.outputs().contains(&id) || graph.constant(id).is_some()
    };
    for (i, op) in graph.ops().iter().enumerate() {
        let Some((input, out)) = is_view(graph, op) else { continue };
        let named = value[input.0];
        if !graph.outputs().contains(&out) {
            value[out.0] = named;
            view[i] = true;
        } else if !fixed_home(named) {
            // The value moves into the output's storage, with every name it has.
            for v in value.iter_mut().filter(|v| **v == named) {
                *v = out;
            }
            view[i] = true;
        }
    }
    (value, view)
}

/// The canonical order of the ops that are not views (see the module docs).
fn schedule(graph: &Graph, value: &[TensorId], view: &[bool]) -> Vec<usize> {
    let ops = graph.ops();
    let written_in_place: Vec<TensorId> = ops
        .iter()
        .filter_map(|op| match *op {
            Op::Assign { target, .. } | Op::KvCacheUpdate { cache: target, .. } => Some(value[target.0]),
            _ => None,
        })
        .collect();
    // Values known before the first op: constants and the inputs no op writes; then what only they make,
    // except through a gather (the token embedding is the first activation, not a value of the position).
    let mut early = vec![false; graph.tensors().len()];
    for (id, _) in graph.constants() {
        early[id.0] = true;
    }
    for &id in graph.inputs() {
        early[id.0] = !written_in_place.contains(&value[id.0]);
    }
    let gathered: Vec<TensorId> = ops
        .iter()
        .filter_map(|op| if let Op::Gather { indices, .. } = *op { Some(value[indices.0]) } else { None })
        .collect();
    let mut first = Vec::new();
    let mut rest = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let makes = !matches!(op, Op::Assign { .. } | Op::KvCacheUpdate { .. } | Op::Gather { .. });
        let hoisted = makes && op.operands().iter().all(|&id| early[value[id.0].0]);
        if hoisted {
            early[value[op.output().0].0] = true;
        }
        if view[i] {
            continue;
        }
        // A gather's indices stay beside it, so the embedding's fusion sees its ops together.
        if hoisted && !gathered.contains(&value[op.output().0]) {
            first.push(i);
        } else {
            rest.push(i);
        }
    }
    let mut order = first;
    let mut taken = vec![false; ops.len()];
    for (at, &i) in rest.iter().enumerate() {
        if std::mem::replace(&mut taken[i], true) {
            continue;
        }
        order.push(i);
        for &j in &rest[at + 1..] {
            if !taken[j] && siblings(graph, value, &ops[i], &ops[j]) {
                taken[j] = true;
                order.push(j);
            }
        }
    }
    order
}

/// Whether `later` is a product of the value `first` multiplies, by a constant weight of the same layout
/// (and a constant bias, if any): it can move up beside `first`.
fn siblings(graph: &Graph, value: &[TensorId], first: &Op<TensorId>, later: &Op<TensorId>) -> bool {
    let (&Op::MatMul { a, transpose_b, .. }, &Op::MatMul { a: a2, b, transpose_b: t2, bias, .. }) =
        (first, later)
    else {
        return false;
    };
    let constant = |id: TensorId| graph.constant(id).is_some();
    value[a.0] == value[a2.0] && t2 == transpose_b && constant(b) && bias.is_none_or(constant)
}
