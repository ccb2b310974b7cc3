//! Deterministic weights from a seed, shared by the exporter and the oracle.

use ref_graph::half;
use ref_graph::ElemType;

use crate::Config;

/// SplitMix64: a tiny, well-mixed generator; the same seed gives the same weights on every platform.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[-scale, scale)`, exact in `f32` (24 random bits).
    fn uniform(&mut self, scale: f32) -> f32 {
        let unit = (self.next() >> 40) as f32 / (1u64 << 24) as f32;
        (2.0 * unit - 1.0) * scale
    }

    fn fill(&mut self, len: usize, scale: f32) -> Vec<f32> {
        (0..len).map(|_| self.uniform(scale)).collect()
    }
}

/// One layer's weights. Matrices are row-major `[in, out]`: `y = x W`.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerWeights {
    /// RMS-norm gain before attention, `[dim]`.
    pub norm: Vec<f32>,
    /// Query projection, `[dim, dim]`.
    pub wq: Vec<f32>,
    /// Key projection, `[dim, dim]`.
    pub wk: Vec<f32>,
    /// Value projection, `[dim, dim]`.
    pub wv: Vec<f32>,
    /// Output projection, `[dim, dim]`.
    pub wo: Vec<f32>,
}

/// Every weight of the model, as `f32` (the values an `f32` blob carries, rounded to `f16` in an `f16` blob:
/// see [`Weights::stored_as`]; the oracle widens them to `f64`).
#[derive(Debug, Clone, PartialEq)]
pub struct Weights {
    /// Token embedding, `[vocab, dim]`.
    pub tok_emb: Vec<f32>,
    /// Position embedding, `[max_len, dim]`.
    pub pos_emb: Vec<f32>,
    /// Per-layer weights.
    pub layers: Vec<LayerWeights>,
    /// RMS-norm gain before the output projection, `[dim]`.
    pub final_norm: Vec<f32>,
    /// Output projection to logits, `[dim, vocab]`.
    pub w_out: Vec<f32>,
}

impl Weights {
    /// The weights for `cfg`, drawn from `cfg.seed` in a fixed order. Embeddings are uniform in
    /// `[-0.5, 0.5)`, projections in `±1/sqrt(fan_in)` (so activations stay of order one and logits are
    /// well-conditioned), norm gains in `1 ± 0.1`.
    pub fn generate(cfg: &Config) -> Weights {
        let mut rng = SplitMix64(cfg.seed);
        let dim = cfg.dim();
        let proj = 1.0 / (dim as f32).sqrt();
        let gain = |rng: &mut SplitMix64| (0..dim).map(|_| 1.0 + rng.uniform(0.1)).collect::<Vec<_>>();
        let tok_emb = rng.fill(cfg.vocab * dim, 0.5);
        let pos_emb = rng.fill(cfg.max_len * dim, 0.5);
        let layers = (0..cfg.layers)
            .map(|_| LayerWeights {
                norm: gain(&mut rng),
                wq: rng.fill(dim * dim, 2.0 * proj),
                wk: rng.fill(dim * dim, 2.0 * proj),
                wv: rng.fill(dim * dim, proj),
                wo: rng.fill(dim * dim, proj),
            })
            .collect();
        let final_norm = gain(&mut rng);
        let w_out = rng.fill(dim * cfg.vocab, 2.0 * proj);
        Weights { tok_emb, pos_emb, layers, final_norm, w_out }
    }

    /// The values a graph of `dtype` stores: unchanged for `f32`; for `f16`, every weight rounded to the
    /// nearest `f16` (ties to even, [`half::f16::from_f32`], as the exporter does) and widened back to `f32`,
    /// which is exact. The oracle of an `f16` config computes with these.
    pub fn stored_as(&self, dtype: ElemType) -> Weights {
        if dtype != ElemType::F16 {
            return self.clone();
        }
        let round =
            |values: &[f32]| values.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect::<Vec<_>>();
        Weights {
            tok_emb: round(&self.tok_emb),
            pos_emb: round(&self.pos_emb),
            layers: self
                .layers
                .iter()
                .map(|l| LayerWeights {
                    norm: round(&l.norm),
                    wq: round(&l.wq),
                    wk: round(&l.wk),
                    wv: round(&l.wv),
                    wo: round(&l.wo),
                })
                .collect(),
            final_norm: round(&self.final_norm),
            w_out: round(&self.w_out),
        }
    }
}
