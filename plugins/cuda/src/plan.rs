//! Lowering a reference graph to kernel launches, once at `init`: element types, where every tensor lives,
//! and the launch sequence. Pure: no CUDA here, so it is tested on any machine.
//!
//! The graph is first put in its canonical form ([`canon`]): views are names of a value, not ops; what
//! depends on the position alone (RoPE's tables, a StaticCache's counters) runs once, before the first
//! layer; sibling products are adjacent. So an export lowers to the same launches whatever order and
//! views its exporter wrote (transformers' Llama-family exports reach the five launches a layer of the
//! hand-built graph). Exported decompositions are read as the op they spell: `x * sigmoid(x)` and
//! `cast(silu(cast(x, f32)), T)` are a SiLU (then fused into the gate/up GEMV), and an `Assign` of a value
//! nothing else reads computes that value into its target (no copy).
//!
//! Then two paths, tried in this order for every op:
//! - the fast path ([`fast`]), the fusions a one-row decode step wants, each only where it cannot change a
//!   result:
//!   - every `MatMul` is a GEMV whose warps each own one output column and read its contiguous weight row:
//!     `[N, K]` weights (`transpose_b`) as stored, `[K, N]` constant weights transposed once at upload
//!     ([`Plan::transposed`]);
//!   - up to three consecutive `MatMul`s reading the same activation with weights of one inner extent become
//!     one launch (the Q, K and V projections; gate and up), each with its own width and bias; a product
//!     that only slices of its columns read is one matrix per slice, each reading its weight rows
//!     ([`WeightRows`]: GPT-2's Q, K and V cut from one product; a product cut into more than a launch
//!     takes computes alone, its siblings next); a constant bias added after a bias-less product is its
//!     bias;
//!   - a `MatMul` whose output only feeds the next op, an `Add` of equal shapes with it, becomes a GEMV with a
//!     residual (the attention output projection and the residual stream), and with a second one when the
//!     sum only feeds such an `Add` too (a parallel residual's `x + attn + mlp`);
//!   - an `RmsNorm` whose output only the next GEMV reads is done inside that GEMV (one that only a residual
//!     add of its shape reads adds the residual itself: Gemma 2's post-norms), and so is LayerNorm,
//!     which an export spells `rms_norm(x - mean(x))`, optionally plus a constant bias ([`Norm`]), or in a
//!     half model in f32 between casts ([`layer_norm`]), and an RMS norm spelled in f32 ops, between casts
//!     in a half model (Gemma 2's, [`rms_norm`]); a norm only products of several GEMVs read (a parallel
//!     block's attention and MLP) is done inside each;
//!   - a GELU (erf or tanh form; the tanh form also as the nine ops GPT-2 and Phi spell, [`gelu`]) of a
//!     lone product only it reads is that GEMV's epilogue (the up projection of a non-gated MLP), and a
//!     gated GELU (`gelu(gate) * up`, Gemma's MLP) the gate and up GEMV's, as SwiGLU is; so is a lone
//!     product's soft-capping, `tanh(y / c) * c` (Gemma 2's final logits, [`Softcap`]);
//!   - consecutive `KvCacheUpdate`s at the same position with updates of one shape become one launch (K and
//!     V), and token-major updates a GEMV computes are written into the caches by it (when no launch
//!     between touches the caches);
//!   - every `KvCacheUpdate` writes the caller's cache in place and every `CausalAttention` reads the caches
//!     where they are, head-major or token-major, grouped-query attention included (each query head reads
//!     its KV head's rows; repeated keys and values are never materialised), in one launch that merges its
//!     ranges of the cache itself;
//! - Hugging Face's rotate-half RoPE (seven ops) is one launch ([`rope`]), or none in a decode step: the
//!   Q/K/V GEMV that computes its input applies it before it stores (warps paired across the half), and then
//!   also writes the rotated keys and the values into the caches; so is a partial rotary (the RoPE of a
//!   slice of each head concatenated with the rest, [`RopeTables::head`]);
//! - the general path ([`general`]): one launch per op for everything else (broadcasting elementwise ops,
//!   unary functions, means, casts, permutes, slices and concats as strided copies); a `Reshape` launches
//!   nothing: its output is its input's storage; an `Assign` is one copy of its value into the caller's
//!   buffer it targets (device to device, in the call's stream).
//!
//! On a GPU that has it, every typed launch after the first of a call overlaps the one before it
//! (programmatic dependent launch): it requests its weights, and an attention the cache rows before the
//! position, while the previous kernel finishes (see `kernels/common.cuh`).
//!
//! Float tensors may be `f32`, `f16` or `bf16`, one type per op (a graph may cast between them, as Hugging
//! Face's RMSNorm does in f32 inside a bf16 model); every kernel computes in f32. Typed kernels are compiled
//! once per float type the plan uses ([`Plan::floats`]).
#![forbid(unsafe_code)]

