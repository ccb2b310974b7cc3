//! Soft-capping as an export spells it after a product, `tanh(y / c) * c` (Gemma 2's final logits), read as
//! the GEMV's last epilogue ([`Softcap`]).

use ref_graph::{TensorId, UnaryFn};

use super::Lowering;
use crate::plan::{BinOp, Softcap, Step};

impl Lowering<'_> {
    /// When the last four steps are a GEMV of one plain product `y` (no residual, cache, RoPE, SwiGLU or
    /// activation), `d = y / c1`, `t = tanh(d)` and `out = t * c2` (either order), `c1` and `c2` one-value
    /// constants of `y`'s type, every intermediate read only there and of `y`'s shape and type: the GEMV
    /// stores `out` itself (three launches fewer).
    pub(super) fn fuse_softcap(&mut self) {
        let [.., ref gemv, ref div, ref tanh, ref mul] = self.steps[..] else { return };
        let Step::Gemv { ref mats, glu: None, rope: None, activation: None, softcap: None, .. } = *gemv
        else {
            return;
        };
        let [ref mat] = mats[..] else { return };
        let Step::Binary { op: BinOp::Div, a: y, b: divisor, out: d, .. } = *div else { return };
        let Step::Unary { func: UnaryFn::Tanh, input, out: t, .. } = *tanh else { return };
        let Step::Binary { op: BinOp::Mul, a, b, out, .. } = *mul else { return };
        let factor = if self.same(a, t) { b } else { a };
        let plain = mat.residual.is_none() && mat.cache.is_none() && !mat.roped;
        let chained = self.same(mat.y, y) && self.same(input, d) && (self.same(a, t) || self.same(b, t));
        let like_y = |id: TensorId| {
            let (u, v) = (self.graph.tensor(id), self.graph.tensor(y));
            u.shape == v.shape && u.dtype == v.dtype
        };
        let constant = |id: TensorId| {
            let c = self.graph.tensor(id);
            c.numel() == 1 && c.dtype == self.graph.tensor(y).dtype && self.graph.constant(id).is_some()
        };
        let private = [y, d, t].into_iter().all(|id| self.private(id));
        if !plain
            || !chained
            || ![d, t, out].into_iter().all(like_y)
            || !constant(divisor)
            || !constant(factor)
        {
            return;
        }
        if !private || self.same(factor, t) {
            return;
        }
        self.steps.truncate(self.steps.len() - 3);
        let Some(Step::Gemv { mats, softcap, .. }) = self.steps.last_mut() else {
            unreachable!("matched above")
        };
        mats[0].y = out;
        *softcap = Some(Softcap { divisor, factor });
        // Never written or read: the GEMV stores the capped product.
        for id in [y, d, t] {
            self.rehome(id, out);
        }
    }
}
