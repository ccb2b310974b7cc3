//! The ops: what each computes, its operand roles, and its typing rule.

use serde::{Deserialize, Serialize};

use crate::ElemType;

/// The index of the largest value of `values`: the rule of [`Op::Argmax`], and the one greedy decoding uses
/// wherever it picks a token (the reference and CUDA delegates, host-runtime's generation loop, the
/// ExecuTorch bridge's runner, kv-example's checks).
///
/// Scanning left to right, a value becomes the best when it is greater than the best so far or the best so far
/// is NaN. So:
/// - the result is the **first** index of the largest value (ties go to the lower index; `-inf` is a value);
/// - a NaN never wins over a number, wherever it stands (a NaN first value is passed over);
/// - a row that is all NaN gives its **last** index, `len - 1`;
/// - an empty row gives 0.
///
/// ```
/// assert_eq!(ref_graph::argmax(&[0.5, 2.0, 2.0, -1.0]), 1);
/// assert_eq!(ref_graph::argmax(&[f32::NAN, 1.0, 0.5]), 1);
/// assert_eq!(ref_graph::argmax(&[f32::NAN, f32::NAN]), 1);
/// assert_eq!(ref_graph::argmax(&[]), 0);
/// ```
pub fn argmax(values: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] || values[best].is_nan() {
            best = i;
        }
    }
    best
}

