//! Lowering a reference graph to kernel launches, once at `init`: element type, where every tensor lives,
//! and the launch sequence with the fusions a one-row decode step wants. Pure: no CUDA here, so it is tested
//! on any machine.
//!
//! Fusions (each only where it cannot change a result):
//! - up to three consecutive `MatMul`s reading the same activation with weights of one shape become one GEMV
//!   launch (the Q, K and V projections);
//! - a `MatMul` whose output only feeds the next op, an `Add` with it, becomes a GEMV with a residual (the
//!   attention output projection and the residual stream);
//! - consecutive `KvCacheUpdate`s at the same position with updates of one shape become one launch (K and V).
#![forbid(unsafe_code)]

use ref_graph::{ElemType, Graph, Op, TensorId};

use crate::kernels::{self, ATTN_MAX_HEAD, ATTN_THREADS, GEMV_WARPS};

/// The floating-point element type a graph computes in: all its float tensors share one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Float {
    /// `f32` storage.
    F32,
    /// IEEE half storage, `f32` arithmetic.
    F16,
}

/// Why a graph cannot be lowered. `NotSupported` (the graph is valid, this delegate lacks the case).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unsupported(pub String);

/// Where a tensor's bytes live during a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Home {
    /// A constant, uploaded at `init` (index into the plan's constants).
    Constant(usize),
    /// A graph input or output: the call's argument, or the argument's staging when it is host memory.
    Io,
    /// An intermediate: device scratch of the instance, allocated at `init`.
    Scratch,
    /// The same storage as another tensor: a `KvCacheUpdate` output is its cache.
    SameAs(TensorId),
}

/// One launch, in graph terms; [`crate::engine`] resolves tensors to addresses per call.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    Gather {
        table: TensorId,
        indices: TensorId,
        out: TensorId,
        rows: u32,
        n: u32,
        dim: u32,
        plus: Option<PositionRows>,
    },
    Positions {
        position: TensorId,
        out: TensorId,
        count: u32,
    },
    Add {
        a: TensorId,
        b: TensorId,
        out: TensorId,
        n: u64,
    },
    RmsNorm {
        input: TensorId,
        weight: TensorId,
        out: TensorId,
        rows: u32,
        dim: u32,
        eps: f32,
    },
    Gemv {
        a: TensorId,
        norm: Option<(TensorId, f32)>,
        mats: Vec<GemvMat>,
        cache_rows: Option<CacheRows>,
        m: u32,
        k: u32,
        n: u32,
        ksplit: u32,
        rows_per_split: u32,
    },
    KvUpdate {
        caches: Vec<(TensorId, TensorId)>,
        position: TensorId,
        rows: u32,
        heads: u32,
        len: u32,
        head_dim: u32,
    },
    Attention {
        q: TensorId,
        k: TensorId,
        v: TensorId,
        position: TensorId,
        out: TensorId,
        rows: u32,
        heads: u32,
        len: u32,
        head_dim: u32,
        chunk: u32,
        tpr: u32,
    },
    Argmax {
        input: TensorId,
        out: TensorId,
        m: u32,
        n: u32,
    },
}

/// A second table a fused embedding adds: row `position[0] + r` of `table` to output row `r`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PositionRows {
    pub table: TensorId,
    pub position: TensorId,
    pub n: u32,
}

/// One matrix of a fused GEMV: weight, output, optional residual added to the product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemvMat {
    pub w: TensorId,
    pub y: TensorId,
    pub residual: Option<TensorId>,
    /// A KV cache whose row at the step's position also receives `y` (the cache update, fused).
    pub cache: Option<TensorId>,
}

/// Where a GEMV's fused cache updates write: the position tensor and the caches' `[heads, len, head_dim]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheRows {
    pub position: TensorId,
    pub heads: u32,
    pub len: u32,
    pub head_dim: u32,
}

/// The lowered graph.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The element type of every float tensor.
    pub float: Float,
    /// Where each tensor lives, by [`TensorId`] index.
    pub homes: Vec<Home>,
    /// The launches, in order.
    pub steps: Vec<Step>,
    /// Largest GEMV partial-sum scratch any step needs, in f32 elements.
    pub gemv_partial: usize,
    /// Largest GEMV ticket-counter array any step needs.
    pub gemv_counters: usize,
    /// Largest attention scratch any step needs: (partial outputs, maxima and sums), in f32 elements.
    pub attn_scratch: (usize, usize),
}

