//! The decoder as a reference graph ([`ref_graph`]).
//!
//! ```text
//! x = tok_emb[tokens] + pos_emb[input_pos + t]
//! per layer l:  h = rms_norm(x); q, k, v = h Wq, h Wk, h Wv
//!               k_cache_out_l = k_cache_l updated at input_pos with k (in place); same for v
//!               x = x + causal_attention(q, k_cache_out_l, v_cache_out_l) Wo
//! logits = rms_norm(x) Wout
//! next_token = argmax(logits[last row])
//! ```
//!
//! The graph computes in [`Config::dtype`]: with `f16`, every weight is stored as `f16` (rounded to nearest
//! even from the generated `f32` weights) and the caches, activations and logits are `f16`.

use ref_graph::{half, ElemType, Graph, GraphBuilder, TensorId};

use crate::{Config, Weights};

/// Epsilon of every RMS norm.
pub const RMS_EPS: f32 = 1e-5;
/// Name of the token-id input, `i64 [rows]`.
pub const TOKENS: &str = "tokens";
/// Name of the position input, `i64 [1]`: the position of the first row.
pub const INPUT_POS: &str = "input_pos";
/// Name of the logits output, `[rows, vocab]` of [`Config::dtype`].
pub const LOGITS: &str = "logits";
/// Name of the next-token output, `i64 [1]`: the argmax of the last row of the logits (ref-graph's
/// `Op::Argmax`, whose rule is `ref_graph::argmax`), so a host can feed the token back without reading the logits.
pub const NEXT_TOKEN: &str = "next_token";

/// Name of layer `layer`'s key cache (`"k_cache_{layer}"`): a graph input and a caller-owned buffer.
pub fn k_cache(layer: usize) -> String {
    format!("k_cache_{layer}")
}

/// Name of layer `layer`'s value cache (`"v_cache_{layer}"`).
pub fn v_cache(layer: usize) -> String {
    format!("v_cache_{layer}")
}

/// Name of the output that aliases [`k_cache`] (`"k_cache_out_{layer}"`).
pub fn k_cache_out(layer: usize) -> String {
    format!("k_cache_out_{layer}")
}

/// Name of the output that aliases [`v_cache`] (`"v_cache_out_{layer}"`).
pub fn v_cache_out(layer: usize) -> String {
    format!("v_cache_out_{layer}")
}

fn u(n: usize) -> u64 {
    n as u64
}

/// Builds the decoder over `rows` tokens per call (the prompt length for prefill, 1 for decode).
///
/// Graph inputs are `tokens, input_pos, k_cache_0, v_cache_0, ...`; graph outputs are
/// `logits, next_token, k_cache_out_0, v_cache_out_0, ...` (the blob's argument order differs on purpose, see
/// [`crate::export`]). `cfg.dtype` must be a float type ([`Config::validate`]); another is built as `f32`.
pub fn build_graph(cfg: &Config, weights: &Weights, rows: usize) -> Result<Graph, ref_graph::Error> {
    let (dim, vocab) = (u(cfg.dim()), u(cfg.vocab));
    let cache = [u(cfg.heads), u(cfg.max_len), u(cfg.head_dim)];
    let dtype = if cfg.dtype == ElemType::F16 { ElemType::F16 } else { ElemType::F32 };
    // Every weight in the graph's float type: f16 rounds to nearest even.
    let constant = |b: &mut GraphBuilder, name: &str, shape: &[u64], values: &[f32]| match dtype {
        ElemType::F16 => {
            b.constant_f16(name, shape, values.iter().map(|&x| half::f16::from_f32(x)).collect())
        }
        _ => b.constant_f32(name, shape, values.to_vec()),
    };
    let mut b = GraphBuilder::new();
    let tokens = b.input(TOKENS, ElemType::I64, &[u(rows)])?;
    let pos = b.input(INPUT_POS, ElemType::I64, &[1])?;
    let caches = (0..cfg.layers)
        .map(|l| Ok((b.input(&k_cache(l), dtype, &cache)?, b.input(&v_cache(l), dtype, &cache)?)))
        .collect::<Result<Vec<(TensorId, TensorId)>, ref_graph::Error>>()?;

    let tok_emb = constant(&mut b, "tok_emb", &[vocab, dim], &weights.tok_emb)?;
    let pos_emb = constant(&mut b, "pos_emb", &[u(cfg.max_len), dim], &weights.pos_emb)?;
    let x_tok = b.gather("x_tok", tok_emb, tokens)?;
    let positions = b.positions("positions", pos, u(rows))?;
    let x_pos = b.gather("x_pos", pos_emb, positions)?;
    let mut x = b.add("x_0", x_tok, x_pos)?;

    let mut cache_outs = Vec::with_capacity(cfg.layers);
    for (l, (lw, &(k_in, v_in))) in weights.layers.iter().zip(&caches).enumerate() {
        let w = |b: &mut GraphBuilder, name: &str, values: &[f32]| {
            constant(b, &format!("layer{l}.{name}"), &[dim, dim], values)
        };
        let norm = constant(&mut b, &format!("layer{l}.norm"), &[dim], &lw.norm)?;
        let (wq, wk, wv, wo) = (
            w(&mut b, "wq", &lw.wq)?,
            w(&mut b, "wk", &lw.wk)?,
            w(&mut b, "wv", &lw.wv)?,
            w(&mut b, "wo", &lw.wo)?,
        );
        let h = b.rms_norm(&format!("layer{l}.h"), x, norm, RMS_EPS)?;
        let q = b.mat_mul(&format!("layer{l}.q"), h, wq)?;
        let k = b.mat_mul(&format!("layer{l}.k"), h, wk)?;
        let v = b.mat_mul(&format!("layer{l}.v"), h, wv)?;
        let k_out = b.kv_cache_update(&k_cache_out(l), k_in, k, pos)?;
        let v_out = b.kv_cache_update(&v_cache_out(l), v_in, v, pos)?;
        let attn = b.causal_attention(&format!("layer{l}.attn"), q, k_out, v_out, pos)?;
        let o = b.mat_mul(&format!("layer{l}.o"), attn, wo)?;
        x = b.add(&format!("x_{}", l + 1), x, o)?;
        cache_outs.push((k_out, v_out));
    }
    let final_norm = constant(&mut b, "final_norm", &[dim], &weights.final_norm)?;
    let w_out = constant(&mut b, "w_out", &[dim, vocab], &weights.w_out)?;
    let hf = b.rms_norm("h_final", x, final_norm, RMS_EPS)?;
    let logits = b.mat_mul(LOGITS, hf, w_out)?;
    let next_token = b.argmax(NEXT_TOKEN, logits)?;
    b.output(logits)?;
    b.output(next_token)?;
    for (k_out, v_out) in cache_outs {
        b.output(k_out)?;
        b.output(v_out)?;
    }
    b.finish()
}
