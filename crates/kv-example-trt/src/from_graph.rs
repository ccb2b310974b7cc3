//! Any reference graph ([`ref_graph::Graph`], `f32`) as a TensorRT network: what the ExecuTorch exporter's
//! `TensorRTBackend` builds (`python/kv_delegate`, through the `trt_pack` example), so its engines come from the
//! same lowered graph as the reference delegate's payload.
//!
//! Op by op, as [`crate::decoder_network`] builds the example by hand:
//!
//! | reference-graph op | TensorRT layers |
//! |---|---|
//! | `gather` | gather on axis 0 |
//! | `positions` | `position + iota(count)` (an `i64` constant) |
//! | `mat_mul`, `add` | matrix multiply, elementwise sum |
//! | `rms_norm` | `x / sqrt(mean(x^2) + eps) * weight` (reduce, unary, elementwise) |
//! | `kv_cache_update` | the update as `[1, H, T, Dh]` into a real `IKVCacheUpdateLayer` (int32 write index) |
//! | `causal_attention` | `softmax(q k^T / sqrt(Dh) - 1e9 [j > position + t]) v`, heads as `[1, H, T, Dh]` |
//!
//! Every cache (the `cache` of a `kv_cache_update`) is a network input of shape `[1, H, L, Dh]` (TensorRT's
//! KV-cache layer wants a batch axis; the bytes are those of the graph's `[H, L, Dh]`), and its update's output
//! `[1, H, L, Dh]` aliases it. Delegate-owned `state` cannot be expressed (TensorRT keeps no state between
//! executions) and `f16` graphs and `argmax` are refused: each with [`Error::Network`] naming the tensor.

use std::collections::HashMap;

use blob_format::model::DType;
use ref_graph::{Data, ElemType, Graph, Op as RefOp, TensorId};
use trt_build::{BinaryOp, Error, NetworkDesc, Node, Op, Result, UnaryOp};

fn bad(node: &str, message: impl Into<String>) -> Error {
    Error::Network { node: node.to_owned(), message: message.into() }
}

fn dims(shape: &[u64]) -> Vec<i64> {
    shape.iter().map(|&d| i64::try_from(d).unwrap_or(i64::MAX)).collect()
}

struct Builder<'g> {
    graph: &'g Graph,
    nodes: Vec<Node>,
    /// One int32 write index per position tensor.
    write_index: HashMap<TensorId, String>,
}