/// GEMV blocks a launch aims for: about two per SM of a large GPU, so one weight read spreads over the chip.
const GEMV_TARGET_BLOCKS: u32 = 256;
/// Most K rows one GEMV block stages in shared memory.
const GEMV_MAX_ROWS: u32 = 4096;
/// Fewest K rows per split (eight per warp): finer splits add partial sums the last block must add up
/// serially, which costs more than the parallelism gains.
const GEMV_MIN_ROWS: u32 = 64;

fn u32_of(value: u64, what: &str) -> Result<u32, Unsupported> {
    u32::try_from(value)
        .ok()
        .filter(|&v| v < i32::MAX as u32)
        .ok_or_else(|| Unsupported(format!("{what} {value} exceeds the kernels' 32-bit extents")))
}

/// How an attention block splits its work for heads of `head_dim`: (cache rows per block, threads per row in
/// the K pass). One thread per row and [`ATTN_THREADS`] rows per block: measured on the H200 (config (c),
/// positions 4096 and 8191), four threads per row over 64-row blocks gave more warps but 4x the chunks to
/// combine, and was slower (1090 and 1585 µs per step against 1028 and 1225); rows per block from 64 to 512
/// changed little. The kernel takes any power of two up to 32 threads per row.
fn attention_shape(_float: Float, _head_dim: u32) -> (u32, u32) {
    (ATTN_THREADS, 1)
}

/// Splits a GEMV of `m` rows, `nmat` matrices and `k x n` weights over the GPU: (ksplit, rows per split).
pub fn gemv_split(float: Float, m: u32, nmat: u32, k: u32, n: u32) -> (u32, u32) {
    let tiles = n.div_ceil(32 * kernels::vec_width(float));
    let others = (tiles * m * nmat).max(1);
    let wanted = GEMV_TARGET_BLOCKS.div_ceil(others);
    let most = k.div_ceil(GEMV_MIN_ROWS.max(GEMV_WARPS)).max(1);
    let least = k.div_ceil(GEMV_MAX_ROWS).max(1);
    let ksplit = wanted.clamp(least, most.max(least));
    let rows = k.div_ceil(ksplit);
    (k.div_ceil(rows), rows)
}

