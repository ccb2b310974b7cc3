//! Elementwise ops: `add`, `sub`, `mul`, `div` with broadcasting, `unary`, `mean` over the last axis, and
//! `cast`. Floats compute in `f32` and round at store ([`Float`]); `i64` `add`, `sub` and `mul` wrap.

use ref_graph::{ElemType, Graph, TensorId, UnaryFn};

use super::elem::{float_to_i64, Float};
use super::store::{Out, Values, ValuesMut};
use super::walk::Walk;
use super::{invariant, Error, Executor, Plan};

/// The arithmetic of a binary elementwise op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arith {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b` (IEEE: `x / 0` is infinite or NaN). Floats only.
    Div,
}

impl Arith {
    fn f32(self, x: f32, y: f32) -> f32 {
        match self {
            Arith::Add => x + y,
            Arith::Sub => x - y,
            Arith::Mul => x * y,
            Arith::Div => x / y,
        }
    }

    /// The wrapping `i64` arithmetic, or `None` for `Div` (which `i64` operands do not take).
    fn i64(self) -> Option<fn(i64, i64) -> i64> {
        match self {
            Arith::Add => Some(i64::wrapping_add),
            Arith::Sub => Some(i64::wrapping_sub),
            Arith::Mul => Some(i64::wrapping_mul),
            Arith::Div => None,
        }
    }
}

/// `out = a (arith) b`, broadcast by `walk`, computed in `f32` and rounded to `T`.
pub fn binary_float<T: Float>(arith: Arith, a: &[T], b: &[T], walk: &Walk<2>, out: &mut [T]) {
    walk.for_each(|o, [i, j]| out[o] = T::from_f32(arith.f32(a[i].to_f32(), b[j].to_f32())));
}

/// `out = f(a, b)` over `i64`, broadcast by `walk`.
pub fn binary_i64(f: fn(i64, i64) -> i64, a: &[i64], b: &[i64], walk: &Walk<2>, out: &mut [i64]) {
    walk.for_each(|o, [i, j]| out[o] = f(a[i], b[j]));
}

/// `out = func(x)`, elementwise, by [`UnaryFn::apply`].
pub fn unary<T: Float>(func: UnaryFn, x: &[T], out: &mut [T]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = T::from_f32(func.apply(v.to_f32()));
    }
}

/// `out[r] = mean(x[r, ..cols])` for each row of `cols` values, summed in `f32`.
pub fn mean<T: Float>(x: &[T], cols: usize, out: &mut [T]) {
    for (row, o) in x.chunks_exact(cols).zip(out.iter_mut()) {
        *o = T::from_f32(row.iter().map(|v| v.to_f32()).sum::<f32>() / cols as f32);
    }
}

/// `out = input` converted by [`ref_graph::Op::Cast`]'s rules; `None` if the two lengths differ.
pub fn cast(input: Values<'_>, out: ValuesMut<'_>) -> Option<()> {
    match out {
        ValuesMut::F32(out) => cast_to_float(input, out),
        ValuesMut::F16(out) => cast_to_float(input, out),
        ValuesMut::Bf16(out) => cast_to_float(input, out),
        ValuesMut::I64(out) => match input {
            Values::I64(x) => convert(x, out, |v| v),
            Values::F32(x) => convert(x, out, float_to_i64),
            Values::F16(x) => convert(x, out, float_to_i64),
            Values::Bf16(x) => convert(x, out, float_to_i64),
        },
    }
}

fn cast_to_float<O: Float>(input: Values<'_>, out: &mut [O]) -> Option<()> {
    match input {
        Values::I64(x) => convert(x, out, O::from_i64),
        Values::F32(x) => convert(x, out, |v| O::from_f32(v)),
        Values::F16(x) => convert(x, out, |v| O::from_f32(v.to_f32())),
        Values::Bf16(x) => convert(x, out, |v| O::from_f32(v.to_f32())),
    }
}

fn convert<I: Copy, O>(input: &[I], out: &mut [O], f: impl Fn(I) -> O) -> Option<()> {
    if input.len() != out.len() {
        return None;
    }
    for (o, &v) in out.iter_mut().zip(input) {
        *o = f(v);
    }
    Some(())
}

