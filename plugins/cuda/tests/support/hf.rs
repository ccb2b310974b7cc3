//! A Hugging Face Llama/Qwen2-style decoder in the forms the Python lowering writes (payload 1.3): `[1, T]`
//! token ids, rank-3 activations `[1, T, D]`, RMSNorm decomposed in f32 (cast, square, mean, add eps, rsqrt,
//! mul, cast back, weight), `nn.Linear` products (`transpose_b`, Qwen2's q/k/v biases), rotate-half RoPE with
//! cos/sin from `inv_freq` x positions (slice, neg, concat, mul, add), head-major `[1, H, L, Dh]` caches
//! updated in place, grouped-query attention with an explicit scale, a SwiGLU MLP, the final norm, lm_head and
//! the greedy token. Shared by the plan's unit tests (`src/plan/tests.rs`, through `#[path]`) and the GPU
//! tests (`tests/gpu.rs`). Weights are deterministic (SplitMix64), stored in the model's float type.

#![allow(dead_code)]

use ref_graph::{half, AttentionOptions, ElemType, Graph, GraphBuilder, MatMulOptions, TensorId, UnaryFn};

/// The decoder's sizes.
#[derive(Debug, Clone)]
pub struct Hf {
    pub dtype: ElemType,
    pub layers: usize,
    pub dim: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub ffn: u64,
    pub vocab: u64,
    pub max_len: u64,
    /// Q, K and V projections with biases (Qwen2), or without (Llama).
    pub bias: bool,
    /// The logits read the embedding table (`tie_word_embeddings`).
    pub tied: bool,
    /// RMSNorms as `rms_norm` ops (what the Python lowering fuses them into), or decomposed as Hugging Face
    /// writes them.
    pub norm_op: bool,
    /// Gemma 2's logit soft-capping in every attention (`causal_attention`'s `softcap`), or none.
    pub softcap: Option<f32>,
}

impl Hf {
    /// Two layers, 4 query heads over 2 KV heads of 16, 96 tokens, 40 positions.
    pub fn tiny(dtype: ElemType) -> Hf {
        Hf {
            dtype,
            layers: 2,
            dim: 64,
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            ffn: 128,
            vocab: 96,
            max_len: 40,
            bias: true,
            tied: false,
            norm_op: false,
            softcap: None,
        }
    }

    /// Llama-3.2-1B's shape: 16 layers, hidden 2048, 32 query and 8 KV heads of 64, SwiGLU 8192, vocabulary
    /// 128 256, tied embeddings, no biases, bf16, norms as `rms_norm` ops; `max_len` cache rows.
    pub fn llama_1b(max_len: u64) -> Hf {
        Hf {
            dtype: ElemType::Bf16,
            layers: 16,
            dim: 2048,
            heads: 32,
            kv_heads: 8,
            head_dim: 64,
            ffn: 8192,
            vocab: 128_256,
            max_len,
            bias: false,
            tied: true,
            norm_op: true,
            softcap: None,
        }
    }

    /// Qwen2.5-0.5B's shape: 24 layers, hidden 896, 14 query and 2 KV heads of 64, SwiGLU 4864, vocabulary
    /// 151 936, tied embeddings, Q/K/V biases, bf16, norms as `rms_norm` ops; `max_len` cache rows.
    pub fn qwen_0_5b(max_len: u64) -> Hf {
        Hf {
            layers: 24,
            dim: 896,
            heads: 14,
            kv_heads: 2,
            ffn: 4864,
            vocab: 151_936,
            bias: true,
            ..Hf::llama_1b(max_len)
        }
    }

    /// Issue 45's 26.2 M-parameter Llama: 8 layers, hidden 512, 8 query and 2 KV heads of 64, SwiGLU 1536,
    /// vocabulary 4096, tied embeddings, no biases, bf16, norms as `rms_norm` ops; `max_len` cache rows.
    pub fn tiny_26m(max_len: u64) -> Hf {
        Hf { layers: 8, dim: 512, heads: 8, kv_heads: 2, ffn: 1536, vocab: 4096, ..Hf::llama_1b(max_len) }
    }