mod canon;
#[cfg(test)]
mod emulate;
mod fast;
mod gelu;
mod general;
mod layer_norm;
mod rms_norm;
mod rope;
#[cfg(test)]
mod tests;

use ref_graph::{ElemType, Graph, TensorId, UnaryFn};

/// A floating-point storage type of the typed kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Float {
    /// `f32` storage.
    F32,
    /// IEEE half storage, `f32` arithmetic.
    F16,
    /// bfloat16 storage, `f32` arithmetic.
    Bf16,
}

impl Float {
    /// The storage type of `dtype`, `None` for `i64`.
    pub fn of(dtype: ElemType) -> Option<Float> {
        match dtype {
            ElemType::F32 => Some(Float::F32),
            ElemType::F16 => Some(Float::F16),
            ElemType::Bf16 => Some(Float::Bf16),
            ElemType::I64 => None,
        }
    }
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
    /// The same storage as another tensor, never itself `SameAs`: a `KvCacheUpdate` output is its cache, an
    /// `Assign` output its target, a `Reshape` output its input; a product a GEMV adds a residual to, and
    /// the intermediates a RoPE absorbs, name the output they became (never written: nothing is allocated);
    /// so do a product a GEMV stores rotated, and its views.
    SameAs(TensorId),
}

impl Home {
    /// The tensor whose storage `id` is, in `homes` (every tensor's): itself unless it is `SameAs` another.
    pub fn root(homes: &[Home], id: TensorId) -> TensorId {
        match homes[id.0] {
            Home::SameAs(root) => root,
            _ => id,
        }
    }
}

/// An elementwise binary op of the general path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinOp {
    Add = 0,
    Sub = 1,
    Mul = 2,
    Div = 3,
}

/// How a general-path kernel walks its elements: every index of `dims` (row-major), with the element
/// strides of two operands along each axis (0 where an operand is broadcast). For a binary op: the strides
/// of `a` and `b` (the output is contiguous); for a copy: of the source and the destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Walk {
    pub dims: Vec<u64>,
    pub a: Vec<u64>,
    pub b: Vec<u64>,
}

