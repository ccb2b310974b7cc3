//! Products of many rows on tensor cores: a step of the plan whose GEMV computes [`GEMM_MIN_ROWS`] rows or more
//! (a prefill's chunk of the prompt) runs its products as cuBLAS GEMMs, and what the GEMV fuses around them as
//! the launches the plan already has for them, each over all the rows at once:
//! - the RMS norm of the activation into scratch first (`Step::Norm`);
//! - each product `y = a w^T` (`[N, K]` weights as stored or as their transposed upload), f16 and bf16 on
//!   tensor cores with f32 accumulation, f32 in full f32 (no TF32: its 10-bit mantissa would put an f32
//!   export outside the oracle's tolerance);
//! - a bias as a broadcast add, a GELU over the product in place, a residual (and a parallel residual's second
//!   one) as an add into the product (so every value is rounded where the graph's separate ops round it: the
//!   product, then each sum), SwiGLU (or a gated GELU) as one launch over the two products in scratch,
//!   `func(gate) * up` rounded as the two ops round (`Step::Glu`), and the fused cache rows as one cache update
//!   of the rows written.
//!
//! A decode step (one row) is untouched: its GEMV keeps every fusion and its launches are the plan's. Pure:
//! [`Expansion`] decides every launch from the plan; `launch` holds the cuBLAS handle, its workspace and the
//! scratch, allocated at `init` (nothing is allocated on the execute path, and the products can be captured
//! into a CUDA graph). No `unsafe` here: the engine queues the products and the prefill attention
//! ([`attention`]) in its launches, the crate's FFI layer.
#![forbid(unsafe_code)]

pub(crate) mod attention;
pub(crate) mod launch;
#[cfg(test)]
mod tests;

use ref_graph::{ElemType, TensorId, UnaryFn};

use crate::plan::{BinOp, CacheRows, Float, GemvMat, KvLayout, Plan, Softcap, Step, Walk};

/// Fewest rows a GEMV step computes for its products to run as GEMMs. Every step of more than one row: the
/// GEMV kernel reads each weight row once per activation row (its blocks of one row run before the next
/// row's), so a product whose weights do not stay in L2 (the vocabulary projection: 525 MB at Llama-3.2-1B's
/// shape) reads them from memory once per row, where a GEMM reads them once for all rows; what the GEMV saves
/// over it (the launches it fuses: about five a layer) is worth less than one more pass over a layer's
/// weights from the second row on. One row, the decode step, keeps the fused GEMV.
pub const GEMM_MIN_ROWS: u32 = 2;

/// One launch of a step on the GEMM path.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    /// A launch the engine lowers as it lowers any step of the plan (its tensors the graph's or this path's
    /// scratch).
    Step(Step),
    /// A product on cuBLAS.
    Product(Product),
}

/// `y[m, n] = a[m, k] . w[n, :]` (row-major, each contiguous), of one float type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Product {
    pub a: TensorId,
    /// The `[N, K]` weight, or a `[K, N]` constant read through its transposed upload (`transposed`).
    pub w: TensorId,
    pub transposed: bool,
    /// The weight row of output column 0 (a slice of the weight's rows: column `c` reads row `w_row + c`).
    pub w_row: u32,
    pub y: TensorId,
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub float: Float,
}

/// What a scratch tensor of the path holds; each role is one buffer, as large as its largest use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The normalised activation rows.
    Normed = 0,
    /// The gate product of a SwiGLU.
    Gate = 1,
    /// The up product of a SwiGLU.
    Up = 2,
}

/// The GEMM path of a plan: which steps take it and their launches, and the scratch tensors they use.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Expansion {
    /// By step index: the step's launches when it takes the GEMM path, else `None`.
    pub parts: Vec<Option<Vec<Part>>>,
    /// The scratch tensors (ids past the graph's, each an entry the plan's `dtypes` gained) and their roles.
    pub scratch: Vec<(TensorId, Role)>,
    /// Bytes of each role's buffer, by [`Role`].
    pub role_bytes: [usize; 3],
}

