//! RMS norm as an export spells it in f32 (Gemma 2's `Gemma2RMSNorm`, its `(1 + w)` folded by the exporter
//! into one f32 constant): `(x' * rsqrt(mean(x'^2) + eps)) * g`, with `x' = cast(x, f32)` and the result
//! cast back to `x`'s type `T` in a half model, `x' = x` in an f32 one; read as the one RMS norm of `x` it is
//! ([`super::Norm`]), then fused into the next GEMV like any norm. The gain is a constant along the row:
//! `cast(w, f32)` of a constant of type `T` (read as `w`: the cast is exact), or an f32 constant only the
//! norm reads, which a half model's kernels read converted to `T` once at init ([`super::Plan::dtypes`]; the
//! one rounding the fusion adds, half an ulp of `T` on each gain). The match is structural, from the last op
//! back: every intermediate read only there (the row in f32 by its square and its product), `eps` a scalar
//! constant, the mean over the row.

use ref_graph::{Data, ElemType, Op, TensorId};

use super::fast::Lowering;
use super::layer_norm::{Parts, Rms};

/// One spelled RMS norm: the op it replaces (lowered as the norm: the final cast, or in f32 the product by the
/// gain), the ops before it that it absorbs, its input, output, gain and epsilon, and the type the kernels
/// read the gain in when it is not the graph's (an f32 gain of a half model).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct SpelledRms {
    pub last: usize,
    pub absorbed: Vec<usize>,
    pub x: TensorId,
    pub out: TensorId,
    pub gain: TensorId,
    pub retyped: Option<ElemType>,
    pub eps: f32,
    /// Whether the norm's input is the f32 row itself (read twice by the spelling, once by the norm).
    pub reads_twice: bool,
}

/// Every spelled RMS norm of the graph `l` lowers: the half forms (between casts) first, then the f32 forms
/// that are not a half form's inner part.
pub(super) fn find(l: &Lowering<'_>) -> Vec<SpelledRms> {
    let parts = Parts { l, producer: l.producers() };
    let ops = l.graph.ops();
    let half: Vec<SpelledRms> = ops
        .iter()
        .enumerate()
        .filter_map(|(i, op)| match *op {
            Op::Cast { input, dtype: dtype @ (ElemType::F16 | ElemType::Bf16), out } => {
                between_casts(&parts, i, input, dtype, out)
            }
            _ => None,
        })
        .collect();
    let inner = |i: usize| half.iter().any(|n| n.absorbed.contains(&i));
    let plain: Vec<SpelledRms> = ops
        .iter()
        .enumerate()
        .filter(|&(i, op)| matches!(op, Op::Mul { .. }) && !inner(i))
        .filter_map(|(i, _)| in_f32(&parts, i))
        .collect();
    half.into_iter().chain(plain).collect()
}

/// `out = cast(scaled, dtype)` at op `last`, `scaled` the norm of `x' = cast(x, f32)`.
fn between_casts(
    parts: &Parts<'_, '_>,
    last: usize,
    scaled: TensorId,
    dtype: ElemType,
    out: TensorId,
) -> Option<SpelledRms> {
    let l = parts.l;
    let (i_scale, _) = parts.made(scaled, 1)?;
    let body = body(parts, i_scale, dtype)?;
    // The row in f32: read by its square and by the product with the reciprocal deviation.
    let (i_cast, &Op::Cast { input: x, .. }) = parts.made(body.xf, 2)? else { return None };
    let tx = l.graph.tensor(x);
    if tx.dtype != dtype || tx.shape != l.graph.tensor(out).shape {
        return None;
    }
    let mut absorbed = body.absorbed;
    absorbed.extend([i_scale, i_cast]);
    let (gain, retyped, eps) = (body.gain, body.retyped, body.eps);
    Some(SpelledRms { last, absorbed, x, out, gain, retyped, eps, reads_twice: false })
}

/// The f32 form at op `last`, the product by the gain.
fn in_f32(parts: &Parts<'_, '_>, last: usize) -> Option<SpelledRms> {
    let l = parts.l;
    let out = l.graph.ops()[last].output();
    let body = body(parts, last, ElemType::F32)?;
    let (gain, retyped, eps) = (body.gain, body.retyped, body.eps);
    let x = body.xf;
    let absorbed = body.absorbed;
    Some(SpelledRms { last, absorbed, x, out, gain, retyped, eps, reads_twice: true })
}

/// The ops of `scaled = (xf * rsqrt(mean(xf^2) + eps)) * g` before the product by the gain, the f32 row
/// `xf`, the gain and epsilon.
struct Body {
    absorbed: Vec<usize>,
    xf: TensorId,
    gain: TensorId,
    retyped: Option<ElemType>,
    eps: f32,
}

/// [`Body`] of the norm whose product by the gain is op `i_scale`, for a model of type `dtype`.
fn body(parts: &Parts<'_, '_>, i_scale: usize, dtype: ElemType) -> Option<Body> {
    let l = parts.l;
    let &Op::Mul { a, b, out: scaled } = &l.graph.ops()[i_scale] else { return None };
    let shape = &l.graph.tensor(scaled).shape;
    let dim = *shape.last()? as usize;
    let (gf, normed) = Parts::either(a, b, |id| gain_of(parts, id, dtype, dim).is_some())?;
    let (gain, retyped, i_gcast) = gain_of(parts, gf, dtype, dim)?;
    let Rms { ops, row: xf, var, eps } = parts.rms(normed)?;
    let txf = l.graph.tensor(xf);
    // One mean a row: the row's shape with a last extent of 1.
    let mut row_mean = shape.clone();
    *row_mean.last_mut()? = 1;
    if txf.dtype != ElemType::F32 || &txf.shape != shape || l.graph.tensor(var).shape != row_mean {
        return None;
    }
    let mut absorbed = ops.to_vec();
    absorbed.extend(i_gcast);
    Some(Body { absorbed, xf, gain, retyped, eps })
}

/// The gain `id` of a norm of a `dtype` model's rows of `dim`: `cast(w, f32)` of a constant `w` of `dtype`
/// (then `w` and the cast), or an f32 constant only the norm reads (then the type the kernels read it in, if
/// not f32).
fn gain_of(
    parts: &Parts<'_, '_>,
    id: TensorId,
    dtype: ElemType,
    dim: usize,
) -> Option<(TensorId, Option<ElemType>, Option<usize>)> {
    if dtype != ElemType::F32 {
        if let Some((w, i_cast)) = parts.cast_constant(id, dtype, dim) {
            return Some((w, None, Some(i_cast)));
        }
    }
    let l = parts.l;
    let t = l.graph.tensor(id);
    let row = t.numel() == dim && t.shape.last() == Some(&(dim as u64));
    let f32_constant = matches!(l.graph.constant(id), Some(Data::F32(_)));
    let retyped = (dtype != ElemType::F32).then_some(dtype);
    // A converted gain is the norm's own: nothing else may read the constant as the graph stores it.
    let own = retyped.is_none() || (l.private(id) && !l.is_output(id));
    (f32_constant && row && own).then_some((id, retyped, None))
}