/// One op. `T` names tensors: [`TensorId`](crate::TensorId) in a [`crate::Graph`], `String` in the payload's JSON.
///
/// Shapes below use `T` for the number of rows processed in one call (the prompt length for prefill, 1 for
/// decode), `H` heads, `L` cache length and `Dh` head size. `float` is `f32`, `f16` or `bf16` (`bf16`:
/// payload 1.3): every float operand of one op has the same float type, and the op's float output takes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op<T> {
    /// `out[i.., :] = table[indices[i..], :]`. `table` `float [N, D]`, `indices` `i64` of any rank (`[T]`, or
    /// `[1, T]` as Hugging Face passes `input_ids`), `out` `float [indices.., D]`. An index outside `0..N`
    /// fails the call with `InvalidArgument`.
    Gather {
        /// The rows.
        table: T,
        /// Row indices.
        indices: T,
        /// The gathered rows.
        out: T,
    },
    /// `out[t] = position[0] + t`. `position` `i64 [1]`, `out` `i64 [count]`.
    Positions {
        /// The first position.
        position: T,
        /// Number of positions.
        count: u64,
        /// The positions.
        out: T,
    },
    /// `out = a b (+ bias)`. `a` `float [.., M, K]` (rank at least 2; leading axes are more rows), `b`
    /// `float [K, N]`, or `[N, K]` with `transpose_b` (a `torch.nn.Linear` weight as the user stores it: row
    /// `n` holds output `n`'s inputs), optional `bias` `float [N]` added to every row; `out` `float [.., M, N]`.
    /// Payload 1.3 added `transpose_b` and `bias` (both absent means the 1.0 op).
    MatMul {
        /// Left operand.
        a: T,
        /// Right operand (typically a weight).
        b: T,
        /// Whether `b` is stored `[N, K]`.
        #[serde(default, skip_serializing_if = "is_false")]
        transpose_b: bool,
        /// Added to every output row.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        bias: Option<T>,
        /// The product.
        out: T,
    },
    /// `out = a + b`, elementwise with broadcasting (NumPy's rule: shapes aligned at the last axis, an extent
    /// of 1 or a missing axis stretches, [`broadcast_shape`](crate::broadcast_shape)). Both operands `float`
    /// or both `i64` (index arithmetic); the output takes their type. Before payload 1.3 the shapes had to be
    /// equal and the type `float`.
    Add {
        /// Left operand.
        a: T,
        /// Right operand.
        b: T,
        /// The sum.
        out: T,
    },
    /// `out = a - b`, elementwise with broadcasting as [`Op::Add`], `float` or `i64`. Payload 1.3.
    Sub {
        /// Left operand.
        a: T,
        /// Right operand.
        b: T,
        /// The difference.
        out: T,
    },
    /// `out = a * b`, elementwise with broadcasting as [`Op::Add`], `float` or `i64`. Payload 1.3.
    Mul {
        /// Left operand.
        a: T,
        /// Right operand.
        b: T,
        /// The product.
        out: T,
    },
    /// `out = a / b`, elementwise with broadcasting as [`Op::Add`], `float` only (IEEE division: `x / 0` is
    /// infinite or NaN).
    /// Payload 1.3.
    Div {
        /// Left operand.
        a: T,
        /// Right operand.
        b: T,
        /// The quotient.
        out: T,
    },
    /// `out = func(input)`, elementwise, `float`, same shape. Payload 1.3.
    Unary {
        /// The function.
        func: UnaryFn,
        /// The values.
        input: T,
        /// The results.
        out: T,
    },
    /// The mean over the last axis, kept as an axis of 1: `out[.., 0] = mean(input[.., :])`. `input`
    /// `float [.., D]`, `out` `float [.., 1]`. Payload 1.3.
    Mean {
        /// The values.
        input: T,
        /// The means.
        out: T,
    },
    /// `input` converted to `dtype` (float to float rounds to nearest even; `i64` to float rounds to nearest;
    /// float to `i64` truncates toward zero, NaN and out-of-range values saturate). Same shape. Payload 1.3.
    Cast {
        /// The values.
        input: T,
        /// The element type of `out`.
        dtype: ElemType,
        /// The converted values.
        out: T,
    },
    /// The same elements in the same (row-major) order, seen as `shape`: any element type, equal element
    /// counts. An executor may give `out` the storage of `input`. Payload 1.3.
    Reshape {
        /// The values.
        input: T,
        /// The shape of `out`.
        shape: Vec<u64>,
        /// The reshaped tensor.
        out: T,
    },
    /// Axes reordered: `out`'s axis `i` is `input`'s axis `dims[i]` (`dims` a permutation of `0..rank`), any
    /// element type. Payload 1.3.
    Permute {
        /// The values.
        input: T,
        /// The permutation.
        dims: Vec<u64>,
        /// The permuted tensor.
        out: T,
    },
    /// `out = input[.., start..end, ..]` along `axis` (step 1, `start < end <= extent`), any element type.
    /// Payload 1.3.
    Slice {
        /// The values.
        input: T,
        /// The axis cut.
        axis: u64,
        /// First index kept.
        start: u64,
        /// One past the last index kept.
        end: u64,
        /// The slice.
        out: T,
    },
    /// `a` and `b` joined along `axis` (every other extent equal, one element type). Payload 1.3.
    Concat {
        /// First part.
        a: T,
        /// Second part.
        b: T,
        /// The axis joined along.
        axis: u64,
        /// The joined tensor.
        out: T,
    },
    /// Root-mean-square norm over the last axis: `out[m, :] = x[m, :] / sqrt(mean(x[m, :]^2) + eps) * weight`.
    /// `input` `float [.., D]` (rank at least 1; rank 2 before payload 1.3), `weight` `float [D]`, `out` the
    /// input's shape.
    RmsNorm {
        /// The rows to normalise.
        input: T,
        /// Per-column gain.
        weight: T,
        /// Added to the mean square; finite and positive.
        eps: f32,
        /// The normalised rows.
        out: T,
    },
    /// Writes `update` into rows `position[0] .. position[0] + T` of every head of `cache`, **in place**:
    /// `cache[h, position + t, :] = update[t, h * Dh .. (h + 1) * Dh]`. `out` is the updated cache and is
    /// the same storage as `cache` (TensorRT's `IKVCacheUpdateLayer`). `cache` `float [H, L, Dh]` (or
    /// `[1, H, L, Dh]`, Hugging Face's StaticCache layout, payload 1.3), `update` token-major `float [T, H * Dh]`
    /// or head-major `float [H, T, Dh]` / `[1, H, T, Dh]` (`cache[h, position + t, :] = update[h, t, :]`,
    /// payload 1.3), `position` `i64 [1]`, `out` the cache's shape. A position with `position + T > L` or
    /// `position < 0` fails the call with `InvalidArgument`.
    KvCacheUpdate {
        /// The cache to update (a graph input: caller-owned storage).
        cache: T,
        /// The new rows, heads side by side.
        update: T,
        /// The first row to write.
        position: T,
        /// The updated cache (aliases `cache`).
        out: T,
    },
    /// Causal multi-head attention of `T` queries over a cache: query `t` sits at position `p = position + t`
    /// and attends to cache rows `0 ..= p` of its KV head with `softmax(q k^T * scale) v`. `q` token-major
    /// `float [T, Hq * Dh]` or head-major `[Hq, T, Dh]` / `[1, Hq, T, Dh]` (payload 1.3), `k`, `v`
    /// `float [Hkv, L, Dh]` or `[1, Hkv, L, Dh]` (outputs of a `KvCacheUpdate`), `position` `i64 [1]`, `out`
    /// the shape of `q`. Grouped-query attention (payload 1.3): `Hq` is a multiple of `Hkv` and query head `h`
    /// reads KV head `h / (Hq / Hkv)`; the repeated keys and values are never materialised. With `softcap`
    /// `c` (payload 1.4, Gemma 2's `attn_logit_softcapping`) each scaled score `s` becomes `c * tanh(s / c)`
    /// before the softmax.
    CausalAttention {
        /// Queries.
        q: T,
        /// Key cache.
        k: T,
        /// Value cache.
        v: T,
        /// Position of the first query.
        position: T,
        /// The score scale; absent means `1 / sqrt(Dh)` (payload 1.3 added it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        scale: Option<f32>,
        /// Logit soft-capping: each scaled score `s` becomes `softcap * tanh(s / softcap)`; absent means no
        /// cap (payload 1.4 added it). Finite and positive.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        softcap: Option<f32>,
        /// Attention output, in the layout of `q`.
        out: T,
    },
    /// The index of the largest value of the **last** row: `out[0] = argmax_n input[.., M - 1, n]`. `input`
    /// `float [.., M, N]` (rank at least 2; exactly 2 before payload 1.3), `out` `i64 [1]`. The next token of
    /// greedy decoding, computed where the logits are (payload version 1.1).
    ///
    /// The rule is [`argmax`](crate::argmax)'s, the one every executor and host uses: the first index of
    /// the largest non-NaN value (ties go to the lower index, `-inf` counts as a value), and only a row that
    /// is all NaN gives its last index, `N - 1`.
    Argmax {
        /// The rows (e.g. logits, one row per position).
        input: T,
        /// The index, as an `i64`.
        out: T,
    },
    /// `target = value`, **in place**: writes every element of `value` into `target`'s storage, and `out` is
    /// that same storage (reported as an alias of `target` exactly as a [`Op::KvCacheUpdate`] output is).
    /// `target` and `value` have one element type (any) and one shape; `out` takes them. A program's mutable
    /// buffer that is overwritten each call (Hugging Face StaticCache's `cumulative_length`, set to
    /// `cache_position[0] + T`) is written this way instead of being copied back after the call. Rules: `target`
    /// is a graph input that no other op reads and that no other op writes in place; `out` is read by no op
    /// (it may be a graph output). Payload 1.3.
    Assign {
        /// The storage written (a graph input: caller-owned storage).
        target: T,
        /// The values written.
        value: T,
        /// The written storage (aliases `target`).
        out: T,
    },
}