/// One launch (or none, for an alias), in graph terms; [`crate::engine`] resolves tensors to addresses per
/// call.
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
        /// A one-value constant of the table's type each row is multiplied by (Gemma's `embed_scale`), the
        /// product rounded as the separate op rounds; never with `plus`.
        scale: Option<TensorId>,
    },
    Positions {
        position: TensorId,
        out: TensorId,
        count: u32,
    },
    /// Scalar i64 sums `out = src + add` in one launch (at most [`crate::kernels::general::COUNTERS_MAX`]):
    /// a StaticCache's counters, each the position plus a constant.
    Counters {
        sums: Vec<CounterSum>,
    },
    /// RoPE's tables of a step in one launch (the positions, their f32 angles by the inverse frequencies, the
    /// angles concatenated with themselves, cos, sin and the casts to the model's type, fused): for row
    /// `t < rows` and column `j < 2 * half`, `cos`/`sin` of `(position + t) * inv_freq[j % half]` in f32,
    /// stored in `dtype`.
    RopeTables {
        position: TensorId,
        inv_freq: TensorId,
        cos: TensorId,
        sin: TensorId,
        rows: u32,
        half: u32,
        dtype: ElemType,
    },
    Add {
        a: TensorId,
        b: TensorId,
        out: TensorId,
        n: u64,
    },
    /// `rows` rows of `dim` values normalised over the last axis (see [`Norm`]), then `residual` added when
    /// there is one (Gemma 2's post-norms, `x + norm(y)`: the norm rounded to its type first, as the separate
    /// ops round).
    Norm {
        input: TensorId,
        out: TensorId,
        rows: u32,
        dim: u32,
        norm: Norm,
        residual: Option<TensorId>,
    },
    /// `y[mat] = a . w[mat]` for each matrix (see [`GemvMat`]), `a` normalised first with `norm`.
    Gemv {
        a: TensorId,
        norm: Option<Norm>,
        mats: Vec<GemvMat>,
        cache_rows: Option<CacheRows>,
        m: u32,
        k: u32,
        /// Whether the kernel may read its weights, norm gains and biases before the previous kernel
        /// finishes: each is a constant or an input no op writes.
        early: bool,
        /// Hugging Face's SwiGLU: `mats` are the gate and up projections, of one width and without
        /// residuals or caches, and the GEMV writes `silu(gate) * up` into this tensor instead of either
        /// (each pair of warps computes one column of both), rounded as the separate ops round.
        glu: Option<TensorId>,
        /// The tables of the matrices whose outputs are rotated ([`GemvMat::roped`]).
        rope: Option<RopeTables>,
        /// An MLP's GELU (`Gelu` or `GeluTanh`) of the one product, without residual or cache, applied
        /// before it stores: `y = gelu(product)`, the product rounded to its type first, as the separate ops
        /// round. With `glu`: the gate's activation instead of SiLU, a gated GELU (`gelu(gate) * up`, Gemma's
        /// MLP).
        activation: Option<UnaryFn>,
        /// Final-logit soft-capping of the one product, after everything else (Gemma 2's logits).
        softcap: Option<Softcap>,
    },
    KvUpdate {
        caches: Vec<(TensorId, TensorId)>,
        position: TensorId,
        layout: KvLayout,
    },
    Attention {
        q: TensorId,
        k: TensorId,
        v: TensorId,
        position: TensorId,
        out: TensorId,
        shape: AttnShape,
        /// Ranges the valid rows are cut into (on the device, from the position): blocks per query head.
        splits: u32,
        /// Whether the kernel may read the cache rows before the position before the previous kernel
        /// finishes: the caches are `KvCacheUpdate` outputs at this position, and no step writes the
        /// position.
        early: bool,
    },
    Argmax {
        input: TensorId,
        out: TensorId,
        m: u32,
        n: u32,
    },
    Binary {
        op: BinOp,
        a: TensorId,
        b: TensorId,
        out: TensorId,
        dtype: ElemType,
        walk: Walk,
    },
    Unary {
        func: UnaryFn,
        input: TensorId,
        out: TensorId,
        n: u64,
        dtype: ElemType,
    },
    /// A gated unit over a GEMM-path step's two products in one launch: `out = func(gate) * up` over `n`
    /// values, `func(gate)` rounded to `dtype` before the product, as a separate op would store it (SwiGLU,
    /// Gemma's gated GELU).
    Glu {
        func: UnaryFn,
        gate: TensorId,
        up: TensorId,
        out: TensorId,
        n: u64,
        dtype: ElemType,
    },
    Mean {
        input: TensorId,
        out: TensorId,
        rows: u32,
        dim: u32,
        dtype: ElemType,
    },
    Cast {
        input: TensorId,
        out: TensorId,
        n: u64,
        from: ElemType,
        to: ElemType,
    },
    /// Rotate-half RoPE in one launch: `out = x * cos + rotate_half(x) * sin` over `x`'s last axis of
    /// `2 * half` elements, `cos` and `sin` broadcast to `x` (`walk.a`, `walk.b` their strides), each product
    /// and the sum rounded to `dtype` as the separate ops round them.
    Rope {
        x: TensorId,
        cos: TensorId,
        sin: TensorId,
        out: TensorId,
        dtype: ElemType,
        half: u32,
        walk: Walk,
    },
    /// A strided copy of `elem`-byte elements (`walk.a` the source's strides, `walk.b` the destination's).
    Copy {
        src: TensorId,
        dst: TensorId,
        elem: u32,
        walk: Walk,
        src_off: u64,
        dst_off: u64,
    },
}

impl Step {
    /// The tensor whose float type picks the step's typed module; `None` for an untyped (general) kernel.
    pub fn typed_by(&self) -> Option<TensorId> {
        match *self {
            Step::Gather { table, .. } => Some(table),
            Step::Add { out, .. } | Step::Norm { out, .. } => Some(out),
            Step::Gemv { a, .. } => Some(a),
            Step::KvUpdate { ref caches, .. } => Some(caches[0].0),
            Step::Attention { q, .. } => Some(q),
            Step::Argmax { input, .. } => Some(input),
            Step::Positions { .. }
            | Step::Counters { .. }
            | Step::RopeTables { .. }
            | Step::Binary { .. }
            | Step::Unary { .. }
            | Step::Glu { .. }
            | Step::Mean { .. }
            | Step::Cast { .. }
            | Step::Rope { .. }
            | Step::Copy { .. } => None,
        }
    }
}