impl Plan {
    /// Lowers `graph`.
    pub fn new(graph: &Graph) -> Result<Plan, Unsupported> {
        if let Some(&id) = graph.state().first() {
            return Err(Unsupported(format!(
                "cache '{}' is delegate-owned state (reference-graph payload 1.2), which the CUDA delegate does \
                 not hold yet; export the caches as program buffers",
                graph.tensor(id).name
            )));
        }
        let tensors = graph.tensors();
        let float = float_of(graph)?;
        let mut homes = vec![Home::Scratch; tensors.len()];
        for (index, (id, _)) in graph.constants().enumerate() {
            homes[id.0] = Home::Constant(index);
        }
        for &id in graph.inputs().iter().chain(graph.outputs()) {
            homes[id.0] = Home::Io;
        }
        let shape = |id: TensorId| tensors[id.0].shape.as_slice();
        let uses = |id: TensorId| graph.ops().iter().filter(|op| op.operands().contains(&id)).count();
        let is_output = |id: TensorId| graph.outputs().contains(&id);

        let ops = graph.ops();
        let mut steps = Vec::with_capacity(ops.len());
        let (mut gemv_partial, mut gemv_counters, mut attn_scratch) = (0usize, 0usize, (0usize, 0usize));
        let mut i = 0;
        while i < ops.len() {
            match ops[i] {
                Op::Gather { table, indices, out } => {
                    let t = shape(table);
                    let (rows, dim) = (shape(indices)[0], t[1]);
                    let (mut out, mut plus) = (out, None);
                    // The embedding: token rows plus the rows of the positions `position + r`, added.
                    if let (
                        Some(&Op::Positions { position, count, out: p }),
                        Some(&Op::Gather { table: t2, indices: i2, out: g2 }),
                        Some(&Op::Add { a, b, out: sum }),
                    ) = (ops.get(i + 1), ops.get(i + 2), ops.get(i + 3))
                    {
                        let private = |id: TensorId| uses(id) == 1 && !is_output(id);
                        if i2 == p
                            && count == rows
                            && shape(t2)[1] == dim
                            && ((a, b) == (out, g2) || (a, b) == (g2, out))
                            && [out, p, g2].into_iter().all(private)
                        {
                            plus = Some(PositionRows {
                                table: t2,
                                position,
                                n: u32_of(shape(t2)[0], "table rows")?,
                            });
                            out = sum;
                            i += 3;
                        }
                    }
                    steps.push(Step::Gather {
                        table,
                        indices,
                        out,
                        rows: u32_of(rows, "row count")?,
                        n: u32_of(t[0], "table rows")?,
                        dim: u32_of(dim, "table width")?,
                        plus,
                    });
                }
                Op::Positions { position, count, out } => {
                    steps.push(Step::Positions { position, out, count: u32_of(count, "position count")? })
                }
                Op::Add { a, b, out } => {
                    steps.push(Step::Add { a, b, out, n: tensors[out.0].numel() as u64 })
                }
                Op::RmsNorm { input, weight, eps, out } => {
                    let s = shape(input);
                    steps.push(Step::RmsNorm {
                        input,
                        weight,
                        out,
                        rows: u32_of(s[0], "rows")?,
                        dim: u32_of(s[1], "width")?,
                        eps,
                    });
                }
                Op::MatMul { a, b, transpose_b: false, bias: None, out } => {
                    let (m, k) = (u32_of(shape(a)[0], "rows")?, u32_of(shape(a)[1], "inner extent")?);
                    let n = u32_of(shape(b)[1], "columns")?;
                    let mut mats = vec![GemvMat { w: b, y: out, residual: None, cache: None }];
                    // Siblings: the next MatMuls reading the same `a` with weights of the same shape.
                    while mats.len() < 3 {
                        match ops.get(i + 1) {
                            Some(&Op::MatMul { a: a2, b: b2, transpose_b: false, bias: None, out: out2 })
                                if a2 == a && shape(b2) == shape(b) =>
                            {
                                mats.push(GemvMat { w: b2, y: out2, residual: None, cache: None });
                                i += 1;
                            }
                            _ => break,
                        }
                    }
                    // A lone product feeding only the next op's Add becomes that Add's output.
                    if mats.len() == 1 && uses(out) == 1 && !is_output(out) {
                        if let Some(&Op::Add { a: x, b: y, out: sum }) = ops.get(i + 1) {
                            let other = if x == out {
                                Some(y)
                            } else if y == out {
                                Some(x)
                            } else {
                                None
                            };
                            if let Some(residual) = other.filter(|&r| r != out) {
                                mats[0] = GemvMat { w: b, y: sum, residual: Some(residual), cache: None };
                                i += 1;
                            }
                        }
                    }
                    // An RMS norm whose output only these products read is done inside the GEMV.
                    let mut a = a;
                    let mut norm = None;
                    if let Some(&Step::RmsNorm { input, weight, out: h, eps, .. }) = steps.last() {
                        if h == a && uses(h) == mats.len() && !is_output(h) {
                            steps.pop();
                            (a, norm) = (input, Some((weight, eps)));
                        }
                    }
                    let nmat = mats.len() as u32;
                    let (ksplit, rows_per_split) = gemv_split(float, m, nmat, k, n);
                    if ksplit > 1 {
                        let tiles = n.div_ceil(32 * kernels::vec_width(float)) as usize;
                        gemv_partial = gemv_partial.max((nmat * m * ksplit) as usize * n as usize);
                        gemv_counters = gemv_counters.max((nmat * m) as usize * tiles);
                    }
                    steps.push(Step::Gemv {
                        a,
                        norm,
                        mats,
                        cache_rows: None,
                        m,
                        k,
                        n,
                        ksplit,
                        rows_per_split,
                    });
                }
                Op::KvCacheUpdate { cache, update, position, out } => {
                    homes[out.0] = Home::SameAs(cache);
                    let c = shape(cache);
                    let (heads, len, head_dim) =
                        (u32_of(c[0], "heads")?, u32_of(c[1], "cache length")?, u32_of(c[2], "head size")?);
                    let rows = u32_of(shape(update)[0], "rows")?;
                    let mut caches = vec![(cache, update)];
                    if let Some(&Op::KvCacheUpdate { cache: c2, update: u2, position: p2, out: o2 }) =
                        ops.get(i + 1)
                    {
                        if p2 == position && shape(c2) == c && shape(u2) == shape(update) {
                            homes[o2.0] = Home::SameAs(c2);
                            caches.push((c2, u2));
                            i += 1;
                        }
                    }
                    // Updates the previous GEMV computes are written into the caches by that GEMV itself.
                    if let Some(Step::Gemv { mats, cache_rows: cache_rows @ None, m, .. }) = steps.last_mut()
                    {
                        let fused = *m == rows
                            && caches.iter().all(|&(_, update)| mats.iter().any(|mat| mat.y == update));
                        if fused {
                            for &(cache, update) in &caches {
                                if let Some(mat) = mats.iter_mut().find(|mat| mat.y == update) {
                                    mat.cache = Some(cache);
                                }
                            }
                            *cache_rows = Some(CacheRows { position, heads, len, head_dim });
                            i += 1;
                            continue;
                        }
                    }
                    steps.push(Step::KvUpdate { caches, position, rows, heads, len, head_dim });
                }
                Op::CausalAttention { q, k, v, position, scale: None, out } => {
                    let c = shape(k);
                    let (heads, len, head_dim) =
                        (u32_of(c[0], "heads")?, u32_of(c[1], "cache length")?, u32_of(c[2], "head size")?);
                    if head_dim > ATTN_MAX_HEAD {
                        return Err(Unsupported(format!(
                            "attention '{}' has head size {head_dim}; the CUDA delegate's attention handles up to {ATTN_MAX_HEAD}",
                            tensors[out.0].name
                        )));
                    }
                    let (chunk, tpr) = attention_shape(float, head_dim);
                    let rows = u32_of(shape(q)[0], "rows")?;
                    let chunks = len.div_ceil(chunk) as usize;
                    let slots = rows as usize * heads as usize * chunks;
                    attn_scratch.0 = attn_scratch.0.max(slots * head_dim as usize);
                    attn_scratch.1 = attn_scratch.1.max(slots * 2);
                    steps.push(Step::Attention {
                        q,
                        k,
                        v,
                        position,
                        out,
                        rows,
                        heads,
                        len,
                        head_dim,
                        chunk,
                        tpr,
                    });
                }
                Op::Argmax { input, out } => {
                    let s = shape(input);
                    steps.push(Step::Argmax {
                        input,
                        out,
                        m: u32_of(s[0], "rows")?,
                        n: u32_of(s[1], "columns")?,
                    });
                }
                ref other => return Err(Unsupported(format!("op '{}' is not run yet", other.name()))),
            }
            i += 1;
        }
        Ok(Plan { float, homes, steps, gemv_partial, gemv_counters, attn_scratch })
    }
}

