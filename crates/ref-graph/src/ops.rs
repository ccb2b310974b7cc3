//! The ops: what each computes, its operand roles, and its typing rule.

use serde::{Deserialize, Serialize};

use crate::{ElemType, Error, TensorDecl, TensorId};

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

/// One op. `T` names tensors: [`TensorId`] in a [`crate::Graph`], `String` in the payload's JSON.
///
/// Shapes below use `T` for the number of rows processed in one call (the prompt length for prefill, 1 for
/// decode), `H` heads, `L` cache length and `Dh` head size. `float` is `f32` or `f16`: every float operand of
/// one op has the same float type, and the op's float output takes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op<T> {
    /// `out[t, :] = table[indices[t], :]`. `table` `float [N, D]`, `indices` `i64 [T]`, `out` `float [T, D]`.
    /// An index outside `0..N` fails the call with `InvalidArgument`.
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
    /// `out = a b`. `a` `float [M, K]`, `b` `float [K, N]`, `out` `float [M, N]`.
    MatMul {
        /// Left operand.
        a: T,
        /// Right operand (typically a weight).
        b: T,
        /// The product.
        out: T,
    },
    /// `out = a + b`, elementwise, same shapes, `float`.
    Add {
        /// Left operand.
        a: T,
        /// Right operand.
        b: T,
        /// The sum.
        out: T,
    },
    /// Root-mean-square norm over the last axis: `out[m, :] = x[m, :] / sqrt(mean(x[m, :]^2) + eps) * weight`.
    /// `input` `float [M, D]`, `weight` `float [D]`, `out` `float [M, D]`.
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
    /// the same storage as `cache` (TensorRT's `IKVCacheUpdateLayer`). `cache` `float [H, L, Dh]`, `update`
    /// `float [T, H * Dh]`, `position` `i64 [1]`, `out` `float [H, L, Dh]`. A position with `position + T > L` or
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
    /// and attends to cache rows `0 ..= p` of its head with `softmax(q k^T / sqrt(Dh)) v`. `q`
    /// `float [T, H * Dh]`, `k`, `v` `float [H, L, Dh]` (outputs of a `KvCacheUpdate`), `position` `i64 [1]`,
    /// `out` `float [T, H * Dh]`.
    CausalAttention {
        /// Queries, heads side by side.
        q: T,
        /// Key cache.
        k: T,
        /// Value cache.
        v: T,
        /// Position of the first query.
        position: T,
        /// Attention output, heads side by side.
        out: T,
    },
    /// The index of the largest value of the **last** row: `out[0] = argmax_n input[M - 1, n]`. `input`
    /// `float [M, N]`, `out` `i64 [1]`. The next token of greedy decoding, computed where the logits are
    /// (payload version 1.1).
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
}

/// Every op name, as spelled in the payload.
pub(crate) const OP_NAMES: [&str; 8] =
    ["gather", "positions", "mat_mul", "add", "rms_norm", "kv_cache_update", "causal_attention", "argmax"];