    /// `[1, kv_heads, max_len, head_dim]`.
    pub fn cache_shape(&self) -> [u64; 4] {
        [1, self.kv_heads, self.max_len, self.head_dim]
    }
}

pub const IDS: &str = "input_ids";
pub const POS: &str = "cache_position";
pub const LOGITS: &str = "logits";
pub const NEXT: &str = "next_token";

pub fn k_cache(layer: usize) -> String {
    format!("k_cache_{layer}")
}
pub fn v_cache(layer: usize) -> String {
    format!("v_cache_{layer}")
}

/// Deterministic values in `[-scale, scale)`.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

/// The builder and what every layer shares.
struct Build<'a> {
    b: GraphBuilder,
    cfg: &'a Hf,
    rng: Rng,
    rows: u64,
    pos: TensorId,
    cos: TensorId,
    sin: TensorId,
    eps: TensorId,
}

impl Build<'_> {
    fn weight(&mut self, name: &str, shape: &[u64], scale: f32) -> TensorId {
        let n: u64 = shape.iter().product();
        let values: Vec<f32> = (0..n).map(|_| self.rng.next() * scale).collect();
        self.constant(name, shape, values)
    }

    fn constant(&mut self, name: &str, shape: &[u64], values: Vec<f32>) -> TensorId {
        match self.cfg.dtype {
            ElemType::F16 => {
                self.b.constant_f16(name, shape, values.into_iter().map(half::f16::from_f32).collect())
            }
            ElemType::Bf16 => {
                self.b.constant_bf16(name, shape, values.into_iter().map(half::bf16::from_f32).collect())
            }
            _ => self.b.constant_f32(name, shape, values),
        }
        .expect("fresh constant")
    }

    /// `nn.Linear(k, n)`: `x w^T (+ bias)`.
    fn linear(&mut self, name: &str, x: TensorId, k: u64, n: u64, bias: bool) -> TensorId {
        let w = self.weight(&format!("{name}.weight"), &[n, k], 1.0 / (k as f32).sqrt());
        let bias = bias.then(|| self.weight(&format!("{name}.bias"), &[n], 0.1));
        self.b.mat_mul_with(name, x, w, MatMulOptions { transpose_b: true, bias }).expect("linear")
    }

    /// Hugging Face's `LlamaRMSNorm`: in f32, then back to the model's type, times the weight (one `rms_norm`
    /// op with `norm_op`).
    fn rms_norm(&mut self, name: &str, x: TensorId) -> TensorId {
        let dim = self.cfg.dim;
        let values = (0..dim).map(|_| 1.0 + 0.1 * self.rng.next()).collect();
        let w = self.constant(&format!("{name}.weight"), &[dim], values);
        if self.cfg.norm_op {
            return self.b.rms_norm(&format!("{name}.out"), x, w, 1e-6).expect("rms_norm");
        }
        let op = |s: &str| format!("{name}.{s}");
        let b = &mut self.b;
        let xf = b.cast(&op("xf"), x, ElemType::F32).expect("cast");
        let sq = b.unary(&op("sq"), UnaryFn::Square, xf).expect("square");
        let var = b.mean(&op("var"), sq).expect("mean");
        let var = b.add(&op("var_eps"), var, self.eps).expect("add eps");
        let inv = b.unary(&op("rsqrt"), UnaryFn::Rsqrt, var).expect("rsqrt");
        let normed = b.mul(&op("normed"), xf, inv).expect("mul");
        let back = b.cast(&op("back"), normed, self.cfg.dtype).expect("cast back");
        b.mul(&op("out"), w, back).expect("weight")
    }

    /// `[1, T, heads * Dh]` to head-major `[1, heads, T, Dh]`.
    fn heads(&mut self, name: &str, x: TensorId, heads: u64) -> TensorId {
        let (rows, dh) = (self.rows, self.cfg.head_dim);
        let split = self.b.reshape(&format!("{name}.split"), x, &[1, rows, heads, dh]).expect("reshape");
        self.b.permute(&format!("{name}.heads"), split, &[0, 2, 1, 3]).expect("permute")
    }

    /// `x * cos + rotate_half(x) * sin` over head-major `[1, H, T, Dh]`.
    fn rope(&mut self, name: &str, x: TensorId) -> TensorId {
        let half = self.cfg.head_dim / 2;
        let op = |s: &str| format!("{name}.{s}");
        let b = &mut self.b;
        let x1 = b.slice(&op("x1"), x, 3, 0, half).expect("slice");
        let x2 = b.slice(&op("x2"), x, 3, half, 2 * half).expect("slice");
        let neg = b.unary(&op("neg"), UnaryFn::Neg, x2).expect("neg");
        let rot = b.concat(&op("rot"), neg, x1, 3).expect("concat");
        let a = b.mul(&op("cos"), x, self.cos).expect("mul");
        let r = b.mul(&op("sin"), rot, self.sin).expect("mul");
        b.add(&op("out"), a, r).expect("add")
    }
}

