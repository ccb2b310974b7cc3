//! The launches of the general path's untyped steps, with this call's addresses.

use cuda_rt::LaunchConfig;

use super::Engine;
use crate::kernels::{
    self,
    general::{
        dtype_code, BinaryP, CastP, CopyP, CountersP, GeneralLaunch, GluP, MeanP, PositionsP, RopeP,
        RopeTablesP, UnaryP, COUNTERS_MAX, MAX_RANK,
    },
};
use crate::plan::{CounterSum, Float, Step, Walk};
use ref_graph::ElemType;

/// Threads of an elementwise block; blocks are capped, each thread looping over the rest.
const THREADS: u32 = 256;
const MAX_BLOCKS: u64 = 4096;

fn elementwise(n: u64) -> LaunchConfig {
    LaunchConfig {
        grid: (n.div_ceil(THREADS as u64).clamp(1, MAX_BLOCKS) as u32, 1, 1),
        block: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Elements of `dtype` a thread of a flat elementwise kernel takes when every operand is aligned
/// ([`kernels::run_values`]); 1 for i64, which never takes runs.
fn lanes16(dtype: ElemType) -> u64 {
    Float::of(dtype).map_or(1, |float| u64::from(kernels::run_values(float)))
}

/// The launch of a flat elementwise kernel over `n` values of `dtype`: a thread a run of 16 bytes where the
/// count allows it (the kernel falls back to a value a thread, looping, for operands that are not aligned).
fn elementwise_runs(n: u64, dtype: ElemType) -> LaunchConfig {
    let lanes = lanes16(dtype);
    elementwise(if n % lanes == 0 { n / lanes } else { n })
}

/// A strided copy of `elem`-byte elements as one of 16-byte runs, when its last axis is contiguous on both
/// sides and every extent, stride and offset along it falls on 16 bytes (a permute of whole heads, a slice of
/// whole rows): (the walk, the offsets) in runs. The same bytes move; a thread moves 16 of them at once.
pub(crate) fn by_runs(walk: &Walk, elem: u32, src_off: u64, dst_off: u64) -> Option<(Walk, u64, u64)> {
    let per = 16 / u64::from(elem.max(1));
    let last = walk.dims.len().checked_sub(1)?;
    let whole = |v: u64| v % per == 0;
    let fits = 16 % elem.max(1) == 0
        && per > 1
        && walk.a[last] == 1
        && walk.b[last] == 1
        && whole(walk.dims[last])
        && walk.a[..last].iter().chain(&walk.b[..last]).all(|&s| whole(s))
        && whole(src_off)
        && whole(dst_off);
    if !fits {
        return None;
    }
    let runs = |strides: &[u64]| {
        let mut s: Vec<u64> = strides[..last].iter().map(|&s| s / per).collect();
        s.push(1);
        s
    };
    let mut dims = walk.dims.clone();
    dims[last] /= per;
    Some((Walk { dims, a: runs(&walk.a), b: runs(&walk.b) }, src_off / per, dst_off / per))
}

/// Whether strides `s` walk `dims` as one contiguous run (`contiguous` in `kernels/walk.cuh`: an axis of
/// extent 1 takes any stride).
fn contiguous(dims: &[u64], s: &[u64]) -> bool {
    let mut run = 1;
    for (&d, &st) in dims.iter().zip(s).rev() {
        if d != 1 && st != run {
            return false;
        }
        run *= d;
    }
    true
}

/// A walk's extents and two stride lists, in the kernels' fixed-size arrays (the plan kept the rank within
/// [`MAX_RANK`]).
fn arrays(walk: &Walk) -> (i32, [i64; MAX_RANK], [i64; MAX_RANK], [i64; MAX_RANK]) {
    let (mut dims, mut a, mut b) = ([1; MAX_RANK], [0; MAX_RANK], [0; MAX_RANK]);
    for (i, ((&d, &sa), &sb)) in walk.dims.iter().zip(&walk.a).zip(&walk.b).enumerate() {
        dims[i] = d as i64;
        a[i] = sa as i64;
        b[i] = sb as i64;
    }
    (walk.dims.len() as i32, dims, a, b)
}

impl Engine {
    /// The launch of an untyped step.
    pub(super) fn lower_general(&self, step: &Step) -> GeneralLaunch {
        let p = |id: ref_graph::TensorId| self.ptrs[id.0];
        match *step {
            Step::Binary { op, a, b, out, dtype, ref walk } => {
                let (rank, dims, sa, sb) = arrays(walk);
                let n = walk.dims.iter().product::<u64>();
                let params = BinaryP {
                    a: p(a),
                    b: p(b),
                    out: p(out),
                    n: n as i64,
                    rank,
                    dt: dtype_code(dtype),
                    op: op as i32,
                    pad: 0,
                    dims,
                    sa,
                    sb,
                };
                let flat = contiguous(&walk.dims, &walk.a) && contiguous(&walk.dims, &walk.b);
                GeneralLaunch::Binary(if flat { elementwise_runs(n, dtype) } else { elementwise(n) }, params)
            }
            Step::Unary { func, input, out, n, dtype } => GeneralLaunch::Unary(
                elementwise_runs(n, dtype),
                UnaryP { x: p(input), out: p(out), n: n as i64, dt: dtype_code(dtype), func: func as i32 },
            ),
            Step::Glu { func, gate, up, out, n, dtype } => GeneralLaunch::Glu(
                elementwise_runs(n, dtype),
                GluP {
                    gate: p(gate),
                    up: p(up),
                    out: p(out),
                    n: n as i64,
                    dt: dtype_code(dtype),
                    func: func as i32,
                },
            ),
            Step::Mean { input, out, rows, dim, dtype } => GeneralLaunch::Mean(
                LaunchConfig { grid: (rows, 1, 1), block: (THREADS, 1, 1), shared_mem_bytes: 0 },
                MeanP { x: p(input), out: p(out), rows: rows as i32, dim: dim as i32, dt: dtype_code(dtype) },
            ),
            Step::Cast { input, out, n, from, to } => GeneralLaunch::Cast(
                elementwise(n),
                CastP { x: p(input), out: p(out), n: n as i64, from: dtype_code(from), to: dtype_code(to) },
            ),
            Step::Copy { src, dst, elem, ref walk, src_off, dst_off } => {
                let runs = by_runs(walk, elem, src_off, dst_off);
                let (walk, elem, src_off, dst_off) = match runs {
                    Some((ref runs, src_off, dst_off)) => (runs, 16, src_off, dst_off),
                    None => (walk, elem, src_off, dst_off),
                };
                let (rank, dims, ss, ds) = arrays(walk);
                let n = walk.dims.iter().product::<u64>();
                let params = CopyP {
                    src: p(src),
                    dst: p(dst),
                    n: n as i64,
                    src_off: src_off as i64,
                    dst_off: dst_off as i64,
                    rank,
                    elem: elem as i32,
                    dims,
                    ss,
                    ds,
                };
                GeneralLaunch::Copy(elementwise(n), params)
            }
            Step::Rope { x, cos, sin, out, dtype, half, ref walk } => {
                let (rank, dims, sc, ss) = arrays(walk);
                let n = walk.dims.iter().product::<u64>();
                let params = RopeP {
                    x: p(x),
                    cos: p(cos),
                    sin: p(sin),
                    out: p(out),
                    n: n as i64,
                    rank,
                    dt: dtype_code(dtype),
                    half: half as i32,
                    pad: 0,
                    dims,
                    sc,
                    ss,
                };
                // The kernel's runs (`rope` in the source): whole runs a half, the tables' last axis contiguous.
                let last = walk.dims.len().saturating_sub(1);
                let runs = u64::from(half) % lanes16(dtype) == 0
                    && walk.a.get(last) == Some(&1)
                    && walk.b.get(last) == Some(&1);
                GeneralLaunch::Rope(if runs { elementwise_runs(n, dtype) } else { elementwise(n) }, params)
            }
            Step::Positions { position, out, count } => GeneralLaunch::Positions(
                LaunchConfig { grid: (1, 1, 1), block: (32, 1, 1), shared_mem_bytes: 0 },
                PositionsP { pos: p(position), out: p(out), count: count as i32 },
            ),
            Step::Counters { ref sums } => self.counters(sums),
            Step::RopeTables { .. } => self.rope_tables(step),
            _ => unreachable!("the plan gives every typed step a float type, so it is lowered as typed"),
        }
    }

    /// A launch of up to [`COUNTERS_MAX`] counters (the plan puts no more in a step).
    fn counters(&self, sums: &[CounterSum]) -> GeneralLaunch {
        let mut params = CountersP {
            src: [0; COUNTERS_MAX],
            dst: [0; COUNTERS_MAX],
            add: [0; COUNTERS_MAX],
            n: sums.len() as i32,
        };
        for (i, sum) in sums.iter().enumerate() {
            (params.src[i], params.dst[i], params.add[i]) =
                (self.ptrs[sum.src.0], self.ptrs[sum.out.0], sum.add);
        }
        let config = LaunchConfig { grid: (1, 1, 1), block: (32, 1, 1), shared_mem_bytes: 0 };
        GeneralLaunch::Counters(config, params)
    }

    /// The launch of a [`Step::RopeTables`].
    fn rope_tables(&self, step: &Step) -> GeneralLaunch {
        let Step::RopeTables { position, inv_freq, cos, sin, rows, half, dtype } = *step else {
            unreachable!("called for RoPE's tables")
        };
        let p = |id: ref_graph::TensorId| self.ptrs[id.0];
        let params = RopeTablesP {
            pos: p(position),
            inv_freq: p(inv_freq),
            cos: p(cos),
            sin: p(sin),
            rows: rows as i32,
            half: half as i32,
            dt: dtype_code(dtype),
            pad: 0,
        };
        GeneralLaunch::RopeTables(elementwise(u64::from(rows) * 2 * u64::from(half)), params)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every byte a walk of `elem`-byte elements moves: (source byte, destination byte), in order.
    fn bytes_moved(walk: &Walk, elem: u64, src_off: u64, dst_off: u64) -> Vec<(u64, u64)> {
        let n: u64 = walk.dims.iter().product();
        let mut moved = Vec::new();
        for i in 0..n {
            let (mut rest, mut s, mut d) = (i, src_off, dst_off);
            for axis in (0..walk.dims.len()).rev() {
                let c = rest % walk.dims[axis];
                rest /= walk.dims[axis];
                s += c * walk.a[axis];
                d += c * walk.b[axis];
            }
            moved.extend((0..elem).map(|k| (s * elem + k, d * elem + k)));
        }
        moved.sort_unstable();
        moved
    }

    /// A permute of whole heads (`[T, H, D]` to `[H, T, D]`, bf16) and a slice of whole rows move as 16-byte
    /// runs, the same bytes to the same places; a last axis that is strided or not whole runs, or an offset
    /// off 16 bytes, keeps its elements.
    #[test]
    fn copies_of_whole_16_byte_runs_move_the_same_bytes_in_runs() {
        let (t, h, d) = (5, 3, 64);
        let permute = Walk { dims: vec![h, t, d], a: vec![d, h * d, 1], b: vec![t * d, d, 1] };
        let slice = Walk { dims: vec![4, 24], a: vec![40, 1], b: vec![24, 1] };
        for (walk, elem, src_off, dst_off) in [(&permute, 2, 0, 0), (&slice, 2, 16, 8), (&slice, 4, 8, 0)] {
            let (runs, s, d) = by_runs(walk, elem, src_off, dst_off).expect("whole runs");
            assert_eq!(runs.dims.last().map(|d| d * 16), walk.dims.last().map(|d| d * u64::from(elem)));
            assert_eq!(
                bytes_moved(&runs, 16, s, d),
                bytes_moved(walk, u64::from(elem), src_off, dst_off),
                "{walk:?}"
            );
        }
        let strided = Walk { dims: vec![8, 16], a: vec![1, 8], b: vec![16, 1] };
        let short = Walk { dims: vec![4, 12], a: vec![12, 1], b: vec![12, 1] };
        assert_eq!(by_runs(&strided, 2, 0, 0), None, "a strided last axis");
        assert_eq!(by_runs(&short, 2, 0, 0), None, "rows of 24 bytes");
        assert_eq!(by_runs(&slice, 2, 4, 0), None, "an offset of 8 bytes");
        assert_eq!(by_runs(&permute, 8, 0, 0).map(|r| r.0.dims), Some(vec![h, t, d / 2]), "i64 in pairs");
    }
}