impl Expansion {
    /// The GEMM path of `plan`: every step [`routes`] sends to it, expanded; `plan.dtypes` gains an entry per
    /// scratch tensor (ids past the graph's: no home, the engine's GEMM runner owns their memory).
    pub fn new(plan: &mut Plan) -> Expansion {
        let mut e = Expansion::default();
        e.parts = plan.steps.iter().map(|step| e.expand(step, &mut plan.dtypes)).collect();
        e
    }

    /// Whether any step takes the GEMM path.
    pub fn any(&self) -> bool {
        self.parts.iter().any(Option::is_some)
    }

    /// The most launches a call of the plan queues: one a step, or its parts for a step on the GEMM path (what
    /// the engine reserves, so a call never allocates).
    pub fn launches(&self) -> usize {
        self.parts.iter().map(|parts| parts.as_ref().map_or(1, Vec::len)).sum()
    }

    /// The launches of step `index` when it takes the GEMM path.
    pub fn of(&self, index: usize) -> Option<&[Part]> {
        self.parts.get(index).and_then(|p| p.as_deref())
    }

    /// A new scratch tensor of `role` and `dtype` holding `elems` values.
    fn scratch(&mut self, role: Role, dtype: ElemType, elems: u64, dtypes: &mut Vec<ElemType>) -> TensorId {
        let id = TensorId(dtypes.len());
        dtypes.push(dtype);
        self.scratch.push((id, role));
        let bytes = usize::try_from(elems).unwrap_or(usize::MAX).saturating_mul(dtype.size_bytes());
        self.role_bytes[role as usize] = self.role_bytes[role as usize].max(bytes);
        id
    }

    /// The launches of `step` on the GEMM path, or `None` when it keeps its own. Every field of the step and of
    /// its matrices is named here (none is `..`), so a fusion added to the GEMV is a compile error here until
    /// the GEMM path does it too.
    fn expand(&mut self, step: &Step, dtypes: &mut Vec<ElemType>) -> Option<Vec<Part>> {
        if !routes(step) {
            return None;
        }
        // `early` only concerns the GEMV kernel's prologue; `rope` is `None` (`routes`).
        let Step::Gemv { a, norm, ref mats, cache_rows, m, k, early: _, glu, rope: _, activation, softcap } =
            *step
        else {
            return None;
        };
        let dtype = dtypes[a.0];
        let float = Float::of(dtype)?;
        if glu.is_some() && mats.len() != 2 {
            return None; // `fuse_glu` fuses exactly the gate and the up projection
        }
        let rows = u64::from(m);
        let mut parts = Vec::new();
        let act = match norm {
            Some(norm) => {
                let out = self.scratch(Role::Normed, dtype, rows * u64::from(k), dtypes);
                parts.push(Part::Step(Step::Norm { input: a, out, rows: m, dim: k, norm, residual: None }));
                out
            }
            None => a,
        };
        // Each matrix's product into `y` (its own output, or a SwiGLU's scratch), then its epilogue in the
        // GEMV's order: bias, activation (a gated GEMV's is the gate's, below), residual, second residual.
        let own_activation = activation.filter(|_| glu.is_none());
        let product = |mat: &GemvMat, y: TensorId, parts: &mut Vec<Part>| {
            let GemvMat {
                w,
                transposed,
                n,
                y: _,
                bias,
                residual,
                residual2,
                cache: _,
                roped: _,
                rows: w_rows,
            } = *mat;
            parts.push(Part::Product(Product {
                a: act,
                w,
                transposed,
                w_row: w_rows.of(0),
                y,
                m,
                n,
                k,
                float,
            }));
            let elems = rows * u64::from(n);
            if let Some(bias) = bias {
                parts.push(Part::Step(bias_add(y, bias, rows, n, dtype)));
            }
            if let Some(func) = own_activation {
                parts.push(Part::Step(Step::Unary { func, input: y, out: y, n: elems, dtype }));
            }
            for res in [residual, residual2].into_iter().flatten() {
                parts.push(Part::Step(Step::Add { a: y, b: res, out: y, n: elems }));
            }
            if let Some(cap) = softcap {
                parts.extend(softcap_steps(y, cap, elems, dtype).map(Part::Step));
            }
        };
        if let Some(out) = glu {
            // `fuse_glu` puts the gate first; neither has a residual or a cache.
            let [gate, up] = &mats[..] else { unreachable!("two matrices, checked above") };
            let elems = rows * u64::from(gate.n);
            let (g, u) = (
                self.scratch(Role::Gate, dtype, elems, dtypes),
                self.scratch(Role::Up, dtype, rows * u64::from(up.n), dtypes),
            );
            product(gate, g, &mut parts);
            product(up, u, &mut parts);
            // SiLU, or a gated GELU's GELU, and the product with up in one launch.
            let func = activation.unwrap_or(UnaryFn::Silu);
            parts.push(Part::Step(Step::Glu { func, gate: g, up: u, out, n: elems, dtype }));
            return Some(parts);
        }
        for mat in mats {
            product(mat, mat.y, &mut parts);
        }
        if let Some(c) = cache_rows {
            parts.extend(cache_updates(mats, c, m));
        }
        Some(parts)
    }
}