impl Builder<'_> {
    fn add(&mut self, name: impl Into<String>, op: Op) -> String {
        let name = name.into();
        self.nodes.push(Node { name: name.clone(), op });
        name
    }

    fn name(&self, id: TensorId) -> String {
        self.graph.tensor(id).name.clone()
    }

    fn shape(&self, id: TensorId) -> Vec<i64> {
        dims(&self.graph.tensor(id).shape)
    }

    fn f32_const(&mut self, name: String, values: &[f32], shape: Vec<i64>) -> String {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.add(name, Op::Constant { dtype: DType::F32, shape, data })
    }

    fn ew(&mut self, name: String, a: &str, b: &str, op: BinaryOp) -> String {
        self.add(name, Op::ElementWise { a: a.to_owned(), b: b.to_owned(), op })
    }

    fn shuffle(
        &mut self,
        name: String,
        input: &str,
        first: Option<Vec<i32>>,
        reshape: Vec<i64>,
        second: Option<Vec<i32>>,
    ) -> String {
        self.add(
            name,
            Op::Shuffle {
                input: input.to_owned(),
                first_transpose: first,
                reshape: Some(reshape),
                second_transpose: second,
            },
        )
    }

    /// `[T, H * Dh]` as `[1, H, T, Dh]`.
    fn heads(&mut self, name: String, x: TensorId, heads: i64, head_dim: i64) -> String {
        let rows = self.shape(x)[0];
        let input = self.name(x);
        self.shuffle(name, &input, None, vec![1, rows, heads, head_dim], Some(vec![0, 2, 1, 3]))
    }

    fn write_index(&mut self, position: TensorId) -> String {
        if let Some(name) = self.write_index.get(&position) {
            return name.clone();
        }
        // TensorRT-RTX 1.7's KV-cache layer takes int32 write indices only.
        let name = format!("{}.i32", self.name(position));
        let input = self.name(position);
        let name = self.add(name, Op::Cast { input, to: DType::I32 });
        self.write_index.insert(position, name.clone());
        name
    }

    /// `causal_attention` as scores, the causal mask, softmax and the weighted values (token-major queries, one
    /// KV head per query head).
    fn attention(
        &mut self,
        out: String,
        [q, k, v, position]: [TensorId; 4],
        scale: Option<f32>,
    ) -> Result<()> {
        let cache = self.graph.tensor(k).shape.clone();
        if cache.len() != 3
            || self.shape(q).len() != 2
            || self.graph.tensor(q).shape[1] != cache[0] * cache[2]
        {
            return Err(bad(
                &out,
                "only token-major queries with one KV head per query head translate to TensorRT",
            ));
        }
        let (h, l, hd) = (dims(&cache)[0], dims(&cache)[1], dims(&cache)[2]);
        let rows = self.shape(q)[0];
        let qh = self.heads(format!("{out}.q"), q, h, hd);
        let (k, v) = (self.name(k), self.name(v));
        let raw = self.add(
            format!("{out}.scores_raw"),
            Op::MatMul { a: qh, transpose_a: false, b: k, transpose_b: true },
        );
        let scale = self.f32_const(
            format!("{out}.scale"),
            &[scale.unwrap_or(1.0 / (hd as f32).sqrt())],
            vec![1, 1, 1, 1],
        );
        let scaled = self.ew(format!("{out}.scores"), &raw, &scale, BinaryOp::Mul);
        // -1e9 where column j > position + t.
        let cols: Vec<f32> = (0..l).map(|j| j as f32).collect();
        let offsets: Vec<f32> = (0..rows).map(|t| t as f32).collect();
        let cols = self.f32_const(format!("{out}.mask.col"), &cols, vec![1, 1, 1, l]);
        let offsets = self.f32_const(format!("{out}.mask.row"), &offsets, vec![1, 1, rows, 1]);
        let pos = self.name(position);
        let pos_f = self.add(format!("{out}.mask.pos_f"), Op::Cast { input: pos, to: DType::F32 });
        let pos_4d = self.shuffle(format!("{out}.mask.pos"), &pos_f, None, vec![1, 1, 1, 1], None);
        let row_pos = self.ew(format!("{out}.mask.row_pos"), &offsets, &pos_4d, BinaryOp::Add);
        let future = self.ew(format!("{out}.mask.future"), &cols, &row_pos, BinaryOp::Greater);
        let future_f = self.add(format!("{out}.mask.future_f"), Op::Cast { input: future, to: DType::F32 });
        let neg = self.f32_const(format!("{out}.mask.neg"), &[-1.0e9], vec![1, 1, 1, 1]);
        let mask = self.ew(format!("{out}.mask"), &future_f, &neg, BinaryOp::Mul);
        let masked = self.ew(format!("{out}.scores_masked"), &scaled, &mask, BinaryOp::Add);
        let probs = self.add(format!("{out}.probs"), Op::Softmax { input: masked, axis: 3 });
        let attn = self.add(
            format!("{out}.heads"),
            Op::MatMul { a: probs, transpose_a: false, b: v, transpose_b: false },
        );
        self.shuffle(out, &attn, Some(vec![0, 2, 1, 3]), vec![rows, h * hd], None);
        Ok(())
    }

    fn op(&mut self, op: &RefOp<TensorId>) -> Result<()> {
        let out = self.name(op.output());
        match *op {
            RefOp::Gather { table, indices, .. } => {
                let (data, indices) = (self.name(table), self.name(indices));
                self.add(out, Op::Gather { data, indices, axis: 0 });
            }
            RefOp::Positions { position, count, .. } => {
                let iota: Vec<u8> = (0..count).flat_map(|t| (t as i64).to_le_bytes()).collect();
                let iota = self.add(
                    format!("{out}.iota"),
                    Op::Constant { dtype: DType::I64, shape: dims(&[count]), data: iota },
                );
                let position = self.name(position);
                self.ew(out, &position, &iota, BinaryOp::Add);
            }
            RefOp::MatMul { a, b, transpose_b, bias, .. } => {
                if bias.is_some() || self.shape(a).len() != 2 {
                    return Err(bad(
                        &out,
                        "mat_mul with a bias or batched rows has no TensorRT translation here",
                    ));
                }
                let (a, b) = (self.name(a), self.name(b));
                self.add(out, Op::MatMul { a, transpose_a: false, b, transpose_b });
            }
            RefOp::Add { a, b, .. } => {
                let (a, b) = (self.name(a), self.name(b));
                self.ew(out, &a, &b, BinaryOp::Add);
            }
            RefOp::RmsNorm { input, weight, eps, .. } => {
                let d = self.shape(input)[1];
                let x = self.name(input);
                let sq = self.ew(format!("{out}.sq"), &x, &x, BinaryOp::Mul);
                let ms = self.add(format!("{out}.ms"), Op::ReduceMean { input: sq, axis: 1 });
                let eps = self.f32_const(format!("{out}.eps"), &[eps], vec![1, 1]);
                let ms_eps = self.ew(format!("{out}.ms_eps"), &ms, &eps, BinaryOp::Add);
                let rms = self.add(format!("{out}.rms"), Op::Unary { input: ms_eps, op: UnaryOp::Sqrt });
                let xn = self.ew(format!("{out}.xn"), &x, &rms, BinaryOp::Div);
                let w = self.name(weight);
                let gain = self.shuffle(format!("{out}.gain"), &w, None, vec![1, d], None);
                self.ew(out, &xn, &gain, BinaryOp::Mul);
            }
            RefOp::KvCacheUpdate { cache, update, position, .. } => {
                let shape = self.shape(cache);
                if shape.len() != 3 || self.shape(update).len() != 2 {
                    return Err(bad(
                        &out,
                        "only [H, L, Dh] caches with token-major updates translate to TensorRT",
                    ));
                }
                let update = self.heads(format!("{out}.update"), update, shape[0], shape[2]);
                let write_indices = self.write_index(position);
                let cache = self.name(cache);
                self.add(out, Op::KvCacheUpdate { cache, update, write_indices });
            }
            RefOp::CausalAttention { softcap: Some(_), .. } => {
                return Err(bad(
                    &out,
                    "soft-capped causal_attention (softcap) has no TensorRT translation here",
                ));
            }
            RefOp::CausalAttention { q, k, v, position, scale, softcap: None, .. } => {
                self.attention(out, [q, k, v, position], scale)?
            }
            ref other => {
                return Err(bad(&out, format!("{} has no TensorRT translation here", other.name())));
            }
        }
        Ok(())
    }
}