/// A normalisation of a row over its last axis, in f32: RMS norm, `x / sqrt(mean(x^2) + eps) * gain`, or
/// LayerNorm when `centred` (`x` less the row's mean first, as an export spells it: `rms_norm(x - mean(x))`),
/// then `bias` added (LayerNorm's, broadcast along the row) when there is one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Norm {
    pub gain: TensorId,
    pub eps: f32,
    pub centred: bool,
    pub bias: Option<TensorId>,
}

/// Soft-capping as an export spells it, `tanh(y / divisor) * factor` (Gemma 2's final logits: both its cap),
/// each a one-value constant of `y`'s type and each op's result rounded to it, as the separate ops round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Softcap {
    pub divisor: TensorId,
    pub factor: TensorId,
}

/// One sum of a [`Step::Counters`]: `out[0] = src[0] + add`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CounterSum {
    pub src: TensorId,
    pub add: i64,
    pub out: TensorId,
}

/// A second table a fused embedding adds: row `position[0] + r` of `table` to output row `r`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PositionRows {
    pub table: TensorId,
    pub position: TensorId,
    pub n: u32,
}

/// One matrix of a fused GEMV: `y[m, n] = a[m, :] . w[n, :] (+ bias[n]) (+ residual[m, n]) (+ residual2[m, n])`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemvMat {
    /// The weight: `[N, K]` as the graph stores it, or a `[K, N]` constant read through its transposed
    /// upload (`transposed`).
    pub w: TensorId,
    pub transposed: bool,
    /// Output columns.
    pub n: u32,
    pub y: TensorId,
    pub bias: Option<TensorId>,
    pub residual: Option<TensorId>,
    /// A second sum after the residual's (a parallel residual's `x + attn + mlp`), only with `residual`.
    pub residual2: Option<TensorId>,
    /// A KV cache whose row at the step's position also receives `y` (the cache update, fused).
    pub cache: Option<TensorId>,
    /// Whether `y` is stored rotated by Hugging Face's rotate-half RoPE with the step's [`RopeTables`]: one
    /// row (`m == 1`) whose heads are `2 * half` wide.
    pub roped: bool,
    /// The weight rows (and bias elements) the output columns read: all of them, or a slice's.
    pub rows: WeightRows,
}

/// Which rows of its weight (`[N, K]` as read) a matrix's output columns read, and which bias elements:
/// column `c` reads row `offset + (c / group) * stride + c % group`. A product whose only readers are slices
/// of its columns (GPT-2's Q, K and V of one `c_attn` product; a head-interleaved `query_key_value`) is
/// computed as one matrix per slice, each straight into the slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WeightRows {
    pub offset: u32,
    pub group: u32,
    pub stride: u32,
}

impl WeightRows {
    /// Every row, in order, of a weight of `n` rows.
    pub fn all(n: u32) -> WeightRows {
        WeightRows { offset: 0, group: n, stride: n }
    }

    /// The weight row output column `c` reads.
    pub fn of(&self, c: u32) -> u32 {
        self.offset + (c / self.group.max(1)) * self.stride + c % self.group.max(1)
    }
}

/// A fused RoPE's tables: `cos` and `sin`, `2 * half` values each (one decode row), of the GEMV's type, and
/// the rotated products' head width: `2 * half`, or more for a partial rotary (each head rotated in its first
/// `2 * half` columns, the rest stored as computed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RopeTables {
    pub cos: TensorId,
    pub sin: TensorId,
    pub half: u32,
    pub head: u32,
}

/// Where a GEMV's fused cache updates write: the position tensor and the caches' `[heads, len, head_dim]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheRows {
    pub position: TensorId,
    pub heads: u32,
    pub len: u32,
    pub head_dim: u32,
}

/// A cache update's extents: `rows` new rows into caches of `[heads, len, head_dim]` (a leading 1 dropped),
/// from token-major (`[rows, heads * head_dim]`) or head-major (`[heads, rows, head_dim]`) updates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayout {
    pub rows: u32,
    pub heads: u32,
    pub len: u32,
    pub head_dim: u32,
    pub head_major: bool,
}

impl KvLayout {
    /// The update's element strides per new row `t` and per head `h`.
    pub fn update_strides(&self) -> (u32, u32) {
        let (rows, heads, dh) = (self.rows, self.heads, self.head_dim);
        if self.head_major {
            (dh, rows * dh)
        } else {
            (heads * dh, dh)
        }
    }
}

