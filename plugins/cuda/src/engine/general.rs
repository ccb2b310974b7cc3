//! The launches of the general path's untyped steps, with this call's addresses.

use cuda_rt::LaunchConfig;

use super::Engine;
use crate::kernels::general::{
    dtype_code, BinaryP, CastP, CopyP, CountersP, GeneralLaunch, GluP, MeanP, PositionsP, RopeP, RopeTablesP,
    UnaryP, COUNTERS_MAX, MAX_RANK,
};
use crate::plan::{CounterSum, Step, Walk};

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
                GeneralLaunch::Binary(elementwise(n), params)
            }
            Step::Unary { func, input, out, n, dtype } => GeneralLaunch::Unary(
                elementwise(n),
                UnaryP { x: p(input), out: p(out), n: n as i64, dt: dtype_code(dtype), func: func as i32 },
            ),
            Step::Glu { func, gate, up, out, n, dtype } => GeneralLaunch::Glu(
                elementwise(n),
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
                GeneralLaunch::Rope(elementwise(n), params)
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
