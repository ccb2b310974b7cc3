//! The example decoder of `kv-example` as a TensorRT network with real `IKVCacheUpdateLayer`s, matmuls and
//! softmax, node for node the model of `kv_example::model::build_graph` (the reference delegate's graph):
//!
//! ```text
//! x = tok_emb[tokens] + pos_emb[input_pos + t]                                   [rows, D]
//! per layer l:  h = rms_norm(x) * norm_l;  q, k, v = h Wq, h Wk, h Wv  -> [1, H, rows, hd]
//!               k_cache_out_l = k_cache_l with k written at input_pos, in place (IKVCacheUpdateLayer)
//!               v_cache_out_l = v_cache_l with v written at input_pos, in place (IKVCacheUpdateLayer)
//!               s = q k_cache_out_l^T / sqrt(hd) - 1e9 * [j > input_pos + t]      (causal)
//!               x = x + (softmax(s) v_cache_out_l -> [rows, D]) Wo
//! logits = (rms_norm(x) * final_norm) Wout                                          [rows, vocab]
//! ```
//!
//! Engine I/O: inputs `tokens` (i64 `[rows]`), `input_pos` (i64 `[1]`), `k_cache_{l}`, `v_cache_{l}` (f32
//! `[1, heads, max_len, head_dim]`: TensorRT's KV-cache layer wants a batch axis; the bytes are those of
//! kv-example's `[heads, max_len, head_dim]` buffers); outputs `logits`, `k_cache_out_{l}`, `v_cache_out_{l}`.
//! The network is built from kv-example's own [`Config`] and [`Weights`].

use blob_format::model::DType;
use kv_example::model::RMS_EPS;
use kv_example::{Config, Weights};
use trt_build::{BinaryOp, BuildOptions, BuiltEngine, Error, NetworkDesc, Node, Op, Result, UnaryOp};

/// The cache names are kv-example's (one definition, so both examples' blobs bind the same tensors).
pub use kv_example::model::{k_cache, k_cache_out, v_cache, v_cache_out};

/// The blob's delegate-argument order (kv-example's): `tokens`, `input_pos`, every layer's k and v cache,
/// every layer's k and v cache output, then `logits` (buffer mutations before user outputs, as ExecuTorch
/// may order them; TensorRT lists `logits` first, and binding is by name).
pub fn arg_order(cfg: &Config) -> Vec<String> {
    let mut order = vec!["tokens".to_owned(), "input_pos".to_owned()];
    for l in 0..cfg.layers {
        order.extend([k_cache(l), v_cache(l)]);
    }
    for l in 0..cfg.layers {
        order.extend([k_cache_out(l), v_cache_out(l)]);
    }
    order.push("logits".to_owned());
    order
}

