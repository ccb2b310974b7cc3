//! Rotate-half RoPE as one step: `out = x * cos + rotate_half(x) * sin`, where `rotate_half(x)` is
//! `concat(-x[.., half..], x[.., ..half])` along the last axis, as Hugging Face writes it and the Python
//! lowering emits it (seven ops, in whatever order the export traced them). The match is structural: an `Add`
//! of two `Mul`s, one of `x` by a table, the other of that rotation of the same `x` by another table, every
//! intermediate read only there. The fused kernel rounds each product and the sum to the element type, as
//! the seven separate ops do, so the result is the same bits.

use ref_graph::{Op, TensorId, UnaryFn};

use super::fast::Lowering;

/// One RoPE found in a graph: the `Add` it replaces, the six ops before it that it absorbs, its operands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Rope {
    pub add: usize,
    pub absorbed: [usize; 6],
    pub x: TensorId,
    pub cos: TensorId,
    pub sin: TensorId,
    pub out: TensorId,
    pub half: u64,
}

/// The producer of each tensor, and the lowering's rule for an intermediate a fusion may leave unwritten.
struct Parts<'l, 'g> {
    l: &'l Lowering<'g>,
    producer: Vec<Option<usize>>,
}

impl<'g> Parts<'_, 'g> {
    /// The op producing `id` when it is private ([`Lowering::private`]: one reader, not an output).
    fn private(&self, id: TensorId) -> Option<(usize, &'g Op<TensorId>)> {
        let i = self.producer[id.0].filter(|_| self.l.private(id))?;
        Some((i, &self.l.graph.ops()[i]))
    }
}

/// Every RoPE of the graph `l` lowers.
pub(super) fn find(l: &Lowering<'_>) -> Vec<Rope> {
    let parts = Parts { l, producer: l.producers() };
    let sum = |op: &Op<TensorId>| if let Op::Add { a, b, out } = *op { Some((a, b, out)) } else { None };
    l.either_order(sum, |i, a, b, out| matched(&parts, i, a, b, out))
}

/// `out = plain + rotated` at op `add`, `plain = x * cos`, `rotated = rotate_half(x) * sin`.
fn matched(
    parts: &Parts<'_, '_>,
    add: usize,
    plain: TensorId,
    rotated: TensorId,
    out: TensorId,
) -> Option<Rope> {
    let (i_plain, &Op::Mul { a: p, b: q, .. }) = parts.private(plain)? else { return None };
    let (i_rot, &Op::Mul { a: r, b: s, .. }) = parts.private(rotated)? else { return None };
    for (x, cos) in [(p, q), (q, p)] {
        for (rot, sin) in [(r, s), (s, r)] {
            if let Some((half, ops)) = rotation(parts, rot, x) {
                let shape = &parts.l.graph.tensor(x).shape;
                let same = [plain, rotated, out].iter().all(|&t| &parts.l.graph.tensor(t).shape == shape);
                if same {
                    let absorbed = [i_plain, i_rot, ops[0], ops[1], ops[2], ops[3]];
                    return Some(Rope { add, absorbed, x, cos, sin, out, half });
                }
            }
        }
    }
    None
}

/// Whether `rot` is `concat(-x[.., half..], x[.., ..half])` along `x`'s last axis: (half, the four ops).
fn rotation(parts: &Parts<'_, '_>, rot: TensorId, x: TensorId) -> Option<(u64, [usize; 4])> {
    let shape = &parts.l.graph.tensor(x).shape;
    let last = shape.len().checked_sub(1)? as u64;
    let width = *shape.last()?;
    let (i_cat, &Op::Concat { a: neg, b: x1, axis, .. }) = parts.private(rot)? else { return None };
    let (i_neg, &Op::Unary { func: UnaryFn::Neg, input: x2, .. }) = parts.private(neg)? else { return None };
    let (i_x2, &Op::Slice { input: s2, axis: a2, start: h2, end: e2, .. }) = parts.private(x2)? else {
        return None;
    };
    let (i_x1, &Op::Slice { input: s1, axis: a1, start: 0, end: h1, .. }) = parts.private(x1)? else {
        return None;
    };
    let half = width / 2;
    let ok = width % 2 == 0
        && [axis, a1, a2] == [last; 3]
        && parts.l.same(s1, x)
        && parts.l.same(s2, x)
        && (h1, h2, e2) == (half, half, width);
    ok.then_some((half, [i_cat, i_neg, i_x2, i_x1]))
}