/// The TensorRT network computing `graph` (see the module docs); its outputs are the graph's, in order.
///
/// # Errors
/// [`Error::Network`] for an `f16` tensor, delegate-owned state, or an `argmax`, naming the tensor.
pub fn network_from_graph(graph: &Graph) -> Result<NetworkDesc> {
    if let Some(&id) = graph.state().first() {
        return Err(bad(
            &graph.tensor(id).name,
            "is delegate-owned state; a TensorRT engine keeps no state between executions (export the caches \
             as program buffers)",
        ));
    }
    if let Some(t) = graph.tensors().iter().find(|t| t.dtype == ElemType::F16) {
        return Err(bad(&t.name, "is f16; this translation builds f32 networks"));
    }
    let caches: Vec<TensorId> = graph
        .ops()
        .iter()
        .filter_map(|op| if let RefOp::KvCacheUpdate { cache, .. } = op { Some(*cache) } else { None })
        .collect();
    let mut b = Builder { graph, nodes: Vec::new(), write_index: HashMap::new() };
    for &id in graph.inputs() {
        let t = graph.tensor(id);
        let mut shape = dims(&t.shape);
        if caches.contains(&id) {
            shape.insert(0, 1);
        }
        b.add(t.name.clone(), Op::Input { dtype: t.dtype.dtype(), shape });
    }
    for (id, data) in graph.constants() {
        let t = graph.tensor(id);
        let dtype = match data {
            Data::I64(_) => DType::I64,
            _ => DType::F32,
        };
        b.add(t.name.clone(), Op::Constant { dtype, shape: dims(&t.shape), data: data.to_le_bytes() });
    }
    for op in graph.ops() {
        b.op(op)?;
    }
    let outputs = graph.outputs().iter().map(|&id| b.name(id)).collect();
    Ok(NetworkDesc { nodes: b.nodes, outputs })
}
