//! GELU's tanh form as an export spells it in nine ops (GPT-2's and Phi's `NewGELUActivation`):
//! `0.5 x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x * x^2)))`, read as the one `GeluTanh` it is (then
//! fused into the GEMV that computes `x`, like any GELU). The match is structural, from the last product
//! back, in whatever order the export traced the operands: every intermediate read only there, every
//! constant a scalar of its value, every tensor of `x`'s shape and type. The ops' rounding differs from the
//! one function's by an ulp or so of `f32`, well inside what any half type rounds away.

use ref_graph::{Data, Op, TensorId, UnaryFn};

use super::fast::Lowering;

/// One spelled GELU: the product it replaces (lowered as the `GeluTanh`), the eight ops before it that it
/// absorbs, its input and output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Gelu {
    pub last: usize,
    pub absorbed: [usize; 8],
    pub x: TensorId,
    pub out: TensorId,
}

/// The producer of each tensor, and the lowering's rule for an intermediate a fusion may leave unwritten.
struct Parts<'l, 'g> {
    l: &'l Lowering<'g>,
    producer: Vec<Option<usize>>,
}

impl<'g> Parts<'_, 'g> {
    /// The op producing `id` when it is private (one reader, not an output) and of `x`'s shape and type.
    fn private(&self, id: TensorId, x: TensorId) -> Option<(usize, &'g Op<TensorId>)> {
        let (t, tx) = (self.l.graph.tensor(id), self.l.graph.tensor(x));
        let alike = t.shape == tx.shape && t.dtype == tx.dtype;
        let i = self.producer[id.0].filter(|_| alike && self.l.private(id))?;
        Some((i, &self.l.graph.ops()[i]))
    }

    /// Whether `id` is a scalar constant of `value` (to `f32`'s precision).
    fn scalar(&self, id: TensorId, value: f32) -> bool {
        let close = |v: f32| (v - value).abs() <= 1e-6 * value.abs();
        match self.l.graph.constant(id) {
            Some(Data::F32(v)) if v.len() == 1 => close(v[0]),
            Some(Data::F16(v)) if v.len() == 1 => (v[0].to_f32() - value).abs() <= 1e-3 * value.abs(),
            Some(Data::Bf16(v)) if v.len() == 1 => (v[0].to_f32() - value).abs() <= 1e-2 * value.abs(),
            _ => false,
        }
    }

    /// `a * b` where one operand is the scalar `value`: the other.
    fn times(&self, a: TensorId, b: TensorId, value: f32) -> Option<TensorId> {
        if self.scalar(b, value) {
            Some(a)
        } else if self.scalar(a, value) {
            Some(b)
        } else {
            None
        }
    }
}

/// Every spelled GELU of the graph `l` lowers.
pub(super) fn find(l: &Lowering<'_>) -> Vec<Gelu> {
    let parts = Parts { l, producer: l.producers() };
    let product = |op: &Op<TensorId>| if let Op::Mul { a, b, out } = *op { Some((a, b, out)) } else { None };
    l.either_order(product, |i, a, b, out| matched(&parts, i, a, b, out))
}

/// `out = half * shifted` at op `last`, `half = x * 0.5`, `shifted = tanh(..) + 1`.
fn matched(
    parts: &Parts<'_, '_>,
    last: usize,
    half: TensorId,
    shifted: TensorId,
    out: TensorId,
) -> Option<Gelu> {
    let l = parts.l;
    let producer = |id: TensorId| parts.producer[id.0].map(|i| (i, &l.graph.ops()[i]));
    // `half = x * 0.5` names `x`; every other part is checked against it.
    let (i_half, &Op::Mul { a, b, .. }) = producer(half)? else { return None };
    let x = parts.times(a, b, 0.5)?;
    parts.private(half, x)?;
    let (i_shift, &Op::Add { a, b, .. }) = parts.private(shifted, x)? else { return None };
    let t = parts.times(a, b, 1.0)?;
    let (i_tanh, &Op::Unary { func: UnaryFn::Tanh, input: u, .. }) = parts.private(t, x)? else {
        return None;
    };
    let (i_u, &Op::Mul { a, b, .. }) = parts.private(u, x)? else { return None };
    let v = parts.times(a, b, (2.0 / std::f32::consts::PI).sqrt())?;
    let (i_v, &Op::Add { a, b, .. }) = parts.private(v, x)? else { return None };
    let w = if l.same(a, x) {
        b
    } else if l.same(b, x) {
        a
    } else {
        return None;
    };
    let (i_w, &Op::Mul { a, b, .. }) = parts.private(w, x)? else { return None };
    let cube = parts.times(a, b, 0.044_715)?;
    let (i_cube, &Op::Mul { a, b, .. }) = parts.private(cube, x)? else { return None };
    let sq = if l.same(a, x) {
        b
    } else if l.same(b, x) {
        a
    } else {
        return None;
    };
    let (i_sq, &Op::Unary { func: UnaryFn::Square, input, .. }) = parts.private(sq, x)? else { return None };
    let shape = |id: TensorId| (&l.graph.tensor(id).shape, l.graph.tensor(id).dtype);
    if !l.same(input, x) || l.same(sq, x) || shape(out) != shape(x) {
        return None;
    }
    Some(Gelu { last, absorbed: [i_half, i_shift, i_tanh, i_u, i_v, i_w, i_cube, i_sq], x, out })
}
