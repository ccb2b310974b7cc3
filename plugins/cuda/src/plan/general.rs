//! The general path: one step per op the fast path does not take. Elementwise ops broadcast through a
//! [`Walk`] of at most [`MAX_RANK`] axes; permutes, slices and concats are strided copies; a reshape is an
//! alias (its output gets its input's storage, [`Home::SameAs`]) unless its output is a graph output, which
//! the caller's own storage backs: then it is one contiguous copy. A permute that moves only axes of extent 1
//! (a decode step's head views) is such a reshape. An assign is one contiguous copy of its
//! value into its target, the caller's buffer, which its output is ([`Home::SameAs`]).

use ref_graph::{ElemType, Op, TensorId};

use super::fast::Lowering;
use super::rope::Rope;
use super::{u32_of, BinOp, Home, Step, Unsupported, Walk};
use crate::kernels::general::MAX_RANK;

/// Lowers `op` (any op but the fast path's) to its step.
pub(super) fn lower(l: &mut Lowering<'_>, op: &Op<TensorId>) -> Result<(), Unsupported> {
    let step = match *op {
        Op::Add { a, b, out } => binary(l, BinOp::Add, a, b, out)?,
        Op::Sub { a, b, out } => binary(l, BinOp::Sub, a, b, out)?,
        Op::Mul { a, b, out } => binary(l, BinOp::Mul, a, b, out)?,
        Op::Div { a, b, out } => binary(l, BinOp::Div, a, b, out)?,
        Op::Unary { func, input, out } => {
            Step::Unary { func, input, out, n: numel(l, out), dtype: l.graph.tensor(out).dtype }
        }
        Op::Mean { input, out } => {
            let dim = last(l, input);
            let rows = u32_of(numel(l, input) / dim, "rows")?;
            Step::Mean { input, out, rows, dim: u32_of(dim, "width")?, dtype: l.graph.tensor(out).dtype }
        }
        Op::Cast { input, dtype, out } => {
            Step::Cast { input, out, n: numel(l, out), from: l.graph.tensor(input).dtype, to: dtype }
        }
        Op::Reshape { input, out, .. } => match reshape(l, input, out)? {
            Some(step) => step,
            None => return Ok(()),
        },
        Op::Permute { input, ref dims, out } if keeps_memory_order(l.shape(input), dims) => {
            match reshape(l, input, out)? {
                Some(step) => step,
                None => return Ok(()),
            }
        }
        Op::Permute { input, ref dims, out } => permute(l, input, dims, out)?,
        Op::Slice { input, axis, start, out, .. } => slice(l, input, axis as usize, start, out)?,
        Op::Concat { a, b, axis, out } => {
            let (first, second) = concat(l, a, b, axis as usize, out)?;
            l.steps.push(first);
            second
        }
        Op::Assign { target, value, out } => {
            // The output is the target's storage (the caller's buffer); the value is copied into it.
            l.homes[out.0] = Home::SameAs(target);
            copy_all(l, value, out)
        }
        ref other => {
            return Err(Unsupported(format!(
                "op '{}' writing '{}' in this form is not run by the CUDA delegate",
                other.name(),
                l.graph.tensor(other.output()).name
            )))
        }
    };
    l.steps.push(step);
    Ok(())
}

fn numel(l: &Lowering<'_>, id: TensorId) -> u64 {
    l.graph.tensor(id).numel() as u64
}

fn last(l: &Lowering<'_>, id: TensorId) -> u64 {
    l.shape(id).last().copied().unwrap_or(1).max(1)
}

/// Row-major element strides of `shape`.
pub(super) fn strides(shape: &[u64]) -> Vec<u64> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

fn check_rank(l: &Lowering<'_>, id: TensorId) -> Result<(), Unsupported> {
    let t = l.graph.tensor(id);
    if t.shape.len() > MAX_RANK {
        return Err(Unsupported(format!(
            "tensor '{}' has rank {}; the CUDA delegate's strided kernels take at most {MAX_RANK} axes",
            t.name,
            t.shape.len()
        )));
    }
    Ok(())
}

/// A matched RoPE as its one step (`cos` and `sin` broadcast to `x` through a walk).
pub(super) fn rope(l: &Lowering<'_>, r: &Rope) -> Result<Step, Unsupported> {
    l.float(r.out)?;
    let walk = broadcast(l, r.out, r.cos, r.sin)?;
    let dtype = l.graph.tensor(r.out).dtype;
    let half = u32_of(r.half, "rotary half width")?;
    Ok(Step::Rope { x: r.x, cos: r.cos, sin: r.sin, out: r.out, dtype, half, walk })
}