impl Executor {
    pub(super) fn binary(
        &self,
        graph: &Graph,
        arith: Arith,
        [a, b]: [TensorId; 2],
        plan: &Plan,
        mut out: Out<'_>,
    ) -> Result<(), Error> {
        let Plan::Binary(walk) = plan else {
            return Err(invariant(format!("'{}' has no broadcast plan", out.decl.name)));
        };
        let t = &self.tensors;
        if out.decl.dtype == ElemType::I64 {
            let f =
                arith.i64().ok_or_else(|| invariant(format!("'{}' divides i64 values", out.decl.name)))?;
            binary_i64(f, t.read(graph, a)?, t.read(graph, b)?, walk, out.typed()?);
            return Ok(());
        }
        with_float!(out.decl.dtype, T => {
            binary_float::<T>(arith, t.read(graph, a)?, t.read(graph, b)?, walk, out.typed()?);
            Ok(())
        })
    }

    pub(super) fn unary(
        &self,
        graph: &Graph,
        func: UnaryFn,
        input: TensorId,
        mut out: Out<'_>,
    ) -> Result<(), Error> {
        with_float!(out.decl.dtype, T => {
            unary::<T>(func, self.tensors.read(graph, input)?, out.typed()?);
            Ok(())
        })
    }

    pub(super) fn mean(&self, graph: &Graph, input: TensorId, mut out: Out<'_>) -> Result<(), Error> {
        let cols = graph.tensor(input).shape.last().copied().unwrap_or(1) as usize;
        with_float!(out.decl.dtype, T => {
            mean::<T>(self.tensors.read(graph, input)?, cols, out.typed()?);
            Ok(())
        })
    }

