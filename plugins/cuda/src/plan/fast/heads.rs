//! A chunk's heads stay token-major: the head permutes around a prefill's attention are strided copies
//! (`[T, H, Dh]` products to `[H, T, Dh]` for the RoPE, the cache update and the attention, the attention's
//! output back), four a layer. Every step between reads its operand in either order (a RoPE is elementwise
//! along the head's values with its tables broadcast by a walk; a cache update and an attention take their
//! rows token-major or head-major), so after the steps are lowered each such copy whose only reader is one
//! of them is dropped and its reader takes the copy's source in its own order: the RoPE walks the token-major
//! shape (its output token-major then), the cache update and the attention read (and the attention writes)
//! token-major. The values are the same; only the order they are stored in changes, and nothing else reads a
//! tensor whose order changed. One decode row is never permuted (its head views are aliases).

use super::Lowering;
use crate::plan::{AttnShape, Home, KvLayout, Step, Walk};
use ref_graph::TensorId;

/// What a head permute moves: `rows` rows of `heads` heads of `dh` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Heads {
    rows: u64,
    heads: u64,
    dh: u64,
}

impl Heads {
    /// Whether `walk` (a copy's, contiguous destination) moves these heads from token-major to head-major
    /// (`to_head_major`) or back, axes of extent 1 aside.
    fn permuted_by(self, walk: &Walk, to_head_major: bool) -> bool {
        let Heads { rows, heads, dh } = self;
        let wide: Vec<usize> = (0..walk.dims.len()).filter(|&d| walk.dims[d] > 1).collect();
        let pick = |v: &[u64]| wide.iter().map(|&d| v[d]).collect::<Vec<_>>();
        let (dims, src, dst) = if to_head_major {
            ([heads, rows, dh], [dh, heads * dh, 1], [rows * dh, dh, 1])
        } else {
            ([rows, heads, dh], [dh, rows * dh, 1], [heads * dh, dh, 1])
        };
        rows > 1 && heads > 1 && pick(&walk.dims) == dims && pick(&walk.a) == src && pick(&walk.b) == dst
    }
}