pub fn k_cache_out(layer: usize) -> String {
    format!("k_cache_out_{layer}")
}
pub fn v_cache_out(layer: usize) -> String {
    format!("v_cache_out_{layer}")
}

/// The decoder over `rows` tokens per call (the prompt length for prefill, 1 for decode).
pub fn build(cfg: &Hf, rows: u64) -> Graph {
    let mut b = GraphBuilder::new();
    let ids = b.input(IDS, ElemType::I64, &[1, rows]).expect("ids");
    let pos = b.input(POS, ElemType::I64, &[1]).expect("position");
    let caches: Vec<(TensorId, TensorId)> = (0..cfg.layers)
        .map(|l| {
            let k = b.input(&k_cache(l), cfg.dtype, &cfg.cache_shape()).expect("k cache");
            (k, b.input(&v_cache(l), cfg.dtype, &cfg.cache_shape()).expect("v cache"))
        })
        .collect();
    let eps = b.constant_f32("rms_eps", &[], vec![1e-6]).expect("eps");
    let mut s = Build { b, cfg, rng: Rng(7), rows, pos, cos: pos, sin: pos, eps };
    rope_tables(&mut s);
    let embed = s.weight("embed_tokens", &[cfg.vocab, cfg.dim], 1.0);
    let mut x = s.b.gather("embedded", embed, ids).expect("gather");
    let mut outs = Vec::new();
    for (layer, &(k_cache, v_cache)) in caches.iter().enumerate() {
        let (next, k, v) = decoder_layer(&mut s, layer, x, k_cache, v_cache);
        x = next;
        outs.push((k, v));
    }
    let h = s.rms_norm("norm", x);
    let logits = if cfg.tied {
        let options = MatMulOptions { transpose_b: true, bias: None };
        s.b.mat_mul_with(LOGITS, h, embed, options).expect("tied logits")
    } else {
        s.linear(LOGITS, h, cfg.dim, cfg.vocab, false)
    };
    let next = s.b.argmax(NEXT, logits).expect("argmax");
    s.b.output(logits).expect("output");
    s.b.output(next).expect("output");
    for (k, v) in outs {
        s.b.output(k).expect("output");
        s.b.output(v).expect("output");
    }
    s.b.finish().expect("a valid graph")
}

