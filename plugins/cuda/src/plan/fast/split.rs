//! A product whose only readers are slices of its columns (GPT-2's Q, K and V cut from one `c_attn` product,
//! a head-interleaved `query_key_value`), read as the products it spells: one matrix per slice, each
//! computing its slice straight from the weight rows it needs ([`WeightRows`]), the slices no launch.

use ref_graph::Op;

use super::Lowering;
use crate::plan::{u32_of, GemvMat, WeightRows};

impl Lowering<'_> {
    /// When every op reading `mat`'s product (of `m` rows) is a slice of whole groups of its columns, at most
    /// three, and the product has no residual, cache or rotation and is no graph output: one matrix per slice,
    /// writing the slice (the slices are then lowered as nothing, the product never stored).
    pub(super) fn split(&mut self, mat: GemvMat, m: u32) -> Option<Vec<GemvMat>> {
        let (mats, readers) = self.slices_of(mat, m)?;
        for &i in &readers {
            self.absorbed[i] = true;
        }
        // Never written or read: no allocation (the storage named is the first slice's).
        self.rehome(mat.y, mats[0].y);
        Some(mats)
    }

    /// The matrices [`Lowering::split`] would make of `mat`, and the slices they take, changing nothing.
    pub(super) fn slices_of(&self, mat: GemvMat, m: u32) -> Option<(Vec<GemvMat>, Vec<usize>)> {
        if mat.residual.is_some() || mat.cache.is_some() || mat.roped || self.is_output(mat.y) {
            return None;
        }
        let graph = self.graph;
        let value = self.canon.value[mat.y.0];
        let reads =
            |op: &Op<ref_graph::TensorId>| op.operands().iter().any(|&x| self.canon.value[x.0] == value);
        let readers: Vec<usize> =
            self.canon.order.iter().copied().filter(|&i| reads(&graph.ops()[i])).collect();
        if readers.is_empty() || readers.len() > 3 {
            return None;
        }
        let n = u64::from(mat.n);
        let mut mats = Vec::new();
        for &i in &readers {
            let Op::Slice { input, axis, start, end, out } = graph.ops()[i] else { return None };
            let shape = self.shape(input);
            let axis = usize::try_from(axis).ok()?;
            // Output column c of a row reads column (c / (width * inner)) * (extent * inner) + start * inner
            // + c % (width * inner) of the product's row: whole groups of `extent * inner` columns a row.
            let (inner, extent, width) =
                (shape[axis + 1..].iter().product::<u64>(), shape[axis], end - start);
            let whole = extent * inner > 0 && n % (extent * inner) == 0;
            let same = graph.tensor(input).numel() as u64 == u64::from(m) * n
                && graph.tensor(out).dtype == graph.tensor(mat.y).dtype;
            if self.absorbed[i] || !whole || !same {
                return None;
            }
            let rows = WeightRows {
                offset: u32_of(start * inner, "slice start").ok()?,
                group: u32_of(width * inner, "slice width").ok()?,
                stride: u32_of(extent * inner, "slice extent").ok()?,
            };
            let cols = u32_of(n / (extent * inner) * width * inner, "columns").ok()?;
            mats.push(GemvMat { y: out, n: cols, rows, ..mat });
        }
        Some((mats, readers))
    }
}
