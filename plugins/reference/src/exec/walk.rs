//! Walking an output in row-major order with the matching offset into each operand: the geometry of
//! broadcasting (`add`, `sub`, `mul`, `div`) and of `permute`, decided once at init.

use std::array;

/// An output of `shape` walked in row-major order, with the offset of the matching element of each of `N`
/// operands. An operand's stride along an output axis is 0 where it is broadcast (an extent of 1, or an axis
/// it does not have).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Walk<const N: usize> {
    shape: Vec<usize>,
    strides: [Vec<usize>; N],
}

/// Row-major strides of `shape`, in elements.
fn contiguous(shape: &[u64]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for axis in (0..shape.len().saturating_sub(1)).rev() {
        strides[axis] = strides[axis + 1] * shape[axis + 1] as usize;
    }
    strides
}

impl<const N: usize> Walk<N> {
    /// NumPy broadcasting of `operands` to `out` (`ref_graph::broadcast_shape` of them): shapes aligned at the
    /// last axis, an extent of 1 or a missing axis stretched.
    pub fn broadcast(out: &[u64], operands: [&[u64]; N]) -> Walk<N> {
        let strides = operands.map(|shape| {
            let missing = out.len() - shape.len();
            let own = contiguous(shape);
            (0..out.len())
                .map(|axis| match axis.checked_sub(missing) {
                    Some(a) if shape[a] != 1 => own[a],
                    _ => 0,
                })
                .collect()
        });
        Walk { shape: out.iter().map(|&d| d as usize).collect(), strides }
    }

    /// Number of output elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Calls `f(output offset, operand offsets)` for every output element, in row-major order.
    pub fn for_each(&self, mut f: impl FnMut(usize, [usize; N])) {
        let outer_rank = self.shape.len().saturating_sub(1);
        let inner = self.shape.last().copied().unwrap_or(1);
        let inner_strides: [usize; N] = array::from_fn(|i| self.strides[i].last().copied().unwrap_or(0));
        let rows: usize = self.shape[..outer_rank].iter().product();
        for row in 0..rows {
            let mut base = [0usize; N];
            let mut rest = row;
            for axis in (0..outer_rank).rev() {
                let coordinate = rest % self.shape[axis];
                rest /= self.shape[axis];
                for (b, strides) in base.iter_mut().zip(&self.strides) {
                    *b += coordinate * strides[axis];
                }
            }
            for j in 0..inner {
                f(row * inner + j, array::from_fn(|i| base[i] + j * inner_strides[i]))
            }
        }
    }
}

impl Walk<1> {
    /// `permute(input, dims)`: output axis `i` is input axis `dims[i]` (a permutation, as validated).
    pub fn permute(input: &[u64], dims: &[u64]) -> Walk<1> {
        let own = contiguous(input);
        let pick = |values: &[usize]| dims.iter().map(|&d| values[d as usize]).collect::<Vec<_>>();
        let shape: Vec<usize> = input.iter().map(|&d| d as usize).collect();
        Walk { shape: pick(&shape), strides: [pick(&own)] }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offsets<const N: usize>(walk: &Walk<N>) -> Vec<[usize; N]> {
        let mut all = Vec::new();
        walk.for_each(|out, operands| {
            assert_eq!(out, all.len(), "row-major order");
            all.push(operands);
        });
        all
    }

    #[test]
    fn broadcast_stretches_ones_and_missing_axes() {
        // [2, 1, 3] with [3]: output [2, 1, 3]; b repeats along axis 0.
        let walk = Walk::broadcast(&[2, 1, 3], [&[2, 1, 3], &[3]]);
        assert_eq!(walk.numel(), 6);
        assert_eq!(offsets(&walk), [[0, 0], [1, 1], [2, 2], [3, 0], [4, 1], [5, 2]]);
        // [2, 1] with [1, 3]: both stretch.
        let walk = Walk::broadcast(&[2, 3], [&[2, 1], &[1, 3]]);
        assert_eq!(offsets(&walk), [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]);
        // A scalar [] with a scalar: one element.
        let walk = Walk::broadcast(&[], [&[], &[]]);
        assert_eq!(offsets(&walk), [[0, 0]]);
    }

    #[test]
    fn permute_reads_the_input_axis_each_output_axis_names() {
        // [1, 2, 3, 2] permuted [0, 2, 1, 3] (Hugging Face's transpose(1, 2)): output [1, 3, 2, 2].
        let walk = Walk::permute(&[1, 2, 3, 2], &[0, 2, 1, 3]);
        let input: Vec<usize> = offsets(&walk).into_iter().map(|[i]| i).collect();
        // Output (t, h, d) reads input (h, t, d) = h * 6 + t * 2 + d.
        assert_eq!(input, [0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11]);
        let walk = Walk::permute(&[2, 3], &[1, 0]);
        assert_eq!(offsets(&walk).concat(), [0, 3, 1, 4, 2, 5]);
    }
}