/// The one float type of `graph`'s tensors (f32 when it has none).
fn float_of(graph: &Graph) -> Result<Float, Unsupported> {
    let mut found: Option<(Float, &str)> = None;
    for t in graph.tensors() {
        let this = match t.dtype {
            ElemType::F32 => Float::F32,
            ElemType::F16 => Float::F16,
            ElemType::Bf16 => return Err(Unsupported(format!("tensor '{}' is bf16", t.name))),
            ElemType::I64 => continue,
        };
        match found {
            None => found = Some((this, &t.name)),
            Some((first, name)) if first != this => {
                return Err(Unsupported(format!(
                    "tensors '{name}' and '{}' have different float types; the CUDA delegate runs graphs in one float type",
                    t.name
                )))
            }
            Some(_) => {}
        }
    }
    Ok(found.map_or(Float::F32, |(f, _)| f))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kv_example::{model, Config, Weights};

    fn kinds(plan: &Plan) -> Vec<String> {
        plan.steps
            .iter()
            .map(|s| match s {
                Step::Gather { plus: Some(_), .. } => "embedding".to_owned(),
                Step::Gather { .. } => "gather".to_owned(),
                Step::Positions { .. } => "positions".to_owned(),
                Step::Add { .. } => "add".to_owned(),
                Step::RmsNorm { .. } => "rms_norm".to_owned(),
                Step::Gemv { mats, norm, cache_rows, .. } => format!(
                    "{}gemv{}{}{}",
                    if norm.is_some() { "norm+" } else { "" },
                    mats.len(),
                    if mats[0].residual.is_some() { "+residual" } else { "" },
                    if cache_rows.is_some() { "+kv_update" } else { "" }
                ),
                Step::KvUpdate { caches, .. } => format!("kv_update{}", caches.len()),
                Step::Attention { .. } => "attention".to_owned(),
                Step::Argmax { .. } => "argmax".to_owned(),
            })
            .collect()
    }

    #[test]
    fn decode_step_fuses_projections_residuals_and_cache_updates() {
        let cfg = Config { layers: 2, ..Config::tiny() };
        let graph = model::build_graph(&cfg, &Weights::generate(&cfg), 1).expect("graph");
        let plan = Plan::new(&graph).expect("lowered");
        let layer = ["norm+gemv3+kv_update", "attention", "gemv1+residual"];
        let mut expected: Vec<&str> = vec!["embedding"];
        expected.extend(layer);
        expected.extend(layer);
        expected.extend(["norm+gemv1"]);
        let got = kinds(&plan);
        assert_eq!(got[..expected.len()], expected[..], "{got:?}");
        // Whatever follows the logits projection reads the logits (argmax), never a cache.
        assert!(got[expected.len()..].iter().all(|k| k == "argmax"), "{got:?}");
        assert_eq!(plan.float, Float::F32);
        for layer in 0..cfg.layers {
            for (out, cache) in [
                (model::k_cache_out(layer), model::k_cache(layer)),
                (model::v_cache_out(layer), model::v_cache(layer)),
            ] {
                let (out, cache) = (graph.find(&out).expect("out"), graph.find(&cache).expect("cache"));
                assert_eq!(plan.homes[out.0], Home::SameAs(cache), "{out:?} is its cache's storage");
                assert_eq!(plan.homes[cache.0], Home::Io);
            }
        }
        // The residual GEMV writes the layer's output (`x_1`), reading the previous residual (`x_0`).
        let Step::Gemv { mats, .. } = &plan.steps[3] else { panic!("{got:?}") };
        assert_eq!(graph.tensor(mats[0].y).name, "x_1");
        assert_eq!(mats[0].residual.map(|r| graph.tensor(r).name.clone()).as_deref(), Some("x_0"));
        // The QKV projection writes K and V into the caches itself, at the position, and Q nowhere else.
        let Step::Gemv { mats, cache_rows: Some(rows), .. } = &plan.steps[1] else { panic!("{got:?}") };
        let find = |name: &str| graph.find(name).expect("tensor");
        assert_eq!(
            mats.iter().map(|m| m.cache).collect::<Vec<_>>(),
            [None, Some(find(&model::k_cache(0))), Some(find(&model::v_cache(0)))]
        );
        assert_eq!(rows.position, find(model::INPUT_POS));
        assert_eq!((rows.heads, rows.len, rows.head_dim), (2, 16, 16));
        // The embedding writes `x_0` straight from both tables.
        let Step::Gather { out, plus: Some(plus), .. } = &plan.steps[0] else { panic!("{got:?}") };
        assert_eq!(graph.tensor(*out).name, "x_0");
        assert_eq!(graph.tensor(plus.table).name, "pos_emb");
        assert_eq!(graph.tensor(plus.position).name, model::INPUT_POS);
        // The product the residual GEMV replaced is never allocated or written.
        let o = graph.find("layer0.o").expect("o");
        assert!(plan
            .steps
            .iter()
            .all(|s| !matches!(s, Step::Gemv { mats, .. } if mats.iter().any(|m| m.y == o))));
    }

    /// Each layer's attention step, for a decode step (1 row) and a prefill (the prompt's rows): its query,
    /// the layer's updated caches and the position input, and its shape (rows, heads, cache length, head
    /// size, rows per block, threads per row) with the scratch it needs. The shape is the same at every
    /// position: the kernel reads the position from device memory and attends to rows `0..=position + t`
    /// for query row `t` (pinned on the GPU by `tests/gpu.rs`, `rows_past_the_position_are_never_read`).
    #[test]
    fn attention_steps_have_the_layers_shape_and_scratch() {
        // Every extent distinct (and the cache longer than one block of rows), so a swap or an off-by-one
        // in any of them shows.
        let cfg = Config { layers: 2, heads: 3, head_dim: 16, max_len: 300, ..Config::tiny() };
        let weights = Weights::generate(&cfg);
        for rows in [1, cfg.prompt.len()] {
            let graph = model::build_graph(&cfg, &weights, rows).expect("graph");
            let plan = Plan::new(&graph).expect("lowered");
            let find = |name: &str| graph.find(name).expect("tensor");
            let attention: Vec<_> =
                plan.steps.iter().filter(|s| matches!(s, Step::Attention { .. })).collect();
            assert_eq!(attention.len(), cfg.layers, "one attention step per layer");
            for (layer, step) in attention.into_iter().enumerate() {
                let Step::Attention { q, k, v, position, out, rows: r, heads, len, head_dim, chunk, tpr } =
                    *step
                else {
                    unreachable!()
                };
                assert_eq!(q, find(&format!("layer{layer}.q")));
                assert_eq!((k, v), (find(&model::k_cache_out(layer)), find(&model::v_cache_out(layer))));
                assert_eq!(position, find(model::INPUT_POS));
                assert_eq!(out, find(&format!("layer{layer}.attn")));
                assert_eq!(
                    (r, heads, len, head_dim, chunk, tpr),
                    (rows as u32, 3, 300, 16, ATTN_THREADS, 1),
                    "layer {layer}, {rows} rows"
                );
            }
            // Partial outputs and (max, sum) pairs per (row, head, block of 256 cache rows): 300 rows take 2.
            assert_eq!(plan.attn_scratch, (rows * 3 * 2 * 16, rows * 3 * 2 * 2), "{rows} rows");
        }
    }

    #[test]
    fn delegate_owned_state_is_refused_naming_the_cache() {
        let mut b = ref_graph::GraphBuilder::new();
        let pos = b.input("input_pos", ref_graph::ElemType::I64, &[1]).expect("fresh");
        let row = b.input("k", ref_graph::ElemType::F32, &[1, 2]).expect("fresh");
        let cache = b.state("k_cache", ref_graph::ElemType::F32, &[1, 4, 2]).expect("fresh");
        let k = b.kv_cache_update("k_cache_out", cache, row, pos).expect("typed");
        let q = b.input("q", ref_graph::ElemType::F32, &[1, 2]).expect("fresh");
        let attn = b.causal_attention("attn", q, k, k, pos).expect("typed");
        b.output(attn).expect("declared");
        let err = Plan::new(&b.finish().expect("valid")).expect_err("state is not held on the GPU yet");
        assert!(err.0.contains("'k_cache' is delegate-owned state"), "{}", err.0);
    }

    #[test]
    fn gemv_split_spreads_one_row_over_the_gpu_and_covers_k() {
        for (float, m, nmat, k, n) in [
            (Float::F16, 1, 3, 1024, 1024),
            (Float::F16, 1, 1, 1024, 1024),
            (Float::F16, 16, 3, 1024, 1024),
            (Float::F32, 1, 1, 32, 64),
            (Float::F32, 4, 3, 32, 32),
            (Float::F16, 1, 1, 8192, 50000),
            (Float::F32, 1, 1, 100_000, 8),
        ] {
            let (ksplit, rows) = gemv_split(float, m, nmat, k, n);
            assert!(ksplit >= 1 && rows >= 1);
            assert!(ksplit * rows >= k, "{k} rows covered");
            assert!((ksplit - 1) * rows < k, "no empty split for k = {k}");
            assert!(rows <= GEMV_MAX_ROWS, "shared memory bound");
            let tiles = n.div_ceil(32 * kernels::vec_width(float));
            assert!(rows >= GEMV_MIN_ROWS.min(k), "{k}x{n}: {rows} rows per split is too fine");
            if k >= 1024 {
                assert!(tiles * m * nmat * ksplit >= 64, "{k}x{n}: {} blocks", tiles * m * nmat * ksplit);
            }
        }
    }
}