/// Every op name, as spelled in the payload.
pub(crate) const OP_NAMES: [&str; 19] = [
    "gather",
    "positions",
    "mat_mul",
    "add",
    "sub",
    "mul",
    "div",
    "unary",
    "mean",
    "cast",
    "reshape",
    "permute",
    "slice",
    "concat",
    "rms_norm",
    "kv_cache_update",
    "causal_attention",
    "argmax",
    "assign",
];

/// The function of an [`Op::Unary`], as spelled in the payload (`"func": "rsqrt"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnaryFn {
    /// `-x`.
    Neg,
    /// `1 / sqrt(x)`.
    Rsqrt,
    /// `sqrt(x)`.
    Sqrt,
    /// `x * x`.
    Square,
    /// `1 / x`.
    Reciprocal,
    /// `e^x`.
    Exp,
    /// `cos(x)` (radians).
    Cos,
    /// `sin(x)` (radians).
    Sin,
    /// `tanh(x)`.
    Tanh,
    /// `1 / (1 + e^-x)`.
    Sigmoid,
    /// `x * sigmoid(x)` (SiLU, the gate of SwiGLU).
    Silu,
    /// `x * Phi(x)` with the exact normal CDF, `0.5 x (1 + erf(x / sqrt 2))` (`torch.nn.GELU()`).
    Gelu,
    /// The tanh approximation `0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))` (`approximate="tanh"`).
    GeluTanh,
}