/// The walk of `out` (contiguous) over operands `a` and `b` broadcast to it (NumPy's rule: shapes aligned
/// at the last axis; a missing axis or an extent of 1 where `out`'s is larger has stride 0).
pub(super) fn broadcast(
    l: &Lowering<'_>,
    out: TensorId,
    a: TensorId,
    b: TensorId,
) -> Result<Walk, Unsupported> {
    check_rank(l, out)?;
    let dims = l.shape(out).to_vec();
    let operand = |id: TensorId| {
        let shape = l.shape(id);
        let own = strides(shape);
        let skip = dims.len() - shape.len().min(dims.len());
        (0..dims.len())
            .map(|d| match d.checked_sub(skip) {
                Some(j) if shape[j] == dims[d] => own[j],
                _ => 0,
            })
            .collect()
    };
    Ok(Walk { a: operand(a), b: operand(b), dims })
}

fn binary(l: &Lowering<'_>, op: BinOp, a: TensorId, b: TensorId, out: TensorId) -> Result<Step, Unsupported> {
    let dtype = l.graph.tensor(out).dtype;
    if dtype == ElemType::I64 && op == BinOp::Div {
        return Err(Unsupported(format!(
            "'{}' divides i64 values; the CUDA delegate divides floats only",
            l.graph.tensor(out).name
        )));
    }
    Ok(Step::Binary { op, a, b, out, dtype, walk: broadcast(l, out, a, b)? })
}

/// A contiguous copy of all of `src` into `dst` (same element count and type).
fn copy_all(l: &Lowering<'_>, src: TensorId, dst: TensorId) -> Step {
    let n = numel(l, src);
    Step::Copy {
        src,
        dst,
        elem: elem(l, src),
        walk: Walk { dims: vec![n], a: vec![1], b: vec![1] },
        src_off: 0,
        dst_off: 0,
    }
}

fn elem(l: &Lowering<'_>, id: TensorId) -> u32 {
    l.graph.tensor(id).dtype.size_bytes() as u32
}

/// No step when `out` can be `input`'s storage; a copy when `out` is a graph output (caller storage).
fn reshape(l: &mut Lowering<'_>, input: TensorId, out: TensorId) -> Result<Option<Step>, Unsupported> {
    if l.is_output(out) {
        return Ok(Some(copy_all(l, input, out)));
    }
    l.homes[out.0] = Home::SameAs(Home::root(&l.homes, input));
    Ok(None)
}

/// Whether permuting `shape` by `dims` leaves every element where it is: the axes longer than 1 keep their
/// order (a decode step's `[1, 1, H, Dh]` to `[1, H, 1, Dh]` head view). Such a permute is a reshape.
pub(super) fn keeps_memory_order(shape: &[u64], dims: &[u64]) -> bool {
    let moved: Vec<u64> =
        dims.iter().copied().filter(|&d| shape.get(d as usize).is_some_and(|&n| n > 1)).collect();
    moved.windows(2).all(|w| w[0] < w[1])
}

fn permute(l: &Lowering<'_>, input: TensorId, dims: &[u64], out: TensorId) -> Result<Step, Unsupported> {
    check_rank(l, input)?;
    let own = strides(l.shape(input));
    let walk = Walk {
        dims: l.shape(out).to_vec(),
        a: dims.iter().map(|&d| own[d as usize]).collect(),
        b: strides(l.shape(out)),
    };
    Ok(Step::Copy { src: input, dst: out, elem: elem(l, input), walk, src_off: 0, dst_off: 0 })
}

fn slice(
    l: &Lowering<'_>,
    input: TensorId,
    axis: usize,
    start: u64,
    out: TensorId,
) -> Result<Step, Unsupported> {
    check_rank(l, input)?;
    let own = strides(l.shape(input));
    let src_off = start * own[axis];
    let walk = Walk { dims: l.shape(out).to_vec(), a: own, b: strides(l.shape(out)) };
    Ok(Step::Copy { src: input, dst: out, elem: elem(l, input), walk, src_off, dst_off: 0 })
}

/// Two copies: `a` into the front of `out` along `axis`, `b` after it.
fn concat(
    l: &Lowering<'_>,
    a: TensorId,
    b: TensorId,
    axis: usize,
    out: TensorId,
) -> Result<(Step, Step), Unsupported> {
    check_rank(l, out)?;
    let dst = strides(l.shape(out));
    let part = |src: TensorId, dst_off: u64| Step::Copy {
        src,
        dst: out,
        elem: elem(l, src),
        walk: Walk { dims: l.shape(src).to_vec(), a: strides(l.shape(src)), b: dst.clone() },
        src_off: 0,
        dst_off,
    };
    Ok((part(a, 0), part(b, l.shape(a)[axis] * dst[axis])))
}
