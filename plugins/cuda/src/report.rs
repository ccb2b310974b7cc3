//! What the CUDA delegate makes of a payload, for people: the launches of one call as the planner lowers the
//! graph (the same [`Plan::new`] `init` runs, pure, so any machine can tell), whether each is a launch of
//! the fast path or one op on its own, and for every op left alone the reason it did not fuse, in the
//! graph's own names. `delegate-host inspect X.pte --plan` prints it.
//!
//! A launch is `fused` when it is one of the fast path's typed kernels, the forms a decode step is meant to
//! be made of: a GEMV (with whatever it fuses), attention, an embedding gather, argmax. Every other launch is
//! one op that a fused form could have taken (the general path's elementwise ops, means, casts, copies and
//! standalone RoPE, and an add, RMS norm, cache update or positions of its own) and carries a `reason`.
//!
//! A call of several rows (a prefill's chunk) runs its GEMV steps on the GEMM path ([`crate::gemm`]): the
//! report lists the launches each such step becomes, as the engine queues them (`gemm` for a product on
//! cuBLAS, the norm, adds and cache update around it by their own names), each `fused` (the path meant for
//! those rows), and the layers count them.
#![forbid(unsafe_code)]

mod describe;
mod layers;
mod reason;

use ref_graph::{Graph, TensorId};
use ref_graph_contract::read_blob;

use crate::delegate::DELEGATE;
use crate::gemm::{Expansion, Part};
use crate::plan::Plan;
use crate::{Error, BACKEND_ID};

pub use layers::{LayerRule, Layers};

/// The launches of one call of a payload, in order, and how they group into the model's layers.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PlanReport {
    /// The graph's op count (what the launches were lowered from).
    pub ops: usize,
    /// Every launch of one call, in the order they are queued.
    pub launches: Vec<Launch>,
    /// The layers the launches fall into, when the graph's names or its attention steps show any.
    pub layers: Option<Layers>,
}

/// One kernel launch of a call.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Launch {
    /// What it runs: a fused GEMV as `norm+gemv3+bias+residual+kv_update+swiglu+rope` (the RMS norm it does
    /// first, how many sibling products, then what it fuses after them), `attention`, `embedding` (token and
    /// position rows in one), `gather`, `argmax`, `kv_update2` (K and V caches in one launch), `gemm` (a
    /// product of several rows on cuBLAS), or a general-path op (`b.mul`, `silu`, `mean`, `cast_f32`, `copy`,
    /// `rope`, ...).
    pub kind: String,
    /// A launch of the fast path (see the module docs); `false` for one op on its own.
    pub fused: bool,
    /// The graph tensors it writes (a fused cache update: the cache the caller passes).
    pub writes: Vec<String>,
    /// For a launch that is not `fused`: why the op did not fuse, naming its tensors. `None` otherwise.
    pub reason: Option<String>,
    /// The layer it falls in, by [`Layers`]' rule; `None` before the first layer and after the last.
    pub layer: Option<usize>,
}

impl PlanReport {
    /// The report of `graph`, planned as `init` plans it.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] for a graph the CUDA delegate cannot run.
    pub fn of_graph(graph: &Graph) -> Result<PlanReport, Error> {
        let mut plan = Plan::new(graph)?;
        let ops = reason::Ops::new(graph);
        let tags: Vec<_> = plan.steps.iter().map(|step| layers::tag(graph, &ops, step)).collect();
        let by_step = Layers::find(graph, &plan.steps, &tags);
        // As the engine expands the plan at `init`: a step of several rows' products on cuBLAS.
        let expansion = Expansion::new(&mut plan);
        let names = |ids: Vec<TensorId>| -> Vec<String> {
            // A scratch tensor of the GEMM path (an id past the graph's) has no name in the graph.
            ids.into_iter().filter_map(|id| graph.tensors().get(id.0)).map(|t| t.name.clone()).collect()
        };
        let mut launches = Vec::new();
        for (i, step) in plan.steps.iter().enumerate() {
            let layer = by_step.as_ref().and_then(|l| l.of(i));
            let Some(parts) = expansion.of(i) else {
                let reason = reason::why(&ops, &plan, i);
                let (kind, writes) = (step.label(), names(step.writes()));
                launches.push(Launch { kind, fused: reason.is_none(), writes, reason, layer });
                continue;
            };
            launches.extend(parts.iter().map(|part| {
                let (kind, writes) = match part {
                    Part::Step(step) => (step.label(), names(step.writes())),
                    Part::Product(product) => ("gemm".to_owned(), names(vec![product.y])),
                };
                Launch { kind, fused: true, writes, reason: None, layer }
            }));
        }
        let weights: Vec<usize> =
            (0..plan.steps.len()).map(|i| expansion.of(i).map_or(1, <[_]>::len)).collect();
        let layers = by_step.map(|l| l.weighted(&weights));
        Ok(PlanReport { ops: graph.ops().len(), launches, layers })
    }

    /// How many launches are `fused`.
    pub fn fused(&self) -> usize {
        self.launches.iter().filter(|l| l.fused).count()
    }

    /// How many launches are one op on their own (each with a reason).
    pub fn general(&self) -> usize {
        self.launches.len() - self.fused()
    }
}

/// The report of a call whose payload (the delegate's blob) is `payload`: read as `init` reads it (the blob
/// checked for [`BACKEND_ID`], its payload decoded as a reference graph) and planned as `init` plans it;
/// nothing runs and no CUDA is needed.
///
/// # Errors
///
/// [`Error::Plan`] when the blob does not parse, is not a native reference-graph blob for `CudaBackend` or its
/// payload is not a valid graph; [`Error::Unsupported`] for a graph the CUDA delegate cannot run.
pub fn plan_report(payload: &[u8]) -> Result<PlanReport, Error> {
    let (_, graph) = read_blob(payload, BACKEND_ID, DELEGATE)?;
    PlanReport::of_graph(&graph)
}

#[cfg(test)]
mod tests;
