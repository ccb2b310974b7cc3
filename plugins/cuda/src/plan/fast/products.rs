//! The products of a decode step as GEMVs: siblings of one activation in one launch, the residual `Add` and
//! the norm before them fused in, and the norms only products read.

#[allow(clippy::wildcard_imports)]
use super::*;

impl Lowering<'_> {
    /// A product as a GEMV: with its siblings (the next products of the same activation, weights of the same
    /// inner extent and layout), or with the next op's residual `Add`, and with the `RmsNorm` before it when
    /// only these products read the norm.
    pub(super) fn gemv(&mut self, p: usize) -> Result<usize, Unsupported> {
        let Some(first @ &Op::MatMul { a, transpose_b, .. }) = self.ahead(p, 0) else {
            unreachable!("called for a mat_mul")
        };
        self.float(a)?;
        let k = *self.shape(a).last().unwrap_or(&1);
        let m = self.graph.tensor(a).numel() as u64 / k.max(1);
        let (m, k) = (u32_of(m, "rows")?, u32_of(k, "inner extent")?);
        let mut mats = vec![self.gemv_mat(first)?];
        // Siblings: the next MatMuls reading the same value with weights of the same layout.
        while mats.len() < 3 {
            match self.ahead(p, mats.len()) {
                Some(op @ &Op::MatMul { a: a2, transpose_b: t2, .. })
                    if self.same(a2, a) && t2 == transpose_b =>
                {
                    mats.push(self.gemv_mat(op)?);
                }
                _ => break,
            }
        }
        // A product that slices cut into more matrices than a launch takes is computed alone (its siblings
        // next, in a launch of their own).
        if mats.len() > 1 && !self.has_partial_rotary(&mats[0]) {
            let cut = self.slices_of(self.with_bias(mats[0]), m).map_or(1, |(split, _)| split.len());
            if cut + mats.len() - 1 > 3 {
                mats.truncate(1);
            }
        }
        for mat in &mut mats {
            self.absorb_bias(mat);
        }
        let (mut taken, products) = (mats.len(), mats.len());
        if mats.len() == 1 {
            // The residual's sum, then a parallel residual's second one (`x + attn + mlp`), each the next op
            // not already taken by a fusion (a bias add).
            for _ in 0..2 {
                let next = self.live_after(p, taken);
                if self.residual(&mut mats[0], self.ahead(p, next)) == 0 {
                    break;
                }
                taken = next + 1;
            }
        }
        if let [mat] = mats[..] {
            if let Some(split) = self.split(mat, m) {
                mats = split;
            }
        }
        let rope = self.partial_rotary(&mut mats, m);
        let (a, norm) = self.fused_norm(a, products);
        let early = mats.iter().all(|mat| self.fixed(mat.w) && mat.bias.is_none_or(|b| self.fixed(b)))
            && norm.is_none_or(|n| self.fixed(n.gain) && n.bias.is_none_or(|b| self.fixed(b)));
        let (glu, activation, softcap) = (None, None, None);
        let step =
            Step::Gemv { a, norm, mats, cache_rows: None, m, k, early, glu, rope, activation, softcap };
        self.steps.push(step);
        Ok(taken)
    }

    /// One product's matrix: its weight read as `[N, K]` (a `[K, N]` weight must be a constant, transposed at
    /// upload).
    fn gemv_mat(&self, op: &Op<TensorId>) -> Result<GemvMat, Unsupported> {
        let Op::MatMul { b, transpose_b, bias, out, .. } = *op else { unreachable!("called for a mat_mul") };
        self.float(out)?;
        if !transpose_b && self.graph.constant(b).is_none() {
            return Err(Unsupported(format!(
                "mat_mul '{}' multiplies by '{}', computed in the graph; the CUDA delegate multiplies by \
                 constant [K, N] weights or by [N, K] ones (transpose_b)",
                self.graph.tensor(out).name,
                self.graph.tensor(b).name
            )));
        }
        let n = self.shape(b)[usize::from(!transpose_b)];
        Ok(GemvMat {
            w: b,
            transposed: !transpose_b,
            n: u32_of(n, "columns")?,
            y: out,
            bias,
            residual: None,
            residual2: None,
            cache: None,
            roped: false,
            rows: WeightRows::all(u32_of(n, "columns")?),
        })
    }

    /// A lone product feeding only `next`, an `Add` of equal shapes with it, becomes that Add's output (the
    /// product's own tensor, never written, takes the sum's storage): how many ops that took (0 or 1).
    fn residual(&mut self, mat: &mut GemvMat, next: Option<&Op<TensorId>>) -> usize {
        let out = mat.y;
        let Some(&Op::Add { a: x, b: y, out: sum }) = next else { return 0 };
        if !self.private(out) {
            return 0;
        }
        let other = if self.same(x, out) {
            y
        } else if self.same(y, out) {
            x
        } else {
            return 0;
        };
        let numel = |id: TensorId| self.graph.tensor(id).numel();
        if self.same(other, out) || self.shape(other) != self.shape(sum) || numel(out) != numel(sum) {
            return 0;
        }
        // The product itself is never stored: no allocation for it.
        self.rehome(out, sum);
        *mat = match mat.residual {
            None => GemvMat { y: sum, residual: Some(other), ..*mat },
            Some(_) => GemvMat { y: sum, residual2: Some(other), ..*mat },
        };
        1
    }

    /// `input` normalised over its last axis into `out`: one step.
    pub(super) fn norm(&mut self, input: TensorId, out: TensorId, norm: Norm) -> Result<(), Unsupported> {
        let dim = *self.shape(input).last().unwrap_or(&1);
        let rows = self.graph.tensor(input).numel() as u64 / dim.max(1);
        let (rows, dim) = (u32_of(rows, "rows")?, u32_of(dim, "width")?);
        self.steps.push(Step::Norm { input, out, rows, dim, norm, residual: None });
        Ok(())
    }

    /// When the last step is a norm without a residual whose output `t` only `out = t + x` reads (one shape
    /// and type, `x` another value): the norm adds `x` itself and writes `out` (Gemma 2's post-norms, one
    /// launch fewer each). Whether it did.
    pub(super) fn norm_residual(&mut self, a: TensorId, b: TensorId, out: TensorId) -> bool {
        let Some(&Step::Norm { out: t, residual: None, .. }) = self.steps.last() else { return false };
        let x = if self.same(a, t) {
            b
        } else if self.same(b, t) {
            a
        } else {
            return false;
        };
        let alike = |id: TensorId| {
            let (u, v) = (self.graph.tensor(id), self.graph.tensor(t));
            u.shape == v.shape && u.dtype == v.dtype
        };
        if self.same(x, t) || !alike(x) || !alike(out) || !self.private(t) {
            return false;
        }
        let Some(Step::Norm { out: o, residual, .. }) = self.steps.last_mut() else {
            unreachable!("matched above")
        };
        *o = out;
        *residual = Some(x);
        // Never written or read: the norm stores the sum.
        self.rehome(t, out);
        true
    }

    /// When the last step is a norm (RMS or LayerNorm) whose output only the `readers` products read, it is
    /// done inside the GEMV: the norm's input and the norm instead of `a`. When products of later GEMVs read
    /// it too (and nothing else does), each of them does it as well.
    fn fused_norm(&mut self, a: TensorId, readers: usize) -> (TensorId, Option<Norm>) {
        if let Some(&(_, input, norm)) = self.shared_norms.iter().find(|&&(h, ..)| self.same(h, a)) {
            return (input, Some(norm));
        }
        let Some(&Step::Norm { input, out: h, norm, residual: None, .. }) = self.steps.last() else {
            return (a, None);
        };
        if !self.same(h, a) || self.is_output(h) {
            return (a, None);
        }
        if self.uses(h) == readers {
            self.steps.pop();
            return (input, Some(norm));
        }
        if self.only_products_read(h) {
            self.steps.pop();
            self.shared_norms.push((h, input, norm));
            return (input, Some(norm));
        }
        (a, None)
    }

    /// Whether every op reading `h`'s value multiplies it (as the activation `a` of a product).
    fn only_products_read(&self, h: TensorId) -> bool {
        let value = self.canon.value[h.0];
        let is_h = |x: TensorId| self.canon.value[x.0] == value;
        self.canon.order.iter().all(|&i| match self.graph.ops()[i] {
            Op::MatMul { b, bias, .. } => !is_h(b) && !bias.is_some_and(is_h),
            ref op => !op.operands().into_iter().any(is_h),
        })
    }
}
