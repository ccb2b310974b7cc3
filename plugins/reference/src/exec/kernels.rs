//! The ops that accumulate: `mat_mul` and `rms_norm` (sums in `f32`, rounded once at store), `positions`, and
//! `argmax` of the last row.

use ref_graph::{Graph, TensorId};

use super::elem::Float;
use super::store::Out;
use super::{Error, Executor, OpAt};

/// The geometry of a `mat_mul`: `k` inner extent, `n` output columns, and whether `b` is stored `[N, K]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatMulShape {
    /// The inner extent.
    pub k: usize,
    /// Output columns.
    pub n: usize,
    /// Whether `b` is `[N, K]` (a `torch.nn.Linear` weight) rather than `[K, N]`.
    pub transpose_b: bool,
}

/// `out[m, n] = sum_k a[m, k] b[k, n] (+ bias[n])` for every row `m` of `a` (its leading axes are more rows),
/// with `b[k, n]` read from `b[n, k]` when transposed. Sums in `f32` (`acc`: at least `n` values of scratch),
/// rounded to `T` once.
pub fn mat_mul<T: Float>(
    a: &[T],
    b: &[T],
    bias: Option<&[T]>,
    shape: MatMulShape,
    acc: &mut [f32],
    out: &mut [T],
) {
    let MatMulShape { k, n, transpose_b } = shape;
    let acc = &mut acc[..n];
    let mut rows = a.chunks_exact(k).zip(out.chunks_exact_mut(n));
    if transpose_b {
        while let Some(group) = next_group(&mut rows) {
            four_rows(group, b, bias, k);
        }
    }
    for (a_row, out_row) in rows {
        if transpose_b {
            for (s, b_row) in acc.iter_mut().zip(b.chunks_exact(k)) {
                *s = a_row.iter().zip(b_row).map(|(x, y)| x.to_f32() * y.to_f32()).sum();
            }
        } else {
            acc.fill(0.0);
            for (a_mk, b_row) in a_row.iter().zip(b.chunks_exact(n)) {
                let a_mk = a_mk.to_f32();
                for (s, b_kn) in acc.iter_mut().zip(b_row) {
                    *s += a_mk * b_kn.to_f32();
                }
            }
        }
        for (j, (o, s)) in out_row.iter_mut().zip(acc.iter()).enumerate() {
            *o = T::from_f32(s + bias.map_or(0.0, |bias| bias[j].to_f32()));
        }
    }
}

/// Rows of `a` with their rows of `out`, as `mat_mul` walks them.
type RowPair<'r, T> = (&'r [T], &'r mut [T]);

/// The next four rows of `rows`, or `None` when fewer are left (taking none: they stay for the row-at-a-time
/// loop).
fn next_group<'r, T>(
    rows: &mut impl ExactSizeIterator<Item = RowPair<'r, T>>,
) -> Option<[RowPair<'r, T>; 4]> {
    if rows.len() < 4 {
        return None;
    }
    Some([rows.next()?, rows.next()?, rows.next()?, rows.next()?])
}