/// kv-example's argument order for a call of `rows` tokens (its blob's bindings), less its `next_token`
/// output, which this network does not compute (the host takes the argmax of the logits): what a blob built
/// here must bind, in this order, for kv-example's manifest `args` to apply unchanged.
pub fn reference_order(cfg: &Config, rows: usize) -> Vec<String> {
    kv_example::export::header(cfg, rows)
        .bindings
        .into_iter()
        .map(|b| b.name)
        .filter(|n| n != kv_example::model::NEXT_TOKEN)
        .collect()
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn dim(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

struct Graph {
    nodes: Vec<Node>,
}

impl Graph {
    fn add(&mut self, name: impl Into<String>, op: Op) -> String {
        let name = name.into();
        self.nodes.push(Node { name: name.clone(), op });
        name
    }

    fn f32_const(&mut self, name: impl Into<String>, values: &[f32], shape: Vec<i64>) -> String {
        self.add(name, Op::Constant { dtype: DType::F32, shape, data: f32_bytes(values) })
    }

    fn ew(&mut self, name: impl Into<String>, a: &str, b: &str, op: BinaryOp) -> String {
        self.add(name, Op::ElementWise { a: a.into(), b: b.into(), op })
    }

    fn mm(&mut self, name: impl Into<String>, a: &str, b: &str, transpose_b: bool) -> String {
        self.add(name, Op::MatMul { a: a.into(), transpose_a: false, b: b.into(), transpose_b })
    }

    /// Embeddings: token rows plus position rows `input_pos + t`.
    fn embeddings(&mut self, weights: &Weights, dims: &Dims, tokens: &str, pos: &str) -> String {
        let tok_emb = self.f32_const("tok_emb", &weights.tok_emb, vec![dims.v, dims.d]);
        let pos_emb = self.f32_const("pos_emb", &weights.pos_emb, vec![dims.l, dims.d]);
        let x_tok = self.add("x_tok", Op::Gather { data: tok_emb, indices: tokens.into(), axis: 0 });
        let iota: Vec<u8> = (0..dims.rows as i64).flat_map(|t| t.to_le_bytes()).collect();
        let iota = self.add("row_index", Op::Constant { dtype: DType::I64, shape: vec![dims.r], data: iota });
        let positions = self.ew("positions", pos, &iota, BinaryOp::Add);
        let x_pos = self.add("x_pos", Op::Gather { data: pos_emb, indices: positions, axis: 0 });
        self.ew("x_0", &x_tok, &x_pos, BinaryOp::Add)
    }

    /// The causal mask, shared by every layer: -1e9 where column j > input_pos + t.
    fn causal_mask(&mut self, dims: &Dims, pos: &str) -> String {
        let cols: Vec<f32> = (0..dims.max_len).map(|j| j as f32).collect();
        let row_f: Vec<f32> = (0..dims.rows).map(|t| t as f32).collect();
        let col_index = self.f32_const("mask.col", &cols, vec![1, 1, 1, dims.l]);
        let row_offset = self.f32_const("mask.row", &row_f, vec![1, 1, dims.r, 1]);
        let pos_f = self.add("mask.pos_f", Op::Cast { input: pos.into(), to: DType::F32 });
        let pos_4d = self.reshape("mask.pos", pos_f, vec![1, 1, 1, 1]);
        let row_pos = self.ew("mask.row_pos", &row_offset, &pos_4d, BinaryOp::Add);
        let future = self.ew("mask.future", &col_index, &row_pos, BinaryOp::Greater);
        let future_f = self.add("mask.future_f", Op::Cast { input: future, to: DType::F32 });
        let neg_big = self.f32_const("mask.neg", &[-1.0e9], vec![1, 1, 1, 1]);
        self.ew("mask", &future_f, &neg_big, BinaryOp::Mul)
    }

    /// `input` reshaped to `dims`, no transposes.
    fn reshape(&mut self, name: &str, input: String, dims: Vec<i64>) -> String {
        let op = Op::Shuffle { input, first_transpose: None, reshape: Some(dims), second_transpose: None };
        self.add(name, op)
    }

    /// One decoder layer over `x`: attention through the layer's caches, updated in place, plus the residual.
    fn decoder_layer(
        &mut self,
        layer: usize,
        lw: &kv_example::LayerWeights,
        (k_in, v_in): &(String, String),
        shared: &Shared,
        dims: &Dims,
        x: &str,
    ) -> String {
        let p = format!("layer{layer}");
        let hn = self.rms_norm(&format!("{p}.h"), x, &lw.norm, dims.d);
        let q = self.heads(&p, "q", &hn, &lw.wq, dims);
        let k = self.heads(&p, "k", &hn, &lw.wk, dims);
        let vv = self.heads(&p, "v", &hn, &lw.wv, dims);
        let write_indices = shared.write_idx.clone();
        let k_update =
            Op::KvCacheUpdate { cache: k_in.clone(), update: k, write_indices: write_indices.clone() };
        let k_out = self.add(k_cache_out(layer), k_update);
        let v_out = self
            .add(v_cache_out(layer), Op::KvCacheUpdate { cache: v_in.clone(), update: vv, write_indices });
        let raw = self.mm(format!("{p}.scores_raw"), &q, &k_out, true);
        let scaled = self.ew(format!("{p}.scores"), &raw, &shared.inv_sqrt_hd, BinaryOp::Mul);
        let masked = self.ew(format!("{p}.scores_masked"), &scaled, &shared.mask, BinaryOp::Add);
        let probs = self.add(format!("{p}.probs"), Op::Softmax { input: masked, axis: 3 });
        let attn_h = self.mm(format!("{p}.attn_heads"), &probs, &v_out, false);
        let attn = self.add(
            format!("{p}.attn"),
            Op::Shuffle {
                input: attn_h,
                first_transpose: Some(vec![0, 2, 1, 3]),
                reshape: Some(vec![dims.r, dims.d]),
                second_transpose: None,
            },
        );
        let wo = self.f32_const(format!("{p}.wo"), &lw.wo, vec![dims.d, dims.d]);
        let o = self.mm(format!("{p}.o"), &attn, &wo, false);
        self.ew(format!("x_{}", layer + 1), x, &o, BinaryOp::Add)
    }

    /// `hn W` split into heads: `[rows, D]` -> `[1, H, rows, hd]`.
    fn heads(&mut self, p: &str, name: &str, hn: &str, w: &[f32], dims: &Dims) -> String {
        let wn = self.f32_const(format!("{p}.{name}.w"), w, vec![dims.d, dims.d]);
        let flat = self.mm(format!("{p}.{name}.flat"), hn, &wn, false);
        self.add(
            format!("{p}.{name}"),
            Op::Shuffle {
                input: flat,
                first_transpose: None,
                reshape: Some(vec![1, dims.r, dims.h, dims.hd]),
                second_transpose: Some(vec![0, 2, 1, 3]),
            },
        )
    }

    /// `x * gain / sqrt(mean(x^2) + eps)` over the last axis of `[rows, D]`.
    fn rms_norm(&mut self, prefix: &str, x: &str, gain: &[f32], d: i64) -> String {
        let sq = self.ew(format!("{prefix}.sq"), x, x, BinaryOp::Mul);
        let ms = self.add(format!("{prefix}.ms"), Op::ReduceMean { input: sq, axis: 1 });
        let eps = self.f32_const(format!("{prefix}.eps"), &[RMS_EPS], vec![1, 1]);
        let ms_eps = self.ew(format!("{prefix}.ms_eps"), &ms, &eps, BinaryOp::Add);
        let rms = self.add(format!("{prefix}.rms"), Op::Unary { input: ms_eps, op: UnaryOp::Sqrt });
        let xn = self.ew(format!("{prefix}.xn"), x, &rms, BinaryOp::Div);
        let g = self.f32_const(format!("{prefix}.gain"), gain, vec![1, d]);
        self.ew(prefix, &xn, &g, BinaryOp::Mul)
    }
}

/// The decoder network over `rows` tokens per call (the prompt length for prefill, 1 for decode).
///
/// # Errors
/// [`Error::Network`] when the config is degenerate, `rows` is outside `1..=max_len`, or a weight has the
/// wrong length.
pub fn decoder_network(cfg: &Config, weights: &Weights, rows: usize) -> Result<NetworkDesc> {
    check_config(cfg, rows)?;
    check_weights(cfg, weights)?;
    let dims = Dims::new(cfg, rows);
    let mut g = Graph { nodes: Vec::new() };
    let tokens = g.add("tokens", Op::Input { dtype: DType::I64, shape: vec![dims.r] });
    let pos = g.add("input_pos", Op::Input { dtype: DType::I64, shape: vec![1] });
    let cache_shape = vec![1, dims.h, dims.l, dims.hd];
    let caches: Vec<(String, String)> = (0..cfg.layers)
        .map(|layer| {
            let k = g.add(k_cache(layer), Op::Input { dtype: DType::F32, shape: cache_shape.clone() });
            (k, g.add(v_cache(layer), Op::Input { dtype: DType::F32, shape: cache_shape.clone() }))
        })
        .collect();
    let mut x = g.embeddings(weights, &dims, &tokens, &pos);
    let shared = Shared {
        mask: g.causal_mask(&dims, &pos),
        // TensorRT-RTX 1.7's KV-cache layer takes int32 write indices only ("Write indices must be of type
        // int32").
        write_idx: g.add("write_indices", Op::Cast { input: pos.clone(), to: DType::I32 }),
        inv_sqrt_hd: g.f32_const("inv_sqrt_hd", &[1.0 / (cfg.head_dim as f32).sqrt()], vec![1, 1, 1, 1]),
    };
    for (layer, (lw, cache)) in weights.layers.iter().zip(&caches).enumerate() {
        x = g.decoder_layer(layer, lw, cache, &shared, &dims, &x);
    }
    let hf = g.rms_norm("h_final", &x, &weights.final_norm, dims.d);
    let w_out = g.f32_const("w_out", &weights.w_out, vec![dims.d, dims.v]);
    g.mm("logits", &hf, &w_out, false);
    let mut outputs = vec!["logits".to_owned()];
    for layer in 0..cfg.layers {
        outputs.extend([k_cache_out(layer), v_cache_out(layer)]);
    }
    Ok(NetworkDesc { nodes: g.nodes, outputs })
}

fn bad(node: &str, message: String) -> Error {
    Error::Network { node: node.to_owned(), message }
}

/// Every size at least 1, and `rows` within `1..=max_len`.
fn check_config(cfg: &Config, rows: usize) -> Result<()> {
    if cfg.vocab == 0 || cfg.heads == 0 || cfg.head_dim == 0 || cfg.max_len == 0 || cfg.layers == 0 {
        return Err(bad(
            "config",
            format!(
                "every size must be at least 1: vocab {}, heads {}, head_dim {}, max_len {}, layers {}",
                cfg.vocab, cfg.heads, cfg.head_dim, cfg.max_len, cfg.layers
            ),
        ));
    }
    if rows == 0 || rows > cfg.max_len {
        return Err(bad("tokens", format!("rows {rows} outside 1..={}", cfg.max_len)));
    }
    Ok(())
}

/// Every weight has the length the config needs; the first that does not is named.
fn check_weights(cfg: &Config, weights: &Weights) -> Result<()> {
    let (dm, vocab) = (cfg.dim(), cfg.vocab);
    let mut expect = vec![
        ("tok_emb", weights.tok_emb.len(), vocab * dm),
        ("pos_emb", weights.pos_emb.len(), cfg.max_len * dm),
        ("final_norm", weights.final_norm.len(), dm),
        ("w_out", weights.w_out.len(), dm * vocab),
        ("layers", weights.layers.len(), cfg.layers),
    ];
    for lw in &weights.layers {
        expect.extend([
            ("layer.norm", lw.norm.len(), dm),
            ("layer.wq", lw.wq.len(), dm * dm),
            ("layer.wk", lw.wk.len(), dm * dm),
            ("layer.wv", lw.wv.len(), dm * dm),
            ("layer.wo", lw.wo.len(), dm * dm),
        ]);
    }
    if let Some((name, got, want)) = expect.into_iter().find(|(_, got, want)| got != want) {
        return Err(bad(name, format!("has {got} values, the config needs {want}")));
    }
    Ok(())
}

/// The network's extents as TensorRT dimensions: vocab, model width, heads, head width, cache length, rows.
struct Dims {
    v: i64,
    d: i64,
    h: i64,
    hd: i64,
    l: i64,
    r: i64,
    /// `rows` as a count.
    rows: usize,
    /// `max_len` as a count.
    max_len: usize,
}

impl Dims {
    fn new(cfg: &Config, rows: usize) -> Self {
        Dims {
            v: dim(cfg.vocab),
            d: dim(cfg.dim()),
            h: dim(cfg.heads),
            hd: dim(cfg.head_dim),
            l: dim(cfg.max_len),
            r: dim(rows),
            rows,
            max_len: cfg.max_len,
        }
    }
}

/// The tensors every layer shares.
struct Shared {
    /// The causal mask `[1, 1, rows, max_len]`.
    mask: String,
    /// `input_pos` as int32, where the caches are written.
    write_idx: String,
    /// `1 / sqrt(head_dim)`.
    inv_sqrt_hd: String,
}

/// Builds the decoder for `rows` tokens per call with TensorRT-RTX and wraps the plan in a native blob
/// (backend `TensorRTBackend`, payload `tensorrt-plan`, arguments in [`arg_order`], the alias table as
/// TensorRT reported it, the library version recorded). Returns the header, the blob and the built engine.
///
/// # Errors
/// As [`decoder_network`] and [`trt_build::build_engine`].
pub fn decoder_blob(
    cfg: &Config,
    weights: &Weights,
    rows: usize,
    options: &BuildOptions,
) -> Result<(blob_format::model::Header, Vec<u8>, BuiltEngine)> {
    let built = trt_build::build_engine(&decoder_network(cfg, weights, rows)?, options)?;
    let order = arg_order(cfg);
    let order: Vec<&str> = order.iter().map(String::as_str).collect();
    let (header, blob) = trt_build::export::native_blob(&built, &order)?;
    Ok((header, blob, built))
}
