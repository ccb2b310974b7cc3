//! Ops that move values without computing: `gather`, `permute`, `slice`, `concat` and `assign`, for any
//! element type (values are copied as they are, so no rounding happens). `reshape` moves nothing: its output
//! is its input's storage (an alias decided at init, see [`super::store`]). `assign` writes its value into
//! the caller's argument that backs its target (and its output), in place.

use std::ops::Range;

use delegate_abi::ExecuteArgs;
use ref_graph::{Graph, TensorId};

use super::store::{Out, Store};
use super::walk::Walk;
use super::{copy_bytes, invariant, Error, Executor, Plan};

/// `out[i.., :] = table[indices[i..], :]` for a table of `cols` columns and indices of any rank (row-major).
///
/// Fails with [`Error::IndexOutOfRange`] (naming `table_name`) when an index is outside the table.
pub fn gather<T: Copy>(
    table: &[T],
    cols: usize,
    indices: &[i64],
    out: &mut [T],
    table_name: &str,
) -> Result<(), Error> {
    let rows = table.len() / cols;
    for (t, (&index, out_row)) in indices.iter().zip(out.chunks_exact_mut(cols)).enumerate() {
        let row = usize::try_from(index)
            .ok()
            .filter(|&r| r < rows)
            .ok_or_else(|| Error::IndexOutOfRange { table: table_name.to_owned(), row: t, index, rows })?;
        out_row.copy_from_slice(&table[row * cols..(row + 1) * cols]);
    }
    Ok(())
}

/// `out` is `input` with its axes reordered by `walk` ([`Walk::permute`]).
pub fn permute<T: Copy>(input: &[T], walk: &Walk<1>, out: &mut [T]) {
    walk.for_each(|o, [i]| out[o] = input[i]);
}

/// `shape` seen as `[outer, shape[axis], inner]`.
fn around_axis(shape: &[u64], axis: usize) -> (usize, usize, usize) {
    let product = |dims: &[u64]| dims.iter().product::<u64>() as usize;
    (product(&shape[..axis]), shape[axis] as usize, product(&shape[axis + 1..]))
}

/// `out = input[.., range, ..]` along `axis` of `shape`.
pub fn slice<T: Copy>(input: &[T], shape: &[u64], axis: usize, range: Range<usize>, out: &mut [T]) {
    let (_, extent, inner) = around_axis(shape, axis);
    let kept = (range.end - range.start) * inner;
    for (block, out_block) in input.chunks_exact(extent * inner).zip(out.chunks_exact_mut(kept)) {
        out_block.copy_from_slice(&block[range.start * inner..range.end * inner]);
    }
}

/// `out = a` and `b` joined along `axis`; `a_shape` and `b_shape` differ at most at `axis`.
pub fn concat<T: Copy>(a: &[T], a_shape: &[u64], b: &[T], b_shape: &[u64], axis: usize, out: &mut [T]) {
    let (_, a_extent, inner) = around_axis(a_shape, axis);
    let (_, b_extent, _) = around_axis(b_shape, axis);
    let (a_block, b_block) = (a_extent * inner, b_extent * inner);
    let blocks = a.chunks_exact(a_block).zip(b.chunks_exact(b_block));
    for ((a, b), out) in blocks.zip(out.chunks_exact_mut(a_block + b_block)) {
        out[..a_block].copy_from_slice(a);
        out[a_block..].copy_from_slice(b);
    }
}

impl Executor {
    pub(super) fn gather(
        &self,
        graph: &Graph,
        table: TensorId,
        indices: TensorId,
        mut out: Out<'_>,
    ) -> Result<(), Error> {
        let decl = graph.tensor(table);
        let cols = decl.shape[1] as usize;
        let indices = self.tensors.read::<i64>(graph, indices)?;
        with_elem!(out.decl.dtype, T => {
            gather::<T>(self.tensors.read(graph, table)?, cols, indices, out.typed()?, &decl.name)
        })
    }

    pub(super) fn permute(
        &self,
        graph: &Graph,
        input: TensorId,
        plan: &Plan,
        mut out: Out<'_>,
    ) -> Result<(), Error> {
        let Plan::Permute(walk) = plan else {
            return Err(invariant(format!("'{}' has no permute plan", out.decl.name)));
        };
        with_elem!(out.decl.dtype, T => {
            permute::<T>(self.tensors.read(graph, input)?, walk, out.typed()?);
            Ok(())
        })
    }