/// Four rows of a product with a `[N, K]` weight at once: each weight row is read once for the four, and the
/// four sums are independent chains the CPU overlaps (a prefill's chunk of rows, several times faster than a
/// row at a time). Each sum is still its own row's sum from `-0.0` in order of `k`, as `Iterator::sum` adds,
/// so every output has the bits the row-at-a-time loop gives it.
fn four_rows<T: Float>(group: [RowPair<'_, T>; 4], b: &[T], bias: Option<&[T]>, k: usize) {
    let [(a0, o0), (a1, o1), (a2, o2), (a3, o3)] = group;
    for (j, b_row) in b.chunks_exact(k).enumerate() {
        let mut s = [-0.0f32; 4];
        for ((((w, x0), x1), x2), x3) in b_row.iter().zip(a0).zip(a1).zip(a2).zip(a3) {
            let w = w.to_f32();
            s[0] += x0.to_f32() * w;
            s[1] += x1.to_f32() * w;
            s[2] += x2.to_f32() * w;
            s[3] += x3.to_f32() * w;
        }
        let add = bias.map_or(0.0, |bias| bias[j].to_f32());
        for (o, s) in [&mut *o0, &mut *o1, &mut *o2, &mut *o3].into_iter().zip(s) {
            o[j] = T::from_f32(s + add);
        }
    }
}

/// `out[m, :] = x[m, :] / sqrt(mean(x[m, :]^2) + eps) * weight` over rows of `weight.len()` columns, in `f32`.
pub fn rms_norm<T: Float>(x: &[T], weight: &[T], eps: f32, out: &mut [T]) {
    let cols = weight.len();
    for (x_row, out_row) in x.chunks_exact(cols).zip(out.chunks_exact_mut(cols)) {
        let mean_square = x_row.iter().map(|v| v.to_f32() * v.to_f32()).sum::<f32>() / cols as f32;
        let scale = 1.0 / (mean_square + eps).sqrt();
        for ((o, v), w) in out_row.iter_mut().zip(x_row).zip(weight) {
            *o = T::from_f32(v.to_f32() * scale * w.to_f32());
        }
    }
}

/// `out[t] = start + t`; `None` when that overflows `i64`.
pub fn positions(start: i64, out: &mut [i64]) -> Option<()> {
    for (t, o) in out.iter_mut().enumerate() {
        *o = i64::try_from(t).ok().and_then(|t| start.checked_add(t))?;
    }
    Some(())
}

impl Executor {
    pub(super) fn mat_mul(
        &mut self,
        graph: &Graph,
        [a, b]: [TensorId; 2],
        transpose_b: bool,
        bias: Option<TensorId>,
        mut out: Out<'_>,
    ) -> Result<(), Error> {
        let sb = &graph.tensor(b).shape;
        let (k, n) = if transpose_b { (sb[1], sb[0]) } else { (sb[0], sb[1]) };
        let shape = MatMulShape { k: k as usize, n: n as usize, transpose_b };
        let (t, acc) = (&self.tensors, &mut self.work.row);
        with_float!(out.decl.dtype, T => {
            let bias = bias.map(|id| t.read::<T>(graph, id)).transpose()?;
            mat_mul::<T>(t.read(graph, a)?, t.read(graph, b)?, bias, shape, acc, out.typed()?);
            Ok(())
        })
    }

    pub(super) fn rms_norm(
        &self,
        graph: &Graph,
        input: TensorId,
        weight: TensorId,
        eps: f32,
        mut out: Out<'_>,
    ) -> Result<(), Error> {
        let t = &self.tensors;
        with_float!(out.decl.dtype, T => {
            rms_norm::<T>(t.read(graph, input)?, t.read(graph, weight)?, eps, out.typed()?);
            Ok(())
        })
    }

    pub(super) fn positions(
        &self,
        graph: &Graph,
        at: OpAt<'_>,
        position: TensorId,
        mut out: Out<'_>,
    ) -> Result<(), Error> {
        let start = self.tensors.read::<i64>(graph, position)?.first().copied().unwrap_or(0);
        let out = out.typed::<i64>()?;
        positions(start, out).ok_or_else(|| Error::PositionOutOfRange {
            tensor: graph.tensor(position).name.clone(),
            position: start,
            op_index: at.index,
            op: at.op.name(),
            rows: out.len(),
            len: usize::MAX,
        })
    }

    /// `ref_graph::argmax` of the last row, read to `f32` (exactly) first.
    pub(super) fn argmax(&mut self, graph: &Graph, input: TensorId, mut out: Out<'_>) -> Result<(), Error> {
        let decl = graph.tensor(input);
        let cols = decl.shape.last().copied().unwrap_or(1) as usize;
        let row = &mut self.work.row[..cols];
        let t = &self.tensors;
        let read: Result<(), Error> = with_float!(decl.dtype, T => {
            let values = t.read::<T>(graph, input)?;
            for (r, v) in row.iter_mut().zip(&values[values.len() - cols..]) {
                *r = v.to_f32();
            }
            Ok(())
        });
        read?;
        out.typed::<i64>()?.fill(ref_graph::argmax(row) as i64);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ref_graph::half::{bf16, f16};

    const PLAIN: MatMulShape = MatMulShape { k: 2, n: 3, transpose_b: false };

    #[test]
    fn mat_mul_multiplies_batched_rows_transposed_weights_and_adds_bias() {
        // [[1, 2], [3, 4]] x [[5, 6, 7], [8, 9, 10]]
        let (a, b) = ([1.0f32, 2.0, 3.0, 4.0], [5.0f32, 6.0, 7.0, 8.0, 9.0, 10.0]);
        let mut acc = [0.0; 3];
        let mut out = [0.0f32; 6];
        mat_mul(&a, &b, None, PLAIN, &mut acc, &mut out);
        assert_eq!(out, [21.0, 24.0, 27.0, 47.0, 54.0, 61.0]);
        // The same weight stored [N, K] (nn.Linear), with a bias; `a` as [2, 1, 2] is the same rows.
        let b_t = [5.0f32, 8.0, 6.0, 9.0, 7.0, 10.0];
        let linear = MatMulShape { transpose_b: true, ..PLAIN };
        mat_mul(&a, &b_t, Some(&[1.0, -1.0, 0.5]), linear, &mut acc, &mut out);
        assert_eq!(out, [22.0, 23.0, 27.5, 48.0, 53.0, 61.5]);
    }

    /// Rows taken four at a time give every output the bits of rows taken one at a time: for 1 to 9 rows
    /// (groups and a remainder), f32 and bf16, with and without a bias, a row of negative zeros among them.
    #[test]
    fn rows_taken_four_at_a_time_give_the_bits_of_one_at_a_time() {
        fn check<T: Float + PartialEq + std::fmt::Debug>(from: fn(f32) -> T) {
            let (k, n) = (37, 5);
            let value = |i: usize| from(((i * 7919 % 1013) as f32 - 506.0) / 97.0);
            let b: Vec<T> = (0..n * k).map(|i| value(i + 11)).collect();
            let bias: Vec<T> = (0..n).map(|j| value(j * 3)).collect();
            let shape = MatMulShape { k, n, transpose_b: true };
            for m in 1..=9 {
                let mut a: Vec<T> = (0..m * k).map(value).collect();
                if m == 6 {
                    a.iter_mut().take(k).for_each(|x| *x = from(-0.0));
                }
                for bias in [None, Some(&bias[..])] {
                    let mut all = vec![from(0.0); m * n];
                    mat_mul(&a, &b, bias, shape, &mut vec![0.0; n], &mut all);
                    let one_by_one: Vec<T> = a
                        .chunks_exact(k)
                        .flat_map(|row| {
                            let mut out = vec![from(0.0); n];
                            mat_mul(row, &b, bias, shape, &mut vec![0.0; n], &mut out);
                            out
                        })
                        .collect();
                    let bits = |v: &[T]| v.iter().map(|x| x.to_f32().to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&all), bits(&one_by_one), "{m} rows, bias {}", bias.is_some());
                }
            }
        }
        check::<f32>(|x| x);
        check::<bf16>(bf16::from_f32);
    }

    #[test]
    fn mat_mul_accumulates_in_f32_and_rounds_once() {
        // 2048 + 1 + 1 in f16 step by step stays 2048 (ulp 2 there, ties to even); in f32, 2050 exactly.
        let a = [f16::from_f32(2048.0), f16::ONE, f16::ONE];
        let b = [f16::ONE; 3];
        let mut out = [f16::ZERO];
        mat_mul(&a, &b, None, MatMulShape { k: 3, n: 1, transpose_b: true }, &mut [0.0], &mut out);
        assert_eq!(out[0].to_f32(), 2050.0);
        let a = [bf16::from_f32(256.0), bf16::ONE, bf16::ONE];
        let mut out = [bf16::ZERO];
        mat_mul(
            &a,
            &[bf16::ONE; 3],
            None,
            MatMulShape { k: 3, n: 1, transpose_b: false },
            &mut [0.0],
            &mut out,
        );
        assert_eq!(out[0].to_f32(), 258.0);
    }

    #[test]
    fn rms_norm_normalises_each_row_of_any_rank() {
        let mut out = [0.0; 4];
        rms_norm(&[3.0f32, 4.0, 1.0, 1.0], &[1.0, 2.0], 1e-30, &mut out);
        let rms = (12.5f32).sqrt();
        assert_eq!(out, [3.0 / rms, 8.0 / rms, 1.0, 2.0]);
    }

    #[test]
    fn positions_count_from_the_start_and_refuse_overflow() {
        let mut out = [0i64; 3];
        positions(5, &mut out).expect("fits");
        assert_eq!(out, [5, 6, 7]);
        assert!(positions(i64::MAX - 1, &mut out).is_none());
    }
}
