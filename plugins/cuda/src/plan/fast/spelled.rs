//! What an export spells in several ops, read as the op it is: a StaticCache's counters, RoPE's tables of a
//! step, LayerNorm as `rms_norm(x - mean(x)) (+ bias)`, SiLU as `x * sigmoid(x)` or between casts, and an
//! `Assign` whose value can be computed in place.

use ref_graph::{Op, TensorId, UnaryFn};

use super::Lowering;
use crate::kernels::general::COUNTERS_MAX;
use crate::plan::{u32_of, CounterSum, Float, Home, Norm, Step, Unsupported};

/// RoPE's table ops after a `Positions` ([`Lowering::rope_tables`]): how many, the inverse frequencies, the
/// tables they store, half the rotation's width, and the intermediates the fused launch never writes.
struct RopeTableOps {
    taken: usize,
    inv_freq: TensorId,
    cos: TensorId,
    sin: TensorId,
    half: u64,
    intermediates: Vec<TensorId>,
}

impl Lowering<'_> {
    /// A scalar i64 sum with a constant (a StaticCache's counter: the position plus the tokens of the call),
    /// added to the previous step when that is a launch of such sums with room: whether it was taken.
    pub(super) fn counter(&mut self, a: TensorId, b: TensorId, out: TensorId) -> bool {
        let scalar_i64 = |id: TensorId| {
            let t = self.graph.tensor(id);
            t.dtype == ref_graph::ElemType::I64 && t.numel() == 1
        };
        let constant = |id: TensorId| match self.graph.constant(id) {
            Some(ref_graph::Data::I64(v)) => v.first().copied(),
            _ => None,
        };
        let (src, add) = match (constant(a), constant(b)) {
            (_, Some(add)) => (a, add),
            (Some(add), None) => (b, add),
            (None, None) => return false,
        };
        if ![a, b, out].into_iter().all(scalar_i64) {
            return false;
        }
        let sum = CounterSum { src, add, out };
        match self.steps.last_mut() {
            Some(Step::Counters { sums }) if sums.len() < COUNTERS_MAX => sums.push(sum),
            _ => self.steps.push(Step::Counters { sums: vec![sum] }),
        }
        true
    }

    /// Positions at `p` (`pos`, `count` rows from `position`) and next the ops that make RoPE's tables of them:
    /// a cast to f32, the product by a constant f32 vector of inverse frequencies, its concat with itself
    /// along the last axis, cos and sin of that (either order), and optionally both cast to one float type,
    /// every intermediate read only there: one launch ([`Step::RopeTables`]). How many ops it took, if it
    /// matched.
    pub(super) fn rope_tables(
        &mut self,
        p: usize,
        position: TensorId,
        count: u64,
        pos: TensorId,
    ) -> Result<Option<usize>, Unsupported> {
        let Some(RopeTableOps { taken, inv_freq, cos, sin, half, intermediates }) =
            self.match_rope_tables(p, pos, count)
        else {
            return Ok(None);
        };
        for id in intermediates {
            // Never written or read: the kernel computes the tables from the position.
            self.rehome(id, cos);
        }
        let dtype = self.graph.tensor(cos).dtype;
        let (rows, half) = (u32_of(count, "position count")?, u32_of(half, "rotary half width")?);
        self.steps.push(Step::RopeTables { position, inv_freq, cos, sin, rows, half, dtype });
        Ok(Some(taken))
    }

    /// The ops of [`Lowering::rope_tables`] after positions `pos` at `p`.
    fn match_rope_tables(&self, p: usize, pos: TensorId, count: u64) -> Option<RopeTableOps> {
        use ref_graph::ElemType::F32;
        let f32_of = |id: TensorId| self.graph.tensor(id).dtype == F32;
        let &Op::Cast { input, dtype: F32, out: angles } = self.ahead(p, 1)? else { return None };
        let &Op::Mul { a, b, out: freqs } = self.ahead(p, 2)? else { return None };
        let inv_freq = if self.same(a, angles) { b } else { a };
        let half = self.graph.tensor(inv_freq).numel() as u64;
        let is_table = self.graph.constant(inv_freq).is_some() && f32_of(inv_freq) && f32_of(freqs);
        let freqs_ok = self.shape(freqs).last() == Some(&half)
            && self.graph.tensor(freqs).numel() as u64 == count * half;
        if !self.same(input, pos) || !(self.same(a, angles) || self.same(b, angles)) || !is_table || !freqs_ok
        {
            return None;
        }
        let &Op::Concat { a: x, b: y, axis, out: emb } = self.ahead(p, 3)? else { return None };
        let last = self.shape(emb).len().checked_sub(1)? as u64;
        if !self.same(x, freqs)
            || !self.same(y, freqs)
            || axis != last
            || self.graph.tensor(angles).numel() as u64 != count
        {
            return None;
        }
        let (cos, sin) = self.cos_sin(p + 4, emb)?;
        let mut intermediates = vec![pos, angles, freqs, emb];
        let (mut taken, mut tables) = (6, (cos, sin));
        if let (
            Some(&Op::Cast { input: c, dtype: t, out: c2 }),
            Some(&Op::Cast { input: s, dtype: t2, out: s2 }),
        ) = (self.ahead(p, 6), self.ahead(p, 7))
        {
            let (c_in, s_in) = if self.same(c, cos) { (c, s) } else { (s, c) };
            let (c_out, s_out) = if self.same(c, cos) { (c2, s2) } else { (s2, c2) };
            if t == t2
                && self.same(c_in, cos)
                && self.same(s_in, sin)
                && [cos, sin].iter().all(|&id| self.private(id))
            {
                intermediates.extend([cos, sin]);
                (taken, tables) = (8, (c_out, s_out));
            }
        }
        let private = intermediates.iter().take(3).all(|&id| self.private(id))
            && self.uses(emb) == 2
            && !self.is_output(emb);
        let (cos, sin) = tables;
        private.then_some(RopeTableOps { taken, inv_freq, cos, sin, half, intermediates })
    }

    /// The cos and sin of `emb` at positions `at` and `at + 1` of the schedule, in either order.
    fn cos_sin(&self, at: usize, emb: TensorId) -> Option<(TensorId, TensorId)> {
        let (&Op::Unary { func: f1, input: i1, out: o1 }, &Op::Unary { func: f2, input: i2, out: o2 }) =
            (self.ahead(at, 0)?, self.ahead(at, 1)?)
        else {
            return None;
        };
        if !self.same(i1, emb) || !self.same(i2, emb) {
            return None;
        }
        match (f1, f2) {
            (UnaryFn::Cos, UnaryFn::Sin) => Some((o1, o2)),
            (UnaryFn::Sin, UnaryFn::Cos) => Some((o2, o1)),
            _ => None,
        }
    }

    /// `mean(x)` at `p` (`mu`), then `c = x - mu` and `s = rms_norm(c, gain)` (LayerNorm as the lowering
    /// spells it), and optionally `s + bias` with a constant bias along the row: one LayerNorm
    /// ([`Norm::centred`]), the mean and the centred row read only there and never written. How many ops it
    /// took, if it matched.
    pub(super) fn layer_norm(
        &mut self,
        p: usize,
        x: TensorId,
        mu: TensorId,
    ) -> Result<Option<usize>, Unsupported> {
        let Some(&Op::Sub { a, b, out: c }) = self.ahead(p, 1) else { return Ok(None) };
        let Some(&Op::RmsNorm { input, weight, eps, out: s }) = self.ahead(p, 2) else { return Ok(None) };
        let dim = *self.shape(x).last().unwrap_or(&1);
        let rows = self.graph.tensor(x).numel() / dim.max(1) as usize;
        let dtype = self.graph.tensor(x).dtype;
        let alike =
            [c, s].iter().all(|&id| self.shape(id) == self.shape(x) && self.graph.tensor(id).dtype == dtype);
        let centred = self.same(a, x) && self.same(b, mu) && self.same(input, c);
        let mean_ok = self.graph.tensor(mu).numel() == rows && self.shape(mu).last() == Some(&1);
        if !centred
            || !alike
            || !mean_ok
            || !self.private(mu)
            || !self.private(c)
            || Float::of(dtype).is_none()
        {
            return Ok(None);
        }
        let (bias, out, taken) = match self.ahead(p, 3) {
            Some(&Op::Add { a: y, b: z, out })
                if self.private(s) && self.graph.tensor(out).dtype == dtype =>
            {
                let other = if self.same(y, s) { z } else { y };
                let row = |id: TensorId| {
                    self.graph.tensor(id).numel() as u64 == dim && self.shape(id).last() == Some(&dim)
                };
                let bias = (self.same(y, s) || self.same(z, s))
                    && !self.same(other, s)
                    && self.graph.constant(other).is_some()
                    && self.graph.tensor(other).dtype == dtype
                    && row(other)
                    && self.shape(out) == self.shape(x);
                if bias {
                    (Some(other), out, 4)
                } else {
                    (None, s, 3)
                }
            }
            _ => (None, s, 3),
        };
        // Never written or read: the norm computes the mean and the centred row itself.
        let mut intermediates = vec![mu, c];
        if bias.is_some() {
            intermediates.push(s);
        }
        for id in intermediates {
            self.rehome(id, out);
        }
        self.norm(x, out, Norm { gain: weight, eps, centred: true, bias })?;
        Ok(Some(taken))
    }

    /// When the op after the gather at `p` is `scaled = rows * c`, `rows` the gather's output (read only
    /// there) and `c` a one-value constant of its type (Gemma's `embed_scale`, applied once before the first
    /// layer): the constant and `scaled`.
    pub(super) fn embedding_scale(&self, p: usize, rows: TensorId) -> Option<(TensorId, TensorId)> {
        let at = *self.canon.order.get(p + 1)?;
        let Op::Mul { a, b, out: scaled } = self.graph.ops()[at] else { return None };
        let factor = if self.same(a, rows) { b } else { a };
        let t = self.graph.tensor(factor);
        let alike = |id: TensorId| self.graph.tensor(id).dtype == self.graph.tensor(rows).dtype;
        let one_value = t.numel() == 1 && self.graph.constant(factor).is_some() && alike(factor);
        let fits = self.shape(scaled) == self.shape(rows) && alike(scaled);
        let operand = self.same(a, rows) || self.same(b, rows);
        (!self.absorbed[at] && operand && one_value && fits && self.private(rows)).then_some((factor, scaled))
    }

    /// `sigmoid(x)` at `p` and `x * sigmoid(x)` next (SiLU as the export decomposes it): one SiLU step.
    pub(super) fn silu_of_product(
        &mut self,
        p: usize,
        x: TensorId,
        s: TensorId,
    ) -> Result<usize, Unsupported> {
        let op = &self.graph.ops()[self.canon.order[p]];
        let Some(&Op::Mul { a, b, out }) = self.ahead(p, 1) else { return self.general(op) };
        let other = if a == s { b } else { a };
        if !(a == s || b == s) || !self.same(other, x) || other == s || !self.private(s) {
            return self.general(op);
        }
        let dtype = self.graph.tensor(out).dtype;
        let n = self.graph.tensor(out).numel() as u64;
        self.steps.push(Step::Unary { func: UnaryFn::Silu, input: x, out, n, dtype });
        // The sigmoid's read of `x` and the product's are now the one read of the SiLU.
        self.merged_reads[self.canon.value[x.0].0] += 1;
        self.rehome(s, out);
        Ok(2)
    }

    /// `cast(x, f32)` at `p`, `silu` of it and a cast back to `x`'s type (SiLU in f32 inside a half model):
    /// one SiLU step of `x`'s type, which computes in f32 and rounds once, as the cast back does.
    pub(super) fn silu_in_f32(&mut self, p: usize, x: TensorId, c: TensorId) -> Result<usize, Unsupported> {
        let op = &self.graph.ops()[self.canon.order[p]];
        let (Some(&Op::Unary { func: UnaryFn::Silu, input, out: s }), Some(&Op::Cast { input: s2, out, .. })) =
            (self.ahead(p, 1), self.ahead(p, 2))
        else {
            return self.general(op);
        };
        let dtype = self.graph.tensor(x).dtype;
        let f32_inside = self.graph.tensor(c).dtype == ref_graph::ElemType::F32 && Float::of(dtype).is_some();
        if input != c || s2 != s || self.graph.tensor(out).dtype != dtype || !f32_inside {
            return self.general(op);
        }
        if !self.private(c) || !self.private(s) {
            return self.general(op);
        }
        let n = self.graph.tensor(out).numel() as u64;
        self.steps.push(Step::Unary { func: UnaryFn::Silu, input: x, out, n, dtype });
        self.rehome(c, out);
        self.rehome(s, out);
        Ok(3)
    }

    /// Whether an `Assign` of `value` into `target` can be no launch: `value` is computed by an earlier step
    /// into scratch, read by nothing else and no output, of the target's type and size, and nothing else
    /// reads the target (so writing it early changes nothing). Then `value` is computed into the target.
    pub(super) fn assign_in_place(&mut self, target: TensorId, value: TensorId) -> bool {
        let (t, v) = (self.graph.tensor(target), self.graph.tensor(value));
        let ok = self.homes[value.0] == Home::Scratch
            && self.private(value)
            && self.uses(target) == 1
            && (t.dtype, t.numel()) == (v.dtype, v.numel());
        if ok {
            self.rehome(value, target);
        }
        ok
    }
}