/// cos and sin of positions x `inv_freq`, `[T, Dh]` in the model's type (Hugging Face computes them in f32).
fn rope_tables(s: &mut Build<'_>) {
    let half = s.cfg.head_dim / 2;
    let inv: Vec<f32> = (0..half).map(|i| 10000f32.powf(-((2 * i) as f32) / s.cfg.head_dim as f32)).collect();
    let b = &mut s.b;
    let inv = b.constant_f32("inv_freq", &[half], inv).expect("inv_freq");
    let p = b.positions("positions", s.pos, s.rows).expect("positions");
    let pf = b.cast("positions_f", p, ElemType::F32).expect("cast");
    let col = b.reshape("positions_col", pf, &[s.rows, 1]).expect("reshape");
    let freqs = b.mul("freqs", col, inv).expect("outer product");
    let emb = b.concat("emb", freqs, freqs, 1).expect("concat");
    let cos = b.unary("cos_f", UnaryFn::Cos, emb).expect("cos");
    let sin = b.unary("sin_f", UnaryFn::Sin, emb).expect("sin");
    s.cos = b.cast("cos", cos, s.cfg.dtype).expect("cast");
    s.sin = b.cast("sin", sin, s.cfg.dtype).expect("cast");
}

/// One layer: attention (GQA, head-major caches updated in place) and a SwiGLU MLP, each with its residual.
fn decoder_layer(
    s: &mut Build<'_>,
    l: usize,
    x: TensorId,
    k_cache: TensorId,
    v_cache: TensorId,
) -> (TensorId, TensorId, TensorId) {
    let cfg = s.cfg.clone();
    let (dim, dh, rows) = (cfg.dim, cfg.head_dim, s.rows);
    let h = s.rms_norm(&format!("l{l}.input_norm"), x);
    let q = s.linear(&format!("l{l}.q_proj"), h, dim, cfg.heads * dh, cfg.bias);
    let k = s.linear(&format!("l{l}.k_proj"), h, dim, cfg.kv_heads * dh, cfg.bias);
    let v = s.linear(&format!("l{l}.v_proj"), h, dim, cfg.kv_heads * dh, cfg.bias);
    let q = s.heads(&format!("l{l}.q"), q, cfg.heads);
    let k = s.heads(&format!("l{l}.k"), k, cfg.kv_heads);
    let v = s.heads(&format!("l{l}.v"), v, cfg.kv_heads);
    let q = s.rope(&format!("l{l}.q_rope"), q);
    let k = s.rope(&format!("l{l}.k_rope"), k);
    let b = &mut s.b;
    let k = b.kv_cache_update(&k_cache_out(l), k_cache, k, s.pos).expect("k update");
    let v = b.kv_cache_update(&v_cache_out(l), v_cache, v, s.pos).expect("v update");
    let scale = 1.0 / (dh as f32).sqrt();
    let options = AttentionOptions { scale: Some(scale), softcap: cfg.softcap };
    let attn = b.causal_attention_with(&format!("l{l}.attn"), [q, k, v, s.pos], options).expect("attention");
    let attn = b.permute(&format!("l{l}.attn_t"), attn, &[0, 2, 1, 3]).expect("permute");
    let attn = b.reshape(&format!("l{l}.attn_flat"), attn, &[1, rows, cfg.heads * dh]).expect("reshape");
    let o = s.linear(&format!("l{l}.o_proj"), attn, cfg.heads * dh, dim, false);
    let x = s.b.add(&format!("l{l}.resid1"), x, o).expect("residual");
    let h = s.rms_norm(&format!("l{l}.post_norm"), x);
    let gate = s.linear(&format!("l{l}.gate_proj"), h, dim, cfg.ffn, false);
    let up = s.linear(&format!("l{l}.up_proj"), h, dim, cfg.ffn, false);
    let act = s.b.unary(&format!("l{l}.silu"), UnaryFn::Silu, gate).expect("silu");
    let prod = s.b.mul(&format!("l{l}.swiglu"), act, up).expect("mul");
    let down = s.linear(&format!("l{l}.down_proj"), prod, cfg.ffn, dim, false);
    let x = s.b.add(&format!("l{l}.resid2"), x, down).expect("residual");
    (x, k, v)
}

/// The blob of `graph` for `backend` on device 0: every input then every output a threaded binding, each cache
/// output aliased to its cache (delegate-pack's, the packer every exporter uses).
pub fn blob(graph: &Graph, backend: &str) -> Vec<u8> {
    delegate_pack::pack_graph(graph, backend).expect("a graph delegate-pack packs")
}
