//! The bytes a decode step must read, the numerator of its floor.

use ref_graph::{Graph, Op, TensorId};

/// The bytes a decode step at `position` must read: every constant once, except a table only `gather` reads
/// (an untied embedding), of which only the gathered rows; and the valid prefix (`position + 1` rows) of
/// every cache a `kv_cache_update` writes (head-major `[1, H, L, Dh]` or token-major `[L, H, Dh]`).
pub fn bytes_per_step(graph: &Graph, position: u64) -> u64 {
    let gathered_only = |id: TensorId| {
        let mut uses = graph.ops().iter().filter(|op| op.operands().contains(&id)).peekable();
        uses.peek().is_some() && uses.all(|op| matches!(op, Op::Gather { table, .. } if *table == id))
    };
    let constants: u64 = graph
        .constants()
        .map(|(id, _)| {
            let decl = graph.tensor(id);
            if !gathered_only(id) {
                return decl.nbytes() as u64;
            }
            let rows: u64 = graph
                .ops()
                .iter()
                .filter_map(|op| match op {
                    Op::Gather { table, indices, .. } if *table == id => Some(graph.tensor(*indices).numel()),
                    _ => None,
                })
                .sum::<usize>() as u64;
            rows * (decl.nbytes() as u64 / decl.shape[0])
        })
        .sum();
    let caches: u64 = graph
        .ops()
        .iter()
        .filter_map(|op| match op {
            Op::KvCacheUpdate { cache, .. } => {
                let decl = graph.tensor(*cache);
                let rows = if decl.shape.len() == 4 { decl.shape[2] } else { decl.shape[0] };
                Some(decl.nbytes() as u64 / rows * (position + 1).min(rows))
            }
            _ => None,
        })
        .sum();
    constants + caches
}
