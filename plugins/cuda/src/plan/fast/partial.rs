//! A partial rotary (GPT-NeoX, Phi, StableLM rotate only the first columns of each head), as an export spells
//! it: `concat(rope(x[.., :rot]), x[.., rot:])` along the head's axis, `x` a product of the GEMV. Read as the
//! product stored rotated in those columns ([`RopeTables::head`] wider than the rotation), so the slices, the
//! RoPE and the concat are no launch and the cache writes fuse into the GEMV as for a full rotation.

use ref_graph::{Op, TensorId};

use super::Lowering;
use crate::plan::rope::Rope;
use crate::plan::{GemvMat, RopeTables};

/// One product's partial rotary: the ops it takes (the two slices, the RoPE's add, the concat), the RoPE,
/// and the concat's output (the product's new home).
struct Partial {
    ops: [usize; 4],
    rope: Rope,
    out: TensorId,
    tables: RopeTables,
}

impl Lowering<'_> {
    /// Every product of `mats` (one row) that a partial rotary reads, stored rotated: the tables, if any did.
    pub(super) fn partial_rotary(&mut self, mats: &mut [GemvMat], m: u32) -> Option<RopeTables> {
        let mut tables: Option<RopeTables> = None;
        let mut start = 0;
        for mat in mats.iter_mut() {
            let even = start % 2 == 0;
            start += mat.n;
            let plain = !mat.roped && mat.residual.is_none() && mat.cache.is_none();
            let Some(p) = self.partial_of(mat).filter(|_| plain && even && m == 1) else { continue };
            if tables.is_some_and(|t| t != p.tables) || mat.n % p.tables.head != 0 {
                continue;
            }
            tables = Some(p.tables);
            for &i in p.ops.iter().chain(&p.rope.absorbed) {
                self.absorbed[i] = true;
            }
            // The slices, the RoPE and the product are never stored: the concat's storage is the product's.
            self.rehome(p.rope.out, p.out);
            self.rehome(mat.y, p.out);
            for i in [p.ops[0], p.ops[1]] {
                self.rehome(self.graph.ops()[i].output(), p.out);
            }
            mat.y = p.out;
            mat.roped = true;
        }
        tables
    }

    /// Whether a partial rotary reads `mat`'s product ([`Lowering::partial_rotary`] would store it rotated).
    pub(super) fn has_partial_rotary(&self, mat: &GemvMat) -> bool {
        self.partial_of(mat).is_some()
    }

    /// The ops of a partial rotary of `mat`'s product, when they are all that read it and its parts.
    fn partial_of(&self, mat: &GemvMat) -> Option<Partial> {
        let graph = self.graph;
        let readers = |id: TensorId| self.live_readers(id);
        let slices = readers(mat.y);
        let [s1, s2] = slices[..] else { return None };
        let slice = |i: usize| match graph.ops()[i] {
            Op::Slice { input, axis, start, end, out } => Some((input, axis, start, end, out)),
            _ => None,
        };
        let (mut a, mut b) = (slice(s1)?, slice(s2)?);
        if a.2 != 0 {
            std::mem::swap(&mut a, &mut b);
        }
        let shape = self.shape(a.0);
        let (last, head) = ((shape.len() - 1) as u64, *shape.last()?);
        let rot = a.3;
        let cut = a.1 == last && b.1 == last && a.2 == 0 && b.2 == rot && b.3 == head && rot < head;
        if !cut || !self.same(a.0, b.0) || rot % 2 != 0 {
            return None;
        }
        let rope = self.ropes.iter().find(|r| self.same(r.x, a.4) && 2 * r.half == rot)?.clone();
        // The rotated part is read by the RoPE's own ops alone, the pass-through part and the RoPE by the concat.
        let rope_ops = |i: usize| i == rope.add || rope.absorbed.contains(&i);
        let concat = readers(rope.out);
        let [c] = concat[..] else { return None };
        let Op::Concat { a: x, b: y, axis, out } = graph.ops()[c] else { return None };
        let whole = axis == last && self.shape(out).last() == Some(&head);
        let parts = self.same(x, rope.out) && self.same(y, b.4) && readers(b.4) == [c];
        if !whole || !parts || !readers(a.4).into_iter().all(rope_ops) {
            return None;
        }
        let dtype = graph.tensor(mat.y).dtype;
        let one_row = |id: TensorId| {
            let t = graph.tensor(id);
            t.dtype == dtype && t.numel() as u64 == rot && t.shape.last() == Some(&rot)
        };
        if !one_row(rope.cos) || !one_row(rope.sin) || graph.tensor(out).dtype != dtype {
            return None;
        }
        let value = |id: TensorId| self.canon.value[id.0];
        let half = u32::try_from(rope.half).ok()?;
        let tables =
            RopeTables { cos: value(rope.cos), sin: value(rope.sin), half, head: u32::try_from(head).ok()? };
        Some(Partial { ops: [s1, s2, rope.add, c], rope, out, tables })
    }
}