impl Lowering<'_> {
    /// Drops the head permutes of every chunk's cache updates and attentions that can read and write their
    /// rows token-major (see the module).
    pub(super) fn token_major_heads(&mut self) {
        let mut dropped = vec![false; self.steps.len()];
        for at in 0..self.steps.len() {
            match self.steps[at] {
                Step::KvUpdate { layout, .. } if layout.head_major && layout.rows > 1 => {
                    self.token_major_update(at, &mut dropped);
                }
                Step::Attention { shape, .. } if shape.head_major && shape.rows > 1 => {
                    self.token_major_attention(at, &mut dropped);
                }
                _ => {}
            }
        }
        let mut keep = dropped.into_iter().map(|d| !d);
        self.steps.retain(|_| keep.next().unwrap_or(true));
    }

    /// A head-major cache update of many rows whose every update is a head permute of a token-major tensor,
    /// or a RoPE of one: reads them token-major.
    fn token_major_update(&mut self, at: usize, dropped: &mut [bool]) {
        let Step::KvUpdate { ref caches, layout, .. } = self.steps[at] else { return };
        let heads =
            Heads { rows: layout.rows.into(), heads: layout.heads.into(), dh: layout.head_dim.into() };
        let updates: Vec<TensorId> = caches.iter().map(|&(_, u)| u).collect();
        let Some(sources) = updates
            .iter()
            .map(|&u| self.token_major_source(u, at, heads, dropped))
            .collect::<Option<Vec<_>>>()
        else {
            return;
        };
        for (i, source) in sources.into_iter().enumerate() {
            let update = self.apply(source, dropped);
            if let Step::KvUpdate { caches, .. } = &mut self.steps[at] {
                caches[i].1 = update;
            }
        }
        if let Step::KvUpdate { layout, .. } = &mut self.steps[at] {
            *layout = KvLayout { head_major: false, ..*layout };
        }
    }

    /// A head-major attention of many rows whose query is a RoPE of a head permute of a token-major tensor
    /// and whose output only a permute back reads: reads its query and writes its output token-major, into
    /// that permute's destination.
    fn token_major_attention(&mut self, at: usize, dropped: &mut [bool]) {
        let Step::Attention { q, out, shape, .. } = self.steps[at] else { return };
        let heads = Heads { rows: shape.rows.into(), heads: shape.heads.into(), dh: shape.head_dim.into() };
        let Some(source) = self.token_major_source(q, at, heads, dropped) else { return };
        let Some(back) = self.permuted_back(out, at, heads, dropped) else { return };
        let Step::Copy { dst, .. } = self.steps[back] else { return };
        let q = self.apply(source, dropped);
        dropped[back] = true;
        // The permute's destination now holds the attention's rows; the old output is never written.
        self.rehome(out, dst);
        if let Step::Attention { q: query, out: output, shape: s, .. } = &mut self.steps[at] {
            *query = q;
            *output = dst;
            *s = AttnShape { head_major: false, ..*s };
        }
    }

    /// How `x` (read by step `reader`) can be had token-major: it is a head permute's destination, or a RoPE's
    /// output whose input is; each only read by the next, no graph output, their sources unwritten between.
    fn token_major_source(
        &self,
        x: TensorId,
        reader: usize,
        heads: Heads,
        dropped: &[bool],
    ) -> Option<Source> {
        if let Some(copy) = self.head_permute_into(x, reader, heads, dropped) {
            return Some(Source::Copy { copy });
        }
        let rope = self.writer_of(x, reader, dropped)?;
        let Step::Rope { x: input, .. } = self.steps[rope] else { return None };
        let only = self.only_reader(x, reader, dropped);
        let copy = self.head_permute_into(input, rope, heads, dropped)?;
        only.then_some(Source::Rope { rope, copy })
    }

    /// The head permute (to head-major) writing `x`, which only `reader` reads, whose source nothing writes
    /// before `reader`.
    fn head_permute_into(&self, x: TensorId, reader: usize, heads: Heads, dropped: &[bool]) -> Option<usize> {
        let copy = self.writer_of(x, reader, dropped)?;
        let Step::Copy { src, ref walk, src_off: 0, dst_off: 0, .. } = self.steps[copy] else { return None };
        let kept = heads.permuted_by(walk, true)
            && self.only_reader(x, reader, dropped)
            && !self.written_between(src, copy, reader, dropped);
        kept.then_some(copy)
    }

    /// The permute back to token-major that is the only reader of `out` (step `writer`'s output), whose
    /// destination no step between touches (the attention writes it there instead).
    fn permuted_back(&self, out: TensorId, writer: usize, heads: Heads, dropped: &[bool]) -> Option<usize> {
        let back = (writer + 1..self.steps.len()).find(|&i| self.live(i, dropped, out, Step::reads))?;
        let Step::Copy { dst, ref walk, src_off: 0, dst_off: 0, .. } = self.steps[back] else { return None };
        let touched = (writer + 1..back)
            .any(|i| self.live(i, dropped, dst, Step::reads) || self.live(i, dropped, dst, Step::writes));
        let kept = heads.permuted_by(walk, false) && self.only_reader(out, back, dropped) && !touched;
        kept.then_some(back)
    }

    /// The last step before `reader` writing `x`'s storage.
    fn writer_of(&self, x: TensorId, reader: usize, dropped: &[bool]) -> Option<usize> {
        (0..reader).rev().find(|&i| self.live(i, dropped, x, Step::writes))
    }

    /// Whether `reader` is the only step reading `x`'s storage, and `x` is no graph output.
    fn only_reader(&self, x: TensorId, reader: usize, dropped: &[bool]) -> bool {
        !self.is_output(x)
            && (0..self.steps.len()).all(|i| i == reader || !self.live(i, dropped, x, Step::reads))
    }

    /// Whether a step after `from` and before `to` writes `x`'s storage.
    fn written_between(&self, x: TensorId, from: usize, to: usize, dropped: &[bool]) -> bool {
        (from + 1..to).any(|i| self.live(i, dropped, x, Step::writes))
    }

    /// Whether step `i`, not dropped, has `x`'s storage among its `tensors` (its reads or its writes).
    fn live(&self, i: usize, dropped: &[bool], x: TensorId, tensors: fn(&Step) -> Vec<TensorId>) -> bool {
        let root = Home::root(&self.homes, x);
        !dropped[i] && tensors(&self.steps[i]).into_iter().any(|id| Home::root(&self.homes, id) == root)
    }

    /// Drops the source's permute: the tensor its reader now reads (the permute's source, or the RoPE's
    /// output, now computed from that source in token-major order).
    fn apply(&mut self, source: Source, dropped: &mut [bool]) -> TensorId {
        let copy = match source {
            Source::Copy { copy } | Source::Rope { copy, .. } => copy,
        };
        let Step::Copy { src, dst, .. } = self.steps[copy] else { unreachable!("a head permute") };
        dropped[copy] = true;
        // Never written or read now: no allocation.
        self.rehome(dst, src);
        let Source::Rope { rope, .. } = source else { return src };
        let Step::Rope { x, out, walk, .. } = &mut self.steps[rope] else { unreachable!("a RoPE") };
        *x = src;
        *walk = rows_before_heads(walk);
        *out
    }
}