/// An attention's extents: `rows` queries of `heads` query heads over caches of `kv_heads` heads of
/// `[len, head_dim]`, q (and out) head-major or token-major, and the score scale.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnShape {
    pub rows: u32,
    pub heads: u32,
    pub kv_heads: u32,
    pub len: u32,
    pub head_dim: u32,
    pub head_major: bool,
    pub scale: f32,
    /// Logit soft-capping (`causal_attention`'s `softcap`): each scaled score `s` becomes `c * tanh(s / c)`.
    pub softcap: Option<f32>,
}

impl AttnShape {
    /// The element strides of `q` (and `out`) per query row `t` and per query head `h`.
    pub fn q_strides(&self) -> (u32, u32) {
        let (rows, heads, dh) = (self.rows, self.heads, self.head_dim);
        if self.head_major {
            (dh, rows * dh)
        } else {
            (heads * dh, dh)
        }
    }

    /// Query heads per KV head: query head `h` reads KV head `h / group`.
    pub fn group(&self) -> u32 {
        self.heads / self.kv_heads
    }
}

/// The lowered graph.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The float types the typed steps use, each once, in order: one compiled module each.
    pub floats: Vec<Float>,
    /// Every tensor's element type, by [`TensorId`] index: the graph's, but for a constant the kernels read
    /// in another type (a half model's f32 norm gain, read in the model's type): uploaded converted at `init`.
    pub dtypes: Vec<ElemType>,
    /// Where each tensor lives, by [`TensorId`] index.
    pub homes: Vec<Home>,
    /// The launches, in order.
    pub steps: Vec<Step>,
    /// `[K, N]` constant weights the GEMVs read transposed (`[N, K]`), each uploaded so once at `init`, with
    /// whether anything reads the constant as it is too (else only the transposed copy is uploaded).
    pub transposed: Vec<(TensorId, bool)>,
    /// Largest attention scratch any step needs: (partial outputs and their maxima and sums, in f32
    /// elements; merge counters).
    pub attn_scratch: AttnScratch,
}

/// The scratch of the largest attention: partial outputs, maxima and sums (f32 elements), merge tickets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AttnScratch {
    pub partials: usize,
    pub maxima: usize,
    pub counters: usize,
}

fn u32_of(value: u64, what: &str) -> Result<u32, Unsupported> {
    u32::try_from(value)
        .ok()
        .filter(|&v| v < i32::MAX as u32)
        .ok_or_else(|| Unsupported(format!("{what} {value} exceeds the kernels' 32-bit extents")))
}

/// Attention blocks a launch aims for: about five per SM of a large GPU, as many as are resident at once.
/// Measured on the H200 (config (c), CUDA graph; the kernel cuts the prefix into ranges of whole loop
/// iterations): aiming for 512 blocks gave 745 / 770 µs per step at positions 4096 / 8191, 1024 blocks 663 /
/// 911 (one iteration each, but two waves at 8191), 256 blocks 822 / 906.
const ATTN_TARGET_BLOCKS: u32 = 640;
/// Fewest cache rows a range should hold (one tile of a block: 4 rows a group).
const ATTN_MIN_ROWS: u32 = 32;

/// Ranges per query head for `rows` queries of `heads` heads over a cache of `len` rows: enough blocks to
/// fill the GPU at a long position, none finer than [`ATTN_MIN_ROWS`] rows at the longest. The kernel cuts
/// the valid prefix into at most this many ranges, each a whole number of its loop iterations.
fn attention_splits(heads: u32, rows: u32, len: u32) -> u32 {
    (ATTN_TARGET_BLOCKS / (heads * rows).max(1)).clamp(1, len.div_ceil(ATTN_MIN_ROWS).max(1))
}

impl Plan {
    /// Lowers `graph`: each op through the fast path when it matches one, else through the general path.
    pub fn new(graph: &Graph) -> Result<Plan, Unsupported> {
        if let Some(&id) = graph.state().first() {
            return Err(Unsupported(format!(
                "cache '{}' is delegate-owned state (reference-graph payload 1.2), which the CUDA delegate does \
                 not hold yet; export the caches as program buffers",
                graph.tensor(id).name
            )));
        }
        let mut lowering = fast::Lowering::new(graph);
        let mut p = 0;
        while p < lowering.scheduled() {
            p += lowering.op(p)?;
        }
        Ok(lowering.finish())
    }

    /// The float type of a typed step (`None` for a general-path step).
    pub fn step_float(&self, step: &Step) -> Option<Float> {
        step.typed_by().and_then(|id| Float::of(self.dtypes[id.0]))
    }
}
