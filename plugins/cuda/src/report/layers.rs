//! Which transformer layer each launch falls in, from the layer index in the names of the tensors it touches
//! (or, in a graph whose names carry none, from its attention steps).

use ref_graph::Graph;

use super::reason::Ops;
use crate::plan::Step;

/// How [`Layers`] were told apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LayerRule {
    /// By the layer index in the names of the tensors a launch reads or writes (`model.layers.3.mlp.up_proj`,
    /// `transformer.h.3.attn`, `layers_3_...`): a layer runs from its first such launch to the next layer's
    /// first; the last layer until the first launch after its last named one that reads a weight of no
    /// layer (a constant of more than one element: the final norm's gain, the head).
    Names,
    /// By the attention steps, when no name carries a layer index: a layer runs from its attention to the
    /// next one, the last layer to the end.
    Attention,
}

impl LayerRule {
    /// `names` or `attention`.
    pub fn as_str(self) -> &'static str {
        match self {
            LayerRule::Names => "names",
            LayerRule::Attention => "attention",
        }
    }
}

/// The launches' layers: consecutive runs of launches, one per layer, between the launches before the
/// first layer (the embedding, tables computed from the position) and those after the last (the final norm,
/// the head, argmax).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Layers {
    /// How the layers were told apart.
    pub rule: LayerRule,
    /// The launch count of each layer, in order.
    pub launches: Vec<usize>,
    /// Launches before the first layer.
    pub before: usize,
    /// Launches after the last layer.
    pub after: usize,
}

/// The layer index a tensor's name carries: the number after a `layers`, `layer`, `h`, `blocks` or `block`
/// part of the name (parts split at `.` and `_`).
fn layer_of(name: &str) -> Option<usize> {
    let parts: Vec<&str> = name.split(['.', '_']).collect();
    parts.windows(2).find_map(|w| {
        let container = matches!(w[0], "layers" | "layer" | "h" | "blocks" | "block");
        let digits = !w[1].is_empty() && w[1].bytes().all(|b| b.is_ascii_digit());
        if container && digits {
            w[1].parse().ok()
        } else {
            None
        }
    })
}

/// The highest layer index among the names of the tensors `step` reads or writes; none for a step that
/// reads constants alone (an exporter may hoist such work, a weight's cast, anywhere in the graph).
pub(super) fn tag(graph: &Graph, ops: &Ops<'_>, step: &Step) -> Option<usize> {
    if ops.reads_constants_only(step) {
        return None;
    }
    step.reads().into_iter().chain(step.writes()).filter_map(|id| layer_of(&graph.tensor(id).name)).max()
}

impl Layers {
    /// The layers of `steps`, each tagged by [`tag`]; `None` when neither names nor attention show any.
    pub(super) fn find(graph: &Graph, steps: &[Step], tags: &[Option<usize>]) -> Option<Layers> {
        Layers::by_names(graph, steps, tags).or_else(|| Layers::by_attention(steps))
    }

    fn by_names(graph: &Graph, steps: &[Step], tags: &[Option<usize>]) -> Option<Layers> {
        let count = tags.iter().flatten().max()? + 1;
        let starts: Vec<usize> =
            (0..count).map(|layer| tags.iter().position(|&t| t == Some(layer))).collect::<Option<_>>()?;
        if !starts.windows(2).all(|w| w[0] < w[1]) {
            return None;
        }
        let last_named = tags.iter().rposition(|&t| t == Some(count - 1))?;
        // A weight of no layer: a constant of more than one element (not a scalar such as an epsilon).
        let unlayered_weight = |step: &Step| {
            step.reads().into_iter().any(|id| {
                let t = graph.tensor(id);
                graph.constant(id).is_some() && t.numel() > 1 && layer_of(&t.name).is_none()
            })
        };
        let end = (last_named + 1..steps.len()).find(|&i| unlayered_weight(&steps[i])).unwrap_or(steps.len());
        Some(Layers::from_starts(LayerRule::Names, &starts, end, steps.len()))
    }

    fn by_attention(steps: &[Step]) -> Option<Layers> {
        let starts: Vec<usize> = steps
            .iter()
            .enumerate()
            .filter(|(_, s)| matches!(s, Step::Attention { .. }))
            .map(|(i, _)| i)
            .collect();
        if starts.is_empty() {
            return None;
        }
        Some(Layers::from_starts(LayerRule::Attention, &starts, steps.len(), steps.len()))
    }

    /// Layers starting at `starts` (increasing, at least one), the last ending before `end`, of `total`.
    fn from_starts(rule: LayerRule, starts: &[usize], end: usize, total: usize) -> Layers {
        let mut launches: Vec<usize> = starts.windows(2).map(|w| w[1] - w[0]).collect();
        launches.push(end - starts[starts.len() - 1]);
        Layers { rule, launches, before: starts[0], after: total - end }
    }

    /// The same layers over launches where step `i` is `weights[i]` launches (a step on the GEMM path is
    /// several): each count the sum of its steps' weights.
    pub(super) fn weighted(&self, weights: &[usize]) -> Layers {
        let mut rest = weights.iter();
        let mut take = |n: usize| rest.by_ref().take(n).sum::<usize>();
        let before = take(self.before);
        let launches = self.launches.iter().map(|&n| take(n)).collect();
        Layers { rule: self.rule, launches, before, after: take(self.after) }
    }

    /// The layer launch `index` falls in; `None` before the first and after the last.
    pub fn of(&self, index: usize) -> Option<usize> {
        let mut start = self.before;
        for (layer, &n) in self.launches.iter().enumerate() {
            if (start..start + n).contains(&index) {
                return Some(layer);
            }
            start += n;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::layer_of;

    #[test]
    fn layer_indices_are_read_from_the_names_exporters_write() {
        assert_eq!(layer_of("inner.model.model.layers.12.mlp.up_proj.weight"), Some(12));
        assert_eq!(layer_of("inner.model.transformer.h.3.ln_1.weight"), Some(3));
        assert_eq!(layer_of("p_model_layers_7_self_attn_q_proj_weight"), Some(7));
        assert_eq!(layer_of("inner.model.model.norm.weight"), None);
        assert_eq!(layer_of("aten_mm_default_3"), None);
        assert_eq!(layer_of("inner.model.model.layers.x.weight"), None);
    }
}
