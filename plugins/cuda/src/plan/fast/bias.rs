//! A bias an export adds after a bias-less product (Falcon's linear layers traced as `mm` then `add`), read
//! as the product's own bias: added in the GEMV's epilogue, the add no launch.

use ref_graph::{Op, TensorId};

use super::Lowering;
use crate::plan::GemvMat;

impl Lowering<'_> {
    /// The op that alone reads `mat`'s product when it adds a constant bias along the row (of the product's
    /// type, one value a column) to it: (the op, the bias, the sum).
    fn bias_add_of(&self, mat: &GemvMat) -> Option<(usize, TensorId, TensorId)> {
        if mat.bias.is_some() || mat.residual.is_some() || mat.cache.is_some() || self.is_output(mat.y) {
            return None;
        }
        let [i] = self.live_readers(mat.y)[..] else { return None };
        let Op::Add { a, b, out } = self.graph.ops()[i] else { return None };
        let (product, bias) = if self.same(a, mat.y) { (a, b) } else { (b, a) };
        let n = u64::from(mat.n);
        let (t, ty) = (self.graph.tensor(bias), self.graph.tensor(mat.y));
        let row = t.numel() as u64 == n && t.shape.last() == Some(&n) && t.dtype == ty.dtype;
        let sum = self.shape(out) == self.shape(product) && self.graph.tensor(out).dtype == ty.dtype;
        let ok = self.same(product, mat.y) && !self.same(bias, mat.y) && self.graph.constant(bias).is_some();
        (ok && row && sum).then_some((i, bias, out))
    }

    /// `mat` as it would compute with its bias add taken ([`Lowering::absorb_bias`]), changing nothing.
    pub(super) fn with_bias(&self, mat: GemvMat) -> GemvMat {
        match self.bias_add_of(&mat) {
            Some((_, bias, out)) => GemvMat { y: out, bias: Some(bias), ..mat },
            None => mat,
        }
    }

    /// Takes the add of a bias after `mat`'s product into `mat` (the add then lowered as nothing, the
    /// product never stored).
    pub(super) fn absorb_bias(&mut self, mat: &mut GemvMat) {
        if let Some((i, bias, out)) = self.bias_add_of(mat) {
            self.absorbed[i] = true;
            self.rehome(mat.y, out);
            *mat = GemvMat { y: out, bias: Some(bias), ..*mat };
        }
    }
}