    pub(super) fn slice(
        &self,
        graph: &Graph,
        input: TensorId,
        axis: u64,
        range: Range<u64>,
        mut out: Out<'_>,
    ) -> Result<(), Error> {
        let shape = &graph.tensor(input).shape;
        let range = range.start as usize..range.end as usize;
        with_elem!(out.decl.dtype, T => {
            slice::<T>(self.tensors.read(graph, input)?, shape, axis as usize, range, out.typed()?);
            Ok(())
        })
    }

    pub(super) fn concat(
        &self,
        graph: &Graph,
        [a, b]: [TensorId; 2],
        axis: u64,
        mut out: Out<'_>,
    ) -> Result<(), Error> {
        let (a_shape, b_shape) = (&graph.tensor(a).shape, &graph.tensor(b).shape);
        let t = &self.tensors;
        with_elem!(out.decl.dtype, T => {
            concat::<T>(t.read(graph, a)?, a_shape, t.read(graph, b)?, b_shape, axis as usize, out.typed()?);
            Ok(())
        })
    }

    /// `target = value` in the caller's argument that holds `target` (validation makes every assign target
    /// a graph input, and [`super::place`] binds it, and the output, to that argument).
    pub(super) fn assign(
        &self,
        graph: &Graph,
        [target, value]: [TensorId; 2],
        out: Out<'_>,
        args: &mut ExecuteArgs<'_>,
    ) -> Result<(), Error> {
        let Store::InPlace { arg } = self.tensors.stores[target.0] else {
            return Err(invariant(format!(
                "assign target '{}' is not a caller's argument (graph validation guarantees it is)",
                graph.tensor(target).name
            )));
        };
        let values = self.tensors.values(graph, value)?;
        let ([], [bytes]) = args.borrow([], [arg])?;
        copy_bytes(bytes, values.bytes(), out.decl)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_picks_rows_for_indices_of_any_rank_and_refuses_out_of_range_ids() {
        let table = [0.0, 1.0, 10.0, 11.0, 20.0, 21.0];
        let mut out = [0.0; 4];
        // Indices [1, 2] (Hugging Face's input_ids) or [2]: the same rows, row-major.
        gather(&table, 2, &[2, 0], &mut out, "emb").expect("in range");
        assert_eq!(out, [20.0, 21.0, 0.0, 1.0]);
        let err = gather(&table, 2, &[1, 3], &mut out, "emb").expect_err("3 is out of range");
        assert_eq!(err.to_string(), "index 3 at row 1 of the indices is outside table 'emb' with 3 rows");
        assert!(gather(&table, 2, &[-1], &mut out[..2], "emb").is_err());
    }

    #[test]
    fn permute_swaps_heads_and_tokens() {
        // [1, T=2, H=3, Dh=2] -> [1, H, T, Dh] (permute [0, 2, 1, 3]): value = t * 100 + h * 10 + d.
        let input: Vec<i64> = (0..2)
            .flat_map(|t| (0..3).flat_map(move |h| (0..2).map(move |d| t * 100 + h * 10 + d)))
            .collect();
        let mut out = [0i64; 12];
        permute(&input, &Walk::permute(&[1, 2, 3, 2], &[0, 2, 1, 3]), &mut out);
        assert_eq!(out, [0, 1, 100, 101, 10, 11, 110, 111, 20, 21, 120, 121]);
    }

    #[test]
    fn slice_and_concat_rotate_half() {
        // Hugging Face's rotate_half on [1, 2, 4]: cat(-x[..., 2:], x[..., :2]) (negation elsewhere).
        let x = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        let (mut lo, mut hi) = ([0.0f32; 4], [0.0f32; 4]);
        slice(&x, &[1, 2, 4], 2, 0..2, &mut lo);
        slice(&x, &[1, 2, 4], 2, 2..4, &mut hi);
        assert_eq!((lo, hi), ([1.0, 2.0, 5.0, 6.0], [3.0, 4.0, 7.0, 8.0]));
        let mut out = [0.0f32; 8];
        concat(&hi, &[1, 2, 2], &lo, &[1, 2, 2], 2, &mut out);
        assert_eq!(out, [3.0, 4.0, 1.0, 2.0, 7.0, 8.0, 5.0, 6.0]);
        // Along a middle axis, parts of different extents: [2, 1, 2] ++ [2, 2, 2].
        let mut out = [0i64; 12];
        concat(&[1, 2, 3, 4], &[2, 1, 2], &[5, 6, 7, 8, 9, 10, 11, 12], &[2, 2, 2], 1, &mut out);
        assert_eq!(out, [1, 2, 5, 6, 7, 8, 3, 4, 9, 10, 11, 12]);
        let mut middle = [0i64; 4];
        slice(&out, &[2, 3, 2], 1, 1..2, &mut middle);
        assert_eq!(middle, [5, 6, 9, 10]);
    }
}
