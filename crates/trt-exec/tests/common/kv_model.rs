//! kv-example's config and weights as trt-exec's decoder types, field for field: the one conversion shared by
//! trt-exec's tests, its `export_example` and the TensorRT plugin's tests (included with `#[path]`; trt-exec
//! itself does not depend on the example).
#![allow(dead_code)]

use trt_exec::decoder::{DecoderConfig, DecoderWeights, LayerWeights};

/// The decoder hyper-parameters of a kv-example config (its prompt and seed are the example's business).
pub fn decoder_config(c: &kv_example::Config) -> DecoderConfig {
    DecoderConfig {
        vocab: c.vocab,
        heads: c.heads,
        head_dim: c.head_dim,
        max_len: c.max_len,
        layers: c.layers,
    }
}

/// kv-example's weights, moved into trt-exec's layout (both row-major `[in, out]`).
pub fn decoder_weights(w: kv_example::Weights) -> DecoderWeights {
    DecoderWeights {
        tok_emb: w.tok_emb,
        pos_emb: w.pos_emb,
        layers: w
            .layers
            .into_iter()
            .map(|l| LayerWeights { norm: l.norm, wq: l.wq, wk: l.wk, wv: l.wv, wo: l.wo })
            .collect(),
        final_norm: w.final_norm,
        w_out: w.w_out,
    }
}

/// A kv-example config with its generated weights, converted.
pub fn model(c: &kv_example::Config) -> (DecoderConfig, DecoderWeights) {
    (decoder_config(c), decoder_weights(kv_example::Weights::generate(c)))
}

/// kv-example's tiny model (upstream's acceptance model), converted.
pub fn tiny() -> (DecoderConfig, DecoderWeights) {
    model(&kv_example::Config::tiny())
}
