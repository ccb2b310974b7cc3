//! LayerNorm as a half-type export spells it, in f32 between casts (GPT-NeoX's and Phi's `nn.LayerNorm` in
//! f16 or bf16): `cast((c * rsqrt(mean(c^2) + eps)) * cast(w) + cast(b), T)` with `c = x' - mean(x')`,
//! `x' = cast(x, f32)`, read as the one LayerNorm of `x` it is ([`super::Norm`], gain `w` and bias `b` as the
//! model stores them: the casts to f32 are exact), then fused into the next GEMV like any norm. The match is
//! structural, from the last cast back: every intermediate read only there (the centred row by its square
//! and its product), `eps` a scalar constant, `w` and `b` constants of `x`'s type along the row.

use ref_graph::{Data, ElemType, Op, TensorId, UnaryFn};

use super::fast::Lowering;

/// One spelled LayerNorm: the cast it replaces (lowered as the norm), the ops before it that it absorbs
/// (the casts of the gain and bias too), its input, output, gain, bias and epsilon.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct SpelledNorm {
    pub last: usize,
    pub absorbed: Vec<usize>,
    pub x: TensorId,
    pub out: TensorId,
    pub gain: TensorId,
    pub bias: TensorId,
    pub eps: f32,
}

/// The producer of each tensor, with the rules the spelled norms ([`super::rms_norm`] too) match by.
pub(super) struct Parts<'l, 'g> {
    pub l: &'l Lowering<'g>,
    pub producer: Vec<Option<usize>>,
}

impl<'g> Parts<'_, 'g> {
    /// The op producing `id`, an f32 tensor read `readers` times and no output.
    pub(super) fn made(&self, id: TensorId, readers: usize) -> Option<(usize, &'g Op<TensorId>)> {
        let f32_of = self.l.graph.tensor(id).dtype == ElemType::F32;
        let read = self.l.uses(id) == readers && !self.l.is_output(id);
        let i = self.producer[id.0].filter(|_| f32_of && read)?;
        Some((i, &self.l.graph.ops()[i]))
    }

    /// `a op b` where one operand satisfies `pick`: (that operand, the other).
    pub(super) fn either(
        a: TensorId,
        b: TensorId,
        pick: impl Fn(TensorId) -> bool,
    ) -> Option<(TensorId, TensorId)> {
        if pick(a) {
            Some((a, b))
        } else if pick(b) {
            Some((b, a))
        } else {
            None
        }
    }

    /// `id = cast(c, f32)` of a constant `c` of `dtype` holding `n` values, read only here: (c, the cast).
    pub(super) fn cast_constant(&self, id: TensorId, dtype: ElemType, n: usize) -> Option<(TensorId, usize)> {
        let (i, &Op::Cast { input, .. }) = self.made(id, 1)? else { return None };
        let t = self.l.graph.tensor(input);
        let fits = t.dtype == dtype && t.numel() == n && t.shape.last() == Some(&(n as u64));
        (self.l.graph.constant(input).is_some() && fits).then_some((input, i))
    }

    /// The value of a scalar f32 constant.
    pub(super) fn scalar(&self, id: TensorId) -> Option<f32> {
        match self.l.graph.constant(id) {
            Some(Data::F32(v)) if v.len() == 1 => Some(v[0]),
            _ => None,
        }
    }

    /// `normed = row * rsqrt(mean(row^2) + eps)` (either order of each operand pair), every intermediate f32
    /// and read once, `eps` a scalar constant: the five ops (the product first), `row` and `eps`. The caller
    /// checks what reads `row`.
    pub(super) fn rms(&self, normed: TensorId) -> Option<Rms> {
        let (i_norm, &Op::Mul { a, b, .. }) = self.made(normed, 1)? else { return None };
        let rstd_of =
            |id: TensorId| matches!(self.made(id, 1), Some((_, Op::Unary { func: UnaryFn::Rsqrt, .. })));
        let (rstd, row) = Parts::either(a, b, rstd_of)?;
        let (i_rstd, &Op::Unary { input: var_eps, .. }) = self.made(rstd, 1)? else { return None };
        let (i_eps, &Op::Add { a, b, .. }) = self.made(var_eps, 1)? else { return None };
        let (eps_id, var) = Parts::either(a, b, |id| self.scalar(id).is_some())?;
        let eps = self.scalar(eps_id)?;
        let (i_var, &Op::Mean { input: squared, .. }) = self.made(var, 1)? else { return None };
        let (i_sq, &Op::Unary { func: UnaryFn::Square, input, .. }) = self.made(squared, 1)? else {
            return None;
        };
        let one_row = self.l.same(input, row);
        one_row.then_some(Rms { ops: [i_norm, i_rstd, i_eps, i_var, i_sq], row, var, eps })
    }
}

/// A row's RMS normalisation as ops spell it ([`Parts::rms`]): its ops, the row, its mean square and `eps`.
pub(super) struct Rms {
    pub ops: [usize; 5],
    pub row: TensorId,
    pub var: TensorId,
    pub eps: f32,
}

/// Every spelled LayerNorm of the graph `l` lowers.
pub(super) fn find(l: &Lowering<'_>) -> Vec<SpelledNorm> {
    let parts = Parts { l, producer: l.producers() };
    l.graph
        .ops()
        .iter()
        .enumerate()
        .filter_map(|(i, op)| match *op {
            Op::Cast { input, dtype: dtype @ (ElemType::F16 | ElemType::Bf16), out } => {
                matched(&parts, i, input, dtype, out)
            }
            _ => None,
        })
        .collect()
}

/// `out = cast(biased, dtype)` at op `last`.
fn matched(
    parts: &Parts<'_, '_>,
    last: usize,
    biased: TensorId,
    dtype: ElemType,
    out: TensorId,
) -> Option<SpelledNorm> {
    let l = parts.l;
    let dim = *l.graph.tensor(out).shape.last()? as usize;
    let (i_bias, &Op::Add { a, b, .. }) = parts.made(biased, 1)? else { return None };
    let (bf, scaled) = Parts::either(a, b, |id| parts.cast_constant(id, dtype, dim).is_some())?;
    let (bias, i_bcast) = parts.cast_constant(bf, dtype, dim)?;
    let (i_scale, &Op::Mul { a, b, .. }) = parts.made(scaled, 1)? else { return None };
    let (wf, normed) = Parts::either(a, b, |id| parts.cast_constant(id, dtype, dim).is_some())?;
    let (gain, i_wcast) = parts.cast_constant(wf, dtype, dim)?;
    let Rms { ops, row: centred, eps, .. } = parts.rms(normed)?;
    // The centred row: read by its square and by the product with the reciprocal deviation.
    let (i_sub, &Op::Sub { a: xf, b: mu, .. }) = parts.made(centred, 2)? else { return None };
    let (i_mean, &Op::Mean { input: xf2, .. }) = parts.made(mu, 1)? else { return None };
    // The row in f32: read by its mean and by the subtraction.
    let (i_cast, &Op::Cast { input: x, .. }) = parts.made(xf, 2)? else { return None };
    let tx = l.graph.tensor(x);
    let row_ok = tx.dtype == dtype && tx.shape == l.graph.tensor(out).shape;
    if !l.same(xf2, xf) || !row_ok {
        return None;
    }
    let mut absorbed = vec![i_bias, i_bcast, i_scale, i_wcast, i_sub, i_mean, i_cast];
    absorbed.extend(ops);
    Some(SpelledNorm { last, absorbed, x, out, gain, bias, eps })
}
