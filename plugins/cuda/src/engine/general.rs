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

/// A strided copy's launch parameters made, in place, a copy of 16-byte runs when its last axis is contiguous
/// on both sides and every extent, stride and offset along it falls on 16 bytes (a permute of whole heads, a
/// slice of whole rows): whether they were. The same bytes move; a thread moves 16 of them at once. No
/// allocation: it runs as each call's launches are made.
pub(crate) fn in_runs(p: &mut CopyP) -> bool {
    if p.elem <= 0 || p.elem >= 16 || 16 % p.elem != 0 || p.rank < 1 {
        return false;
    }
    let per = i64::from(16 / p.elem);
    let last = (p.rank - 1) as usize;
    let whole = |v: i64| v % per == 0;
    let fits = p.ss[last] == 1
        && p.ds[last] == 1
        && whole(p.dims[last])
        && p.ss[..last].iter().chain(&p.ds[..last]).all(|&s| whole(s))
        && whole(p.src_off)
        && whole(p.dst_off);
    if !fits {
        return false;
    }
    for s in p.ss[..last].iter_mut().chain(p.ds[..last].iter_mut()) {
        *s /= per;
    }
    p.dims[last] /= per;
    p.n /= per;
    p.src_off /= per;
    p.dst_off /= per;
    p.elem = 16;
    true
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

/// A strided copy's parameters but its addresses (null).
fn copy_params(walk: &Walk, elem: u32, src_off: u64, dst_off: u64) -> CopyP {
    let (rank, dims, ss, ds) = arrays(walk);
    let n = walk.dims.iter().product::<u64>();
    CopyP {
        src: 0,
        dst: 0,
        n: n as i64,
        src_off: src_off as i64,
        dst_off: dst_off as i64,
        rank,
        elem: elem as i32,
        dims,
        ss,
        ds,
    }
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
                let mut params = copy_params(walk, elem, src_off, dst_off);
                (params.src, params.dst) = (p(src), p(dst));
                in_runs(&mut params);
                GeneralLaunch::Copy(elementwise(params.n as u64), params)
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

    /// Every byte a copy's parameters move: (source byte, destination byte), in order.
    fn bytes_moved(p: &CopyP) -> Vec<(i64, i64)> {
        let (rank, elem) = (p.rank as usize, i64::from(p.elem));
        let mut moved = Vec::new();
        for i in 0..p.n {
            let (mut rest, mut s, mut d) = (i, p.src_off, p.dst_off);
            for axis in (0..rank).rev() {
                let c = rest % p.dims[axis];
                rest /= p.dims[axis];
                s += c * p.ss[axis];
                d += c * p.ds[axis];
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
            let copy = copy_params(walk, elem, src_off, dst_off);
            let mut runs = copy;
            assert!(in_runs(&mut runs), "{walk:?}");
            assert_eq!((runs.elem, runs.n * 16), (16, copy.n * i64::from(elem)));
            assert_eq!(bytes_moved(&runs), bytes_moved(&copy), "{walk:?}");
        }
        let strided = Walk { dims: vec![8, 16], a: vec![1, 8], b: vec![16, 1] };
        let short = Walk { dims: vec![4, 12], a: vec![12, 1], b: vec![12, 1] };
        for (walk, elem, src_off, what) in [
            (&strided, 2, 0, "a strided last axis"),
            (&short, 2, 0, "rows of 24 bytes"),
            (&slice, 2, 4, "an offset of 8 bytes"),
        ] {
            let mut p = copy_params(walk, elem, src_off, 0);
            assert!(!in_runs(&mut p), "{what}");
            assert_eq!(p.elem, elem as i32, "{what}: unchanged");
        }
        let mut pairs = copy_params(&permute, 8, 0, 0);
        assert!(in_runs(&mut pairs));
        assert_eq!(pairs.dims[..3], [h as i64, t as i64, d as i64 / 2], "i64 in pairs");
    }
}
