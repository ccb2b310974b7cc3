//! A step in words: its label, and the graph tensors it reads and writes.

use ref_graph::{TensorId, UnaryFn};

use crate::plan::Step;

impl Step {
    /// A short name of what the launch runs (see [`super::Launch::kind`]); the plan's tests compare these.
    pub(crate) fn label(&self) -> String {
        match self {
            Step::Gather { plus: Some(_), .. } => "embedding".to_owned(),
            Step::Gather { scale: Some(_), .. } => "gather+scale".to_owned(),
            Step::Gather { .. } => "gather".to_owned(),
            Step::Positions { .. } => "positions".to_owned(),
            Step::Counters { sums } => format!("counters{}", sums.len()),
            Step::RopeTables { .. } => "rope_tables".to_owned(),
            Step::Add { .. } => "add".to_owned(),
            Step::Norm { norm, residual, .. } => format!(
                "{}{}",
                if norm.centred { "layer_norm" } else { "rms_norm" },
                if residual.is_some() { "+residual" } else { "" }
            ),
            Step::Binary { op, .. } => format!("b.{op:?}").to_lowercase(),
            Step::Unary { func, .. } => format!("{func:?}").to_lowercase(),
            Step::Glu { func: UnaryFn::Silu, .. } => "swiglu".to_owned(),
            Step::Glu { .. } => "geglu".to_owned(),
            Step::Mean { .. } => "mean".to_owned(),
            Step::Cast { to, .. } => format!("cast_{to}"),
            Step::Copy { .. } => "copy".to_owned(),
            Step::Rope { .. } => "rope".to_owned(),
            Step::Gemv { mats, norm, cache_rows, glu, rope, activation, softcap, .. } => format!(
                "{}gemv{}{}{}{}{}{}{}{}",
                if norm.is_some() { "norm+" } else { "" },
                mats.len(),
                if mats.iter().any(|m| m.bias.is_some()) { "+bias" } else { "" },
                if mats[0].residual2.is_some() {
                    "+residual+residual"
                } else if mats[0].residual.is_some() {
                    "+residual"
                } else {
                    ""
                },
                if cache_rows.is_some() { "+kv_update" } else { "" },
                match (glu, activation) {
                    (Some(_), Some(_)) => "+geglu",
                    (Some(_), None) => "+swiglu",
                    _ => "",
                },
                if rope.is_some() { "+rope" } else { "" },
                if activation.is_some() && glu.is_none() { "+gelu" } else { "" },
                if softcap.is_some() { "+softcap" } else { "" }
            ),
            Step::KvUpdate { caches, .. } => format!("kv_update{}", caches.len()),
            Step::Attention { .. } => "attention".to_owned(),
            Step::Argmax { .. } => "argmax".to_owned(),
        }
    }

    /// The tensors the launch writes: a SwiGLU GEMV its product alone (the gate and up are never stored),
    /// a cache update (fused or not) the cache the caller passes.
    pub(crate) fn writes(&self) -> Vec<TensorId> {
        match self {
            Step::Gemv { mats, glu, .. } => {
                let products = match glu {
                    Some(out) => vec![*out],
                    None => mats.iter().map(|m| m.y).collect(),
                };
                products.into_iter().chain(mats.iter().filter_map(|m| m.cache)).collect()
            }
            Step::KvUpdate { caches, .. } => caches.iter().map(|&(cache, _)| cache).collect(),
            Step::Counters { sums } => sums.iter().map(|s| s.out).collect(),
            Step::RopeTables { cos, sin, .. } => vec![*cos, *sin],
            Step::Copy { dst, .. } => vec![*dst],
            Step::Gather { out, .. }
            | Step::Positions { out, .. }
            | Step::Add { out, .. }
            | Step::Norm { out, .. }
            | Step::Attention { out, .. }
            | Step::Argmax { out, .. }
            | Step::Binary { out, .. }
            | Step::Unary { out, .. }
            | Step::Glu { out, .. }
            | Step::Mean { out, .. }
            | Step::Cast { out, .. }
            | Step::Rope { out, .. } => vec![*out],
        }
    }

    /// The tensors the launch reads (weights, gains and biases included).
    pub(crate) fn reads(&self) -> Vec<TensorId> {
        match self {
            Step::Gather { table, indices, plus, scale, .. } => {
                let mut ids = vec![*table, *indices];
                ids.extend(plus.iter().flat_map(|p| [p.table, p.position]));
                ids.extend(*scale);
                ids
            }
            Step::Gemv { a, norm, mats, cache_rows, rope, softcap, .. } => {
                let mut ids = vec![*a];
                ids.extend(softcap.iter().flat_map(|c| [c.divisor, c.factor]));
                ids.extend(norm.iter().flat_map(|n| std::iter::once(n.gain).chain(n.bias)));
                for m in mats {
                    ids.push(m.w);
                    ids.extend(m.bias.iter().chain(&m.residual).chain(&m.residual2));
                }
                ids.extend(rope.iter().flat_map(|r| [r.cos, r.sin]));
                ids.extend(cache_rows.map(|c| c.position));
                ids
            }
            Step::KvUpdate { caches, position, .. } => {
                caches.iter().map(|&(_, update)| update).chain([*position]).collect()
            }
            Step::Attention { q, k, v, position, .. } => vec![*q, *k, *v, *position],
            Step::Positions { position, .. } => vec![*position],
            Step::Counters { sums } => sums.iter().map(|s| s.src).collect(),
            Step::RopeTables { position, inv_freq, .. } => vec![*position, *inv_freq],
            Step::Add { a, b, .. } | Step::Binary { a, b, .. } => vec![*a, *b],
            Step::Glu { gate, up, .. } => vec![*gate, *up],
            Step::Norm { input, norm, residual, .. } => {
                [*input, norm.gain].into_iter().chain(norm.bias).chain(*residual).collect()
            }
            Step::Argmax { input, .. }
            | Step::Unary { input, .. }
            | Step::Mean { input, .. }
            | Step::Cast { input, .. } => vec![*input],
            Step::Rope { x, cos, sin, .. } => vec![*x, *cos, *sin],
            Step::Copy { src, .. } => vec![*src],
        }
    }
}