impl UnaryFn {
    /// The function applied to one value, computed in `f32` (the definition every executor matches).
    pub fn apply(self, x: f32) -> f32 {
        match self {
            UnaryFn::Neg => -x,
            UnaryFn::Rsqrt => 1.0 / x.sqrt(),
            UnaryFn::Sqrt => x.sqrt(),
            UnaryFn::Square => x * x,
            UnaryFn::Reciprocal => 1.0 / x,
            UnaryFn::Exp => x.exp(),
            UnaryFn::Cos => x.cos(),
            UnaryFn::Sin => x.sin(),
            UnaryFn::Tanh => x.tanh(),
            UnaryFn::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            UnaryFn::Silu => x / (1.0 + (-x).exp()),
            UnaryFn::Gelu => 0.5 * x * (1.0 + libm::erff(x / std::f32::consts::SQRT_2)),
            UnaryFn::GeluTanh => {
                let c = (2.0 / std::f32::consts::PI).sqrt();
                0.5 * x * (1.0 + (c * (x + 0.044_715 * x * x * x)).tanh())
            }
        }
    }
}

fn is_false(value: &bool) -> bool {
    !*value
}

impl<T: Copy> Op<T> {
    /// The op's name as spelled in the payload, e.g. `"mat_mul"`.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Gather { .. } => "gather",
            Op::Positions { .. } => "positions",
            Op::MatMul { .. } => "mat_mul",
            Op::Add { .. } => "add",
            Op::Sub { .. } => "sub",
            Op::Mul { .. } => "mul",
            Op::Div { .. } => "div",
            Op::Unary { .. } => "unary",
            Op::Mean { .. } => "mean",
            Op::Cast { .. } => "cast",
            Op::Reshape { .. } => "reshape",
            Op::Permute { .. } => "permute",
            Op::Slice { .. } => "slice",
            Op::Concat { .. } => "concat",
            Op::RmsNorm { .. } => "rms_norm",
            Op::KvCacheUpdate { .. } => "kv_cache_update",
            Op::CausalAttention { .. } => "causal_attention",
            Op::Argmax { .. } => "argmax",
            Op::Assign { .. } => "assign",
        }
    }

    /// The tensor the op defines.
    pub fn output(&self) -> T {
        *self.output_ref()
    }

    /// The tensors the op reads, with their role names.
    pub fn named_operands(&self) -> Vec<(&'static str, T)> {
        match *self {
            Op::Gather { table, indices, .. } => vec![("table", table), ("indices", indices)],
            Op::Positions { position, .. } => vec![("position", position)],
            Op::MatMul { a, b, bias, .. } => {
                let mut operands = vec![("a", a), ("b", b)];
                operands.extend(bias.map(|bias| ("bias", bias)));
                operands
            }
            Op::Add { a, b, .. }
            | Op::Sub { a, b, .. }
            | Op::Mul { a, b, .. }
            | Op::Div { a, b, .. }
            | Op::Concat { a, b, .. } => vec![("a", a), ("b", b)],
            Op::Unary { input, .. }
            | Op::Mean { input, .. }
            | Op::Cast { input, .. }
            | Op::Reshape { input, .. }
            | Op::Permute { input, .. }
            | Op::Slice { input, .. } => vec![("input", input)],
            Op::RmsNorm { input, weight, .. } => vec![("input", input), ("weight", weight)],
            Op::KvCacheUpdate { cache, update, position, .. } => {
                vec![("cache", cache), ("update", update), ("position", position)]
            }
            Op::CausalAttention { q, k, v, position, .. } => {
                vec![("q", q), ("k", k), ("v", v), ("position", position)]
            }
            Op::Argmax { input, .. } => vec![("input", input)],
            Op::Assign { target, value, .. } => vec![("target", target), ("value", value)],
        }
    }

    /// The tensors the op reads.
    pub fn operands(&self) -> Vec<T> {
        self.named_operands().into_iter().map(|(_, t)| t).collect()
    }
}