/// Where a head-major operand's values are in token-major order.
#[derive(Debug, Clone, Copy)]
enum Source {
    /// A head permute's source.
    Copy { copy: usize },
    /// A RoPE's output, its input a head permute's destination.
    Rope { rope: usize, copy: usize },
}

/// A walk of head-major `[.., H, .., T, .., Dh]` (the axes of extent over 1 in that order, `Heads::permuted_by`
/// checked the permute) as one of token-major `[.., T, .., H, .., Dh]`: the head and row axes swapped, with
/// their strides.
fn rows_before_heads(walk: &Walk) -> Walk {
    let wide: Vec<usize> = (0..walk.dims.len()).filter(|&d| walk.dims[d] > 1).collect();
    let mut w = walk.clone();
    if let [h, t, _] = wide[..] {
        w.dims.swap(h, t);
        w.a.swap(h, t);
        w.b.swap(h, t);
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The permute of 5 rows of 3 heads of 4 values to head-major and back is recognised (extent-1 axes
    /// aside); a permute of other extents or another order is not; the RoPE's walk swaps rows and heads.
    #[test]
    fn head_permutes_are_recognised_by_their_walks() {
        let heads = Heads { rows: 5, heads: 3, dh: 4 };
        let to_head_major = Walk { dims: vec![1, 3, 5, 4], a: vec![60, 4, 12, 1], b: vec![60, 20, 4, 1] };
        let back = Walk { dims: vec![1, 5, 3, 4], a: vec![60, 4, 20, 1], b: vec![60, 12, 4, 1] };
        assert!(heads.permuted_by(&to_head_major, true));
        assert!(heads.permuted_by(&back, false));
        assert!(!heads.permuted_by(&to_head_major, false));
        assert!(!heads.permuted_by(&back, true));
        assert!(!Heads { rows: 3, heads: 5, dh: 4 }.permuted_by(&to_head_major, true));
        let rope = Walk { dims: vec![1, 3, 5, 4], a: vec![0, 0, 4, 1], b: vec![0, 0, 4, 1] };
        assert_eq!(
            rows_before_heads(&rope),
            Walk { dims: vec![1, 5, 3, 4], a: vec![0, 4, 0, 1], b: vec![0, 4, 0, 1] }
        );
    }
}