/// A product's soft-capping in place as its three ops: `y / divisor`, `tanh`, `* factor` (the constants
/// broadcast along `y`'s `elems` values).
fn softcap_steps(y: TensorId, cap: Softcap, elems: u64, dtype: ElemType) -> [Step; 3] {
    let scalar = || Walk { dims: vec![elems], a: vec![1], b: vec![0] };
    let binary = |op, b| Step::Binary { op, a: y, b, out: y, dtype, walk: scalar() };
    [
        binary(BinOp::Div, cap.divisor),
        Step::Unary { func: UnaryFn::Tanh, input: y, out: y, n: elems, dtype },
        binary(BinOp::Mul, cap.factor),
    ]
}

/// The cache rows a GEMV step of `m` rows writes itself (`c`), as cache updates of the products it stored:
/// the K and V caches two to a launch, token-major.
fn cache_updates(mats: &[GemvMat], c: CacheRows, m: u32) -> Vec<Part> {
    let updates: Vec<(TensorId, TensorId)> =
        mats.iter().filter_map(|mat| mat.cache.map(|cache| (cache, mat.y))).collect();
    let layout = KvLayout { rows: m, heads: c.heads, len: c.len, head_dim: c.head_dim, head_major: false };
    updates
        .chunks(2)
        .map(|caches| Part::Step(Step::KvUpdate { caches: caches.to_vec(), position: c.position, layout }))
        .collect()
}

/// Whether `step` takes the GEMM path: a GEMV of [`GEMM_MIN_ROWS`] rows or more that stores nothing rotated
/// (the planner fuses RoPE into one-row GEMVs alone) and whose matrices each read consecutive weight rows (a
/// head-interleaved slice keeps its GEMV), a slice past the first row without a bias.
pub fn routes(step: &Step) -> bool {
    match *step {
        Step::Gemv { m, rope: None, ref mats, .. } if m >= GEMM_MIN_ROWS => mats.iter().all(consecutive_rows),
        _ => false,
    }
}

/// Whether `mat`'s columns read consecutive rows of its weight (column `c` the first one's row plus `c`), and
/// its bias (if any) from its first element.
fn consecutive_rows(mat: &GemvMat) -> bool {
    let first = mat.rows.of(0);
    let consecutive = mat.n == 0 || mat.rows.of(mat.n - 1) == first + (mat.n - 1);
    consecutive && (mat.bias.is_none() || first == 0)
}

/// `y[r, j] += bias[j]` over `rows` rows of `n`.
fn bias_add(y: TensorId, bias: TensorId, rows: u64, n: u32, dtype: ElemType) -> Step {
    let n = u64::from(n);
    let walk = Walk { dims: vec![rows, n], a: vec![n, 1], b: vec![0, 1] };
    Step::Binary { op: BinOp::Add, a: y, b: bias, out: y, dtype, walk }
}