    pub(super) fn cast(&self, graph: &Graph, input: TensorId, mut out: Out<'_>) -> Result<(), Error> {
        let name = &out.decl.name;
        let values = self.tensors.values(graph, input)?;
        cast(values, out.values()?)
            .ok_or_else(|| invariant(format!("cast '{name}' changes the element count")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ref_graph::half::{bf16, f16};

    #[test]
    fn broadcast_multiplies_each_row_by_the_vector() {
        // [2, 1, 3] * [3]
        let a = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let b = [10.0f32, 100.0, 1000.0];
        let mut out = [0.0f32; 6];
        binary_float(Arith::Mul, &a, &b, &Walk::broadcast(&[2, 1, 3], [&[2, 1, 3], &[3]]), &mut out);
        assert_eq!(out, [10.0, 200.0, 3000.0, 40.0, 500.0, 6000.0]);
        // [2, 1] - [3]: an outer difference, [2, 3].
        let mut out = [0.0f32; 6];
        binary_float(
            Arith::Sub,
            &[1.0, 2.0],
            &[1.0, 2.0, 3.0],
            &Walk::broadcast(&[2, 3], [&[2, 1], &[3]]),
            &mut out,
        );
        assert_eq!(out, [0.0, -1.0, -2.0, 1.0, 0.0, -1.0]);
        // A scalar eps added to [1, 1, 2], and IEEE division by zero.
        let mut out = [0.0f32; 2];
        binary_float(
            Arith::Add,
            &[1.0, 2.0],
            &[0.5],
            &Walk::broadcast(&[1, 1, 2], [&[1, 1, 2], &[]]),
            &mut out,
        );
        assert_eq!(out, [1.5, 2.5]);
        binary_float(Arith::Div, &[1.0, 0.0], &[0.0], &Walk::broadcast(&[2], [&[2], &[]]), &mut out);
        assert!(out[0] == f32::INFINITY && out[1].is_nan(), "{out:?}");
    }

    #[test]
    fn half_results_are_rounded_once_at_store() {
        // 1 + 2^-11 is exact in f32 and a tie in f16 (to 1); bf16's 1 + 2^-8 likewise.
        let one = f16::ONE;
        let tiny = f16::from_f32(2f32.powi(-11));
        let mut out = [f16::ZERO];
        binary_float(Arith::Add, &[one], &[tiny], &Walk::broadcast(&[1], [&[1], &[1]]), &mut out);
        assert_eq!(out[0], f16::ONE);
        let three = f16::from_f32(3.0 * 2f32.powi(-11));
        binary_float(Arith::Add, &[one], &[three], &Walk::broadcast(&[1], [&[1], &[1]]), &mut out);
        assert_eq!(out[0].to_f32(), 1.0 + 2f32.powi(-9));
        let mut out = [bf16::ZERO];
        unary(UnaryFn::Square, &[bf16::from_f32(1.0 + 2f32.powi(-7))], &mut out);
        // (1 + 2^-7)^2 = 1 + 2^-6 + 2^-14: rounds to 1 + 2^-6 in bf16, computed exactly in f32 first.
        assert_eq!(out[0].to_f32(), 1.0 + 2f32.powi(-6));
    }

    #[test]
    fn i64_arithmetic_wraps_and_broadcasts() {
        let walk = Walk::broadcast(&[2, 2], [&[2, 2], &[1]]);
        let mut out = [0i64; 4];
        binary_i64(Arith::Add.i64().expect("add"), &[1, 2, i64::MAX, 4], &[1], &walk, &mut out);
        assert_eq!(out, [2, 3, i64::MIN, 5]);
        binary_i64(Arith::Mul.i64().expect("mul"), &[1, 2, 3, 4], &[-3], &walk, &mut out);
        assert_eq!(out, [-3, -6, -9, -12]);
        assert!(Arith::Div.i64().is_none());
    }

    #[test]
    fn unary_uses_the_one_definition_and_mean_averages_the_last_axis() {
        let x = [-1.0f32, 0.0, 2.0, 4.0];
        let mut out = [0.0f32; 4];
        for func in [UnaryFn::Rsqrt, UnaryFn::Silu, UnaryFn::Gelu, UnaryFn::Neg, UnaryFn::Cos] {
            unary(func, &x, &mut out);
            let expected: Vec<f32> = x.iter().map(|&v| func.apply(v)).collect();
            assert_eq!(
                out.map(f32::to_bits).to_vec(),
                expected.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
        }
        let mut means = [0.0f32; 2];
        mean(&x, 2, &mut means);
        assert_eq!(means, [-0.5, 3.0]);
    }

    #[test]
    fn cast_follows_the_op_rules() {
        let mut ints = [0i64; 4];
        cast(Values::F32(&[2.7, -2.7, f32::NAN, 1e30]), ValuesMut::I64(&mut ints)).expect("same length");
        assert_eq!(ints, [2, -2, 0, i64::MAX]);
        let mut halves = [f16::ZERO; 2];
        cast(Values::I64(&[2049, -65520]), ValuesMut::F16(&mut halves)).expect("same length");
        assert_eq!(halves.map(f16::to_f32), [2048.0, f32::NEG_INFINITY]);
        // i64 to bf16 rounds once: through f32 first, 2^30 + 2^22 + 1 would become a tie and round down.
        let mut brains = [bf16::ZERO; 2];
        cast(Values::I64(&[(1 << 30) + (1 << 22) + 1, -3]), ValuesMut::Bf16(&mut brains))
            .expect("same length");
        assert_eq!(brains.map(bf16::to_f32), [(1 << 30) as f32 + (1 << 23) as f32, -3.0]);
        let x = [f16::from_f32(1.0 + 2f32.powi(-10)), f16::from_f32(-3.0)];
        cast(Values::F16(&x), ValuesMut::Bf16(&mut brains)).expect("same length");
        assert_eq!(brains.map(bf16::to_f32), [1.0, -3.0]);
        let mut floats = [0.0f32; 2];
        cast(Values::Bf16(&brains), ValuesMut::F32(&mut floats)).expect("same length");
        assert_eq!(floats, [1.0, -3.0]);
        let mut same = [0i64; 2];
        cast(Values::I64(&[7, -7]), ValuesMut::I64(&mut same)).expect("same length");
        assert_eq!(same, [7, -7]);
        assert!(cast(Values::I64(&[1]), ValuesMut::I64(&mut same)).is_none());
    }
}