impl<T> Op<T> {
    /// The same op with every tensor reference mapped through `f` (given the role name; `"out"` for the
    /// output).
    pub fn try_map<U, E>(&self, mut f: impl FnMut(&'static str, &T) -> Result<U, E>) -> Result<Op<U>, E> {
        let (a, b) = match self {
            Op::Add { a, b, .. }
            | Op::Sub { a, b, .. }
            | Op::Mul { a, b, .. }
            | Op::Div { a, b, .. }
            | Op::Concat { a, b, .. } => (f("a", a)?, f("b", b)?),
            other => return other.try_map_other(f),
        };
        let out = f("out", self.output_ref())?;
        Ok(match self {
            Op::Add { .. } => Op::Add { a, b, out },
            Op::Sub { .. } => Op::Sub { a, b, out },
            Op::Mul { .. } => Op::Mul { a, b, out },
            Op::Div { .. } => Op::Div { a, b, out },
            Op::Concat { axis, .. } => Op::Concat { a, b, axis: *axis, out },
            _ => unreachable!("matched above"),
        })
    }

    /// The tensor the op defines, by reference.
    fn output_ref(&self) -> &T {
        match self {
            Op::Gather { out, .. }
            | Op::Positions { out, .. }
            | Op::MatMul { out, .. }
            | Op::Add { out, .. }
            | Op::Sub { out, .. }
            | Op::Mul { out, .. }
            | Op::Div { out, .. }
            | Op::Unary { out, .. }
            | Op::Mean { out, .. }
            | Op::Cast { out, .. }
            | Op::Reshape { out, .. }
            | Op::Permute { out, .. }
            | Op::Slice { out, .. }
            | Op::Concat { out, .. }
            | Op::RmsNorm { out, .. }
            | Op::KvCacheUpdate { out, .. }
            | Op::CausalAttention { out, .. }
            | Op::Argmax { out, .. }
            | Op::Assign { out, .. } => out,
        }
    }

    /// [`Op::try_map`] of every op whose operands are not `a` and `b`.
    fn try_map_other<U, E>(&self, mut f: impl FnMut(&'static str, &T) -> Result<U, E>) -> Result<Op<U>, E> {
        let out = |f: &mut dyn FnMut(&'static str, &T) -> Result<U, E>| f("out", self.output_ref());
        Ok(match self {
            Op::Gather { table, indices, .. } => {
                Op::Gather { table: f("table", table)?, indices: f("indices", indices)?, out: out(&mut f)? }
            }
            Op::Positions { position, count, .. } => {
                Op::Positions { position: f("position", position)?, count: *count, out: out(&mut f)? }
            }
            Op::MatMul { a, b, transpose_b, bias, .. } => Op::MatMul {
                a: f("a", a)?,
                b: f("b", b)?,
                transpose_b: *transpose_b,
                bias: bias.as_ref().map(|bias| f("bias", bias)).transpose()?,
                out: out(&mut f)?,
            },
            Op::Unary { func, input, .. } => {
                Op::Unary { func: *func, input: f("input", input)?, out: out(&mut f)? }
            }
            Op::Mean { input, .. } => Op::Mean { input: f("input", input)?, out: out(&mut f)? },
            Op::Cast { input, dtype, .. } => {
                Op::Cast { input: f("input", input)?, dtype: *dtype, out: out(&mut f)? }
            }
            Op::Reshape { input, shape, .. } => {
                Op::Reshape { input: f("input", input)?, shape: shape.clone(), out: out(&mut f)? }
            }
            Op::Permute { input, dims, .. } => {
                Op::Permute { input: f("input", input)?, dims: dims.clone(), out: out(&mut f)? }
            }
            Op::Slice { input, axis, start, end, .. } => Op::Slice {
                input: f("input", input)?,
                axis: *axis,
                start: *start,
                end: *end,
                out: out(&mut f)?,
            },
            Op::RmsNorm { input, weight, eps, .. } => Op::RmsNorm {
                input: f("input", input)?,
                weight: f("weight", weight)?,
                eps: *eps,
                out: out(&mut f)?,
            },
            Op::KvCacheUpdate { cache, update, position, .. } => Op::KvCacheUpdate {
                cache: f("cache", cache)?,
                update: f("update", update)?,
                position: f("position", position)?,
                out: out(&mut f)?,
            },
            Op::CausalAttention { q, k, v, position, scale, softcap, .. } => Op::CausalAttention {
                q: f("q", q)?,
                k: f("k", k)?,
                v: f("v", v)?,
                position: f("position", position)?,
                scale: *scale,
                softcap: *softcap,
                out: out(&mut f)?,
            },
            Op::Argmax { input, .. } => Op::Argmax { input: f("input", input)?, out: out(&mut f)? },
            Op::Assign { target, value, .. } => {
                Op::Assign { target: f("target", target)?, value: f("value", value)?, out: out(&mut f)? }
            }
            Op::Add { .. } | Op::Sub { .. } | Op::Mul { .. } | Op::Div { .. } | Op::Concat { .. } => {
                unreachable!("Op::try_map maps the ops of operands a and b")
            }
        })
    }
}
