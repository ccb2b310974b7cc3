//! An independent plain-Rust `f64` implementation of the example model, one token at a time.
//!
//! It shares nothing with the reference delegate but the weights (the same `f32` values, widened): no graph,
//! no kernels, no batching. Prefill is computed as successive single-token steps, so a batched-prefill bug
//! in a delegate shows up as a mismatch.
//!
//! For an `f16` config it computes with the weights the blob stores: each rounded to `f16`
//! ([`Weights::stored_as`]) and widened to `f64`. Everything else (activations, caches, logits) stays `f64`,
//! so the oracle is the exact model of the stored weights, not a model of `f16` arithmetic: how far an `f16`
//! executor may be from it is the caller's tolerance (see [`crate::check::F16_TOLERANCE`] for a suggestion).

use et_error::{ErrorCode, HasErrorCode};

use crate::model::RMS_EPS;
use crate::{Config, Weights};

/// Why the oracle cannot run a step.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OracleError {
    /// The token is outside the vocabulary.
    #[error("token {token} is outside the vocabulary of {vocab}")]
    Token {
        /// The token.
        token: i64,
        /// Vocabulary size.
        vocab: usize,
    },
    /// The position is outside the cache.
    #[error("position {position} is outside the cache of {max_len} rows")]
    Position {
        /// The position.
        position: usize,
        /// Cache rows.
        max_len: usize,
    },
}

impl HasErrorCode for OracleError {
    fn error_code(&self) -> ErrorCode {
        ErrorCode::InvalidArgument
    }
}

struct Layer {
    norm: Vec<f64>,
    wq: Vec<f64>,
    wk: Vec<f64>,
    wv: Vec<f64>,
    wo: Vec<f64>,
}

/// The model in `f64` with its own K/V caches (`[heads, max_len, head_dim]` per layer, zero at start).
pub struct Oracle {
    cfg: Config,
    tok_emb: Vec<f64>,
    pos_emb: Vec<f64>,
    layers: Vec<Layer>,
    final_norm: Vec<f64>,
    w_out: Vec<f64>,
    k: Vec<Vec<f64>>,
    v: Vec<Vec<f64>>,
}

impl std::fmt::Debug for Oracle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Oracle").field("cfg", &self.cfg).finish_non_exhaustive()
    }
}

fn widen(values: &[f32]) -> Vec<f64> {
    values.iter().map(|&x| f64::from(x)).collect()
}

/// `x W` for `x` of `W`'s row count, `W` row-major `[x.len(), cols]`.
fn vec_mat(x: &[f64], w: &[f64], cols: usize) -> Vec<f64> {
    let mut y = vec![0.0; cols];
    for (i, &xi) in x.iter().enumerate() {
        for (j, yj) in y.iter_mut().enumerate() {
            *yj += xi * w[i * cols + j];
        }
    }
    y
}

fn rms_norm(x: &[f64], gain: &[f64]) -> Vec<f64> {
    let mean_square = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (mean_square + f64::from(RMS_EPS)).sqrt();
    x.iter().zip(gain).map(|(v, g)| v * inv * g).collect()
}

impl Oracle {
    /// The model of `cfg` with [`Weights::generate`]'s weights and zeroed caches.
    pub fn new(cfg: &Config) -> Oracle {
        Oracle::with_weights(cfg, &Weights::generate(cfg))
    }

    /// The model of `cfg` with the given weights (rounded to `f16` first for an `f16` config, as the blob
    /// stores them) and zeroed caches.
    pub fn with_weights(cfg: &Config, weights: &Weights) -> Oracle {
        let weights = &weights.stored_as(cfg.dtype);
        let layers = weights
            .layers
            .iter()
            .map(|l| Layer {
                norm: widen(&l.norm),
                wq: widen(&l.wq),
                wk: widen(&l.wk),
                wv: widen(&l.wv),
                wo: widen(&l.wo),
            })
            .collect();
        Oracle {
            cfg: cfg.clone(),
            tok_emb: widen(&weights.tok_emb),
            pos_emb: widen(&weights.pos_emb),
            layers,
            final_norm: widen(&weights.final_norm),
            w_out: widen(&weights.w_out),
            k: vec![vec![0.0; cfg.cache_len()]; cfg.layers],
            v: vec![vec![0.0; cfg.cache_len()]; cfg.layers],
        }
    }

    /// Zeroes every cache.
    pub fn reset(&mut self) {
        for cache in self.k.iter_mut().chain(self.v.iter_mut()) {
            cache.fill(0.0);
        }
    }

    /// Layer `layer`'s `(k, v)` caches, `[heads, max_len, head_dim]` row-major. Empty for a layer that does
    /// not exist.
    pub fn cache(&self, layer: usize) -> (&[f64], &[f64]) {
        match (self.k.get(layer), self.v.get(layer)) {
            (Some(k), Some(v)) => (k, v),
            _ => (&[], &[]),
        }
    }

    /// Runs the prompt at positions `0..tokens.len()`, writing the caches; the logits of every position.
    pub fn prefill(&mut self, tokens: &[i64]) -> Result<Vec<Vec<f64>>, OracleError> {
        tokens.iter().enumerate().map(|(position, &token)| self.decode(token, position)).collect()
    }

    /// Runs one token at `position`: writes cache row `position` of every layer and attends to rows
    /// `0..=position`; the logits.
    pub fn decode(&mut self, token: i64, position: usize) -> Result<Vec<f64>, OracleError> {
        let cfg = &self.cfg;
        let (dim, hd, len) = (cfg.dim(), cfg.head_dim, cfg.max_len);
        let row = usize::try_from(token)
            .ok()
            .filter(|&t| t < cfg.vocab)
            .ok_or(OracleError::Token { token, vocab: cfg.vocab })?;
        if position >= len {
            return Err(OracleError::Position { position, max_len: len });
        }
        let mut x: Vec<f64> =
            (0..dim).map(|i| self.tok_emb[row * dim + i] + self.pos_emb[position * dim + i]).collect();
        for (layer, (k_cache, v_cache)) in self.layers.iter().zip(self.k.iter_mut().zip(self.v.iter_mut())) {
            let h = rms_norm(&x, &layer.norm);
            let q = vec_mat(&h, &layer.wq, dim);
            let k = vec_mat(&h, &layer.wk, dim);
            let v = vec_mat(&h, &layer.wv, dim);
            for head in 0..cfg.heads {
                for d in 0..hd {
                    k_cache[(head * len + position) * hd + d] = k[head * hd + d];
                    v_cache[(head * len + position) * hd + d] = v[head * hd + d];
                }
            }
            let mut attn = vec![0.0; dim];
            for head in 0..cfg.heads {
                let scores: Vec<f64> = (0..=position)
                    .map(|r| {
                        (0..hd).map(|d| q[head * hd + d] * k_cache[(head * len + r) * hd + d]).sum::<f64>()
                            / (hd as f64).sqrt()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let exps: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f64 = exps.iter().sum();
                for (r, e) in exps.iter().enumerate() {
                    for d in 0..hd {
                        attn[head * hd + d] += e / total * v_cache[(head * len + r) * hd + d];
                    }
                }
            }
            let o = vec_mat(&attn, &layer.wo, dim);
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
        }
        Ok(vec_mat(&rms_norm(&x, &self.final_norm), &self.w_out, cfg.vocab))
    }
}