impl<T: Copy> Op<T> {
    /// The op's name as spelled in the payload, e.g. `"mat_mul"`.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Gather { .. } => "gather",
            Op::Positions { .. } => "positions",
            Op::MatMul { .. } => "mat_mul",
            Op::Add { .. } => "add",
            Op::RmsNorm { .. } => "rms_norm",
            Op::KvCacheUpdate { .. } => "kv_cache_update",
            Op::CausalAttention { .. } => "causal_attention",
            Op::Argmax { .. } => "argmax",
        }
    }

    /// The tensor the op defines.
    pub fn output(&self) -> T {
        match *self {
            Op::Gather { out, .. }
            | Op::Positions { out, .. }
            | Op::MatMul { out, .. }
            | Op::Add { out, .. }
            | Op::RmsNorm { out, .. }
            | Op::KvCacheUpdate { out, .. }
            | Op::CausalAttention { out, .. }
            | Op::Argmax { out, .. } => out,
        }
    }

    /// The tensors the op reads, with their role names.
    pub fn named_operands(&self) -> Vec<(&'static str, T)> {
        match *self {
            Op::Gather { table, indices, .. } => vec![("table", table), ("indices", indices)],
            Op::Positions { position, .. } => vec![("position", position)],
            Op::MatMul { a, b, .. } | Op::Add { a, b, .. } => vec![("a", a), ("b", b)],
            Op::RmsNorm { input, weight, .. } => vec![("input", input), ("weight", weight)],
            Op::KvCacheUpdate { cache, update, position, .. } => {
                vec![("cache", cache), ("update", update), ("position", position)]
            }
            Op::CausalAttention { q, k, v, position, .. } => {
                vec![("q", q), ("k", k), ("v", v), ("position", position)]
            }
            Op::Argmax { input, .. } => vec![("input", input)],
        }
    }

    /// The tensors the op reads.
    pub fn operands(&self) -> Vec<T> {
        self.named_operands().into_iter().map(|(_, t)| t).collect()
    }

    /// The same op with every tensor reference mapped through `f` (given the role name; `"out"` for the
    /// output).
    pub fn try_map<U, E>(&self, mut f: impl FnMut(&'static str, T) -> Result<U, E>) -> Result<Op<U>, E> {
        Ok(match *self {
            Op::Gather { table, indices, out } => {
                Op::Gather { table: f("table", table)?, indices: f("indices", indices)?, out: f("out", out)? }
            }
            Op::Positions { position, count, out } => {
                Op::Positions { position: f("position", position)?, count, out: f("out", out)? }
            }
            Op::MatMul { a, b, out } => Op::MatMul { a: f("a", a)?, b: f("b", b)?, out: f("out", out)? },
            Op::Add { a, b, out } => Op::Add { a: f("a", a)?, b: f("b", b)?, out: f("out", out)? },
            Op::RmsNorm { input, weight, eps, out } => Op::RmsNorm {
                input: f("input", input)?,
                weight: f("weight", weight)?,
                eps,
                out: f("out", out)?,
            },
            Op::KvCacheUpdate { cache, update, position, out } => Op::KvCacheUpdate {
                cache: f("cache", cache)?,
                update: f("update", update)?,
                position: f("position", position)?,
                out: f("out", out)?,
            },
            Op::CausalAttention { q, k, v, position, out } => Op::CausalAttention {
                q: f("q", q)?,
                k: f("k", k)?,
                v: f("v", v)?,
                position: f("position", position)?,
                out: f("out", out)?,
            },
            Op::Argmax { input, out } => Op::Argmax { input: f("input", input)?, out: f("out", out)? },
        })
    }
}

impl Op<TensorId> {
    /// The element type and shape the op's output must have, given its operands' declarations; the
    /// message says which operand does not fit.
    pub(crate) fn infer(&self, tensors: &[TensorDecl]) -> Result<(ElemType, Vec<u64>), String> {
        let decl = |role: &'static str, id: TensorId, dtype: ElemType, rank: usize| {
            let t = &tensors[id.0];
            if t.dtype != dtype || t.shape.len() != rank {
                return Err(format!(
                    "operand '{role}' ('{}') is {} {:?}, expected {dtype} of rank {rank}",
                    t.name, t.dtype, t.shape
                ));
            }
            Ok(t.shape.as_slice())
        };
        let position = |id: TensorId| -> Result<(), String> {
            let s = decl("position", id, ElemType::I64, 1)?;
            if s != [1] {
                return Err(format!(
                    "operand 'position' ('{}') has shape {s:?}, expected [1]",
                    tensors[id.0].name
                ));
            }
            Ok(())
        };
        let mut floats = FloatOperands { tensors, first: None };
        match *self {
            Op::Gather { table, indices, .. } => {
                let table = floats.operand("table", table, 2)?;
                let indices = decl("indices", indices, ElemType::I64, 1)?;
                Ok((floats.dtype(), vec![indices[0], table[1]]))
            }
            Op::Positions { position: p, count, .. } => {
                position(p)?;
                if count == 0 {
                    return Err("attribute 'count' must be at least 1".to_owned());
                }
                Ok((ElemType::I64, vec![count]))
            }
            Op::MatMul { a, b, .. } => {
                let sa = floats.operand("a", a, 2)?;
                let sb = floats.operand("b", b, 2)?;
                if sa[1] != sb[0] {
                    return Err(format!(
                        "inner extents differ: '{}' is {sa:?} and '{}' is {sb:?}",
                        tensors[a.0].name, tensors[b.0].name
                    ));
                }
                Ok((floats.dtype(), vec![sa[0], sb[1]]))
            }
            Op::Add { a, b, .. } => {
                let sa = floats.operand("a", a, tensors[a.0].shape.len())?;
                let sb = floats.operand("b", b, tensors[b.0].shape.len())?;
                if sa != sb {
                    return Err(format!(
                        "shapes differ: '{}' is {sa:?} and '{}' is {sb:?}",
                        tensors[a.0].name, tensors[b.0].name
                    ));
                }
                Ok((floats.dtype(), sa.to_vec()))
            }
            Op::RmsNorm { input, weight, eps, .. } => {
                let si = floats.operand("input", input, 2)?;
                let sw = floats.operand("weight", weight, 1)?;
                if sw[0] != si[1] {
                    return Err(format!(
                        "weight '{}' has {} columns, input '{}' has {}",
                        tensors[weight.0].name, sw[0], tensors[input.0].name, si[1]
                    ));
                }
                if !(eps.is_finite() && eps > 0.0) {
                    return Err(format!("attribute 'eps' is {eps}, expected a finite positive number"));
                }
                Ok((floats.dtype(), si.to_vec()))
            }
            Op::KvCacheUpdate { cache, update, position: p, .. } => {
                let sc = floats.operand("cache", cache, 3)?;
                let su = floats.operand("update", update, 2)?;
                position(p)?;
                if su[1] != sc[0] * sc[2] || su[0] > sc[1] {
                    return Err(format!(
                        "update '{}' is {su:?}, but cache '{}' {sc:?} takes at most [{}, {}] rows",
                        tensors[update.0].name,
                        tensors[cache.0].name,
                        sc[1],
                        sc[0] * sc[2]
                    ));
                }
                Ok((floats.dtype(), sc.to_vec()))
            }
            Op::CausalAttention { q, k, v, position: p, .. } => {
                let sq = floats.operand("q", q, 2)?;
                let sk = floats.operand("k", k, 3)?;
                let sv = floats.operand("v", v, 3)?;
                position(p)?;
                if sk != sv {
                    return Err(format!(
                        "caches differ: '{}' is {sk:?} and '{}' is {sv:?}",
                        tensors[k.0].name, tensors[v.0].name
                    ));
                }
                if sq[1] != sk[0] * sk[2] || sq[0] > sk[1] {
                    return Err(format!(
                        "queries '{}' are {sq:?}, but caches {sk:?} take at most [{}, {}]",
                        tensors[q.0].name,
                        sk[1],
                        sk[0] * sk[2]
                    ));
                }
                Ok((floats.dtype(), sq.to_vec()))
            }
            Op::Argmax { input, .. } => {
                floats.operand("input", input, 2)?;
                Ok((ElemType::I64, vec![1]))
            }
        }
    }

    /// Checks the operands' types and that the declared output matches [`Op::infer`].
    pub(crate) fn check_types(&self, index: usize, tensors: &[TensorDecl]) -> Result<(), Error> {
        let mismatch = |detail: String| Error::OpMismatch { index, op: self.name(), detail };
        let (dtype, shape) = self.infer(tensors).map_err(mismatch)?;
        let out = &tensors[self.output().0];
        if out.dtype != dtype || out.shape != shape {
            return Err(mismatch(format!(
                "output '{}' is declared {} {:?}, but the op computes {dtype} {shape:?}",
                out.name, out.dtype, out.shape
            )));
        }
        Ok(())
    }
}

/// The float operands of one op: each must be `f32` or `f16` of its rank, and all of the same float type
/// (the first one's), which the op's float output takes.
struct FloatOperands<'a> {
    tensors: &'a [TensorDecl],
    first: Option<(&'static str, TensorId)>,
}

impl<'a> FloatOperands<'a> {
    fn operand(&mut self, role: &'static str, id: TensorId, rank: usize) -> Result<&'a [u64], String> {
        let t = &self.tensors[id.0];
        if !t.dtype.is_float() || t.shape.len() != rank {
            return Err(format!(
                "operand '{role}' ('{}') is {} {:?}, expected f32 or f16 of rank {rank}",
                t.name, t.dtype, t.shape
            ));
        }
        match self.first {
            None => self.first = Some((role, id)),
            Some((first_role, first)) => {
                let f = &self.tensors[first.0];
                if f.dtype != t.dtype {
                    return Err(format!(
                        "operand '{role}' ('{}') is {}, but operand '{first_role}' ('{}') is {}: the float \
                         operands of one op share one float type",
                        t.name, t.dtype, f.name, f.dtype
                    ));
                }
            }
        }
        Ok(&t.shape)
    }

    /// The float type of the operands seen (`f32` if none).
    fn dtype(&self) -> ElemType {
        self.first.map_or(ElemType::F32, |(_, id)| self.tensors[id.0].dtype)
    }
}
