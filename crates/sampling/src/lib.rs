//! Token sampling shared by the host loop and (later) the device loop: a seed gives the same tokens on every
//! run, and a GPU kernel that follows the arithmetic below draws the same tokens where the logits agree.
//!
//! # The contract
//! [`Sampler::pick`] turns one row of logits (f32, one per vocabulary id) into a token id, for generated
//! token `step` (0 for the token after the prompt, then 1, 2, ...), in this order:
//! 1. **Repetition penalty** `r` (1 = off): for every distinct id in the history (prompt and generated
//!    tokens) within the vocabulary, a logit `l > 0` becomes `l / r`, any other `l * r` (as transformers'
//!    `RepetitionPenaltyLogitsProcessor`).
//! 2. **Greedy** when the temperature is 0: the first index of the largest logit, a NaN never winning
//!    (`ref_graph::argmax`'s rule, the one every delegate's `next_token` follows). No draw is made.
//! 3. **Temperature** `T > 0`: every logit becomes `l / T`; a NaN becomes negative infinity.
//! 4. **Order**: ids sorted by logit, largest first, ties broken by the smaller id.
//! 5. **Top-k** (`k` = 0: off): only the first `k` ids stay.
//! 6. **Softmax** over the ids that stay, in sorted order: `p_i = exp(l_i - l_0) / Σ_j exp(l_j - l_0)`, the
//!    sum taken in sorted order in f32.
//! 7. **Top-p** (`p` = 1: off): the shortest sorted prefix whose probabilities, summed in sorted order, reach
//!    `p` stays (at least one id).
//! 8. **Min-p** (`m` = 0: off): ids whose probability (of step 6) is below `m * p_0` go.
//! 9. **Draw**: `u = uniform(seed, step)` ([`uniform`]: Philox4x32-10, counter `(step, 0, 0)`, key `seed`,
//!    the first word's top 24 bits times 2^-24), `target = u * S` where `S` is the sum (in sorted order) of
//!    the probabilities of step 6 of the ids that stay; the token is the first id, in sorted order, at which
//!    the running sum exceeds `target`, or the last id that stays when rounding leaves none.
//!
//! # Example
//! ```
//! use sampling::{Params, Sampler};
//!
//! let params = Params { temperature: 0.8, top_k: 40, top_p: 0.95, seed: 7, ..Params::default() };
//! let sampler = Sampler::new(params)?;
//! let logits = [0.1f32, 2.0, -1.0, 1.5];
//! let token = sampler.pick(&logits, &[1, 3], 0);
//! assert!(token < logits.len());
//! assert_eq!(token, sampler.pick(&logits, &[1, 3], 0), "a seed and a step give the same token");
//! // Greedy (temperature 0, the default) is the argmax.
//! assert_eq!(Sampler::new(Params::default())?.pick(&logits, &[], 0), 1);
//! # Ok::<(), sampling::BadParam>(())
//! ```
#![forbid(unsafe_code)]

mod philox;

pub use philox::{philox4x32_10, uniform};

/// How to sample; the default is greedy with seed 0.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    /// Temperature; 0 is greedy.
    pub temperature: f32,
    /// Keep the `top_k` most likely ids; 0 keeps all.
    pub top_k: usize,
    /// Keep the most likely ids whose probabilities reach `top_p`; 1 keeps all.
    pub top_p: f32,
    /// Drop ids less likely than `min_p` times the most likely one; 0 keeps all.
    pub min_p: f32,
    /// Repetition penalty over the history; 1 is off.
    pub repetition_penalty: f32,
    /// The generator's seed.
    pub seed: u64,
}

impl Default for Params {
    fn default() -> Params {
        Params { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0, repetition_penalty: 1.0, seed: 0 }
    }
}

/// A sampling parameter out of its range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{name} {value}: must be {range}")]
pub struct BadParam {
    /// The parameter, as the command line spells it (`--top-p`).
    pub name: &'static str,
    /// The value given.
    pub value: f32,
    /// The range it must be in.
    pub range: &'static str,
}

/// A checked [`Params`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampler {
    params: Params,
}

impl Sampler {
    /// Checks `params`: a finite temperature `>= 0`, `top_p` in `(0, 1]`, `min_p` in `[0, 1]`, a finite
    /// repetition penalty `> 0`.
    ///
    /// # Errors
    /// [`BadParam`] naming the first parameter out of range.
    pub fn new(params: Params) -> Result<Sampler, BadParam> {
        let checks = [
            (
                "--temperature",
                params.temperature,
                params.temperature >= 0.0 && params.temperature.is_finite(),
                "finite and >= 0",
            ),
            ("--top-p", params.top_p, params.top_p > 0.0 && params.top_p <= 1.0, "in (0, 1]"),
            ("--min-p", params.min_p, (0.0..=1.0).contains(&params.min_p), "in [0, 1]"),
            (
                "--repetition-penalty",
                params.repetition_penalty,
                params.repetition_penalty > 0.0 && params.repetition_penalty.is_finite(),
                "finite and > 0",
            ),
        ];
        match checks.into_iter().find(|check| !check.2) {
            Some((name, value, _, range)) => Err(BadParam { name, value, range }),
            None => Ok(Sampler { params }),
        }
    }

    /// The parameters.
    pub fn params(&self) -> &Params {
        &self.params
    }

    /// Whether every token is the argmax (temperature 0, no penalty): the program's own next token serves.
    pub fn is_plain_greedy(&self) -> bool {
        self.params.temperature == 0.0 && self.params.repetition_penalty == 1.0
    }

    /// The token for generated token `step` from `logits`, given the `history` (see the crate docs). An
    /// empty row gives 0.
    pub fn pick(&self, logits: &[f32], history: &[i64], step: u64) -> usize {
        let logits = self.penalised(logits, history);
        if self.params.temperature == 0.0 {
            return argmax(&logits);
        }
        let kept = self.candidates(&logits);
        let target = uniform(self.params.seed, step) * kept.iter().map(|c| c.1).sum::<f32>();
        let mut running = 0.0f32;
        for &(id, p) in &kept {
            running += p;
            if running > target {
                return id;
            }
        }
        kept.last().map_or(0, |c| c.0)
    }

    /// Steps 3 to 8 of the contract: the ids that stay, in sorted order, with their probabilities of step 6.
    pub fn candidates(&self, logits: &[f32]) -> Vec<(usize, f32)> {
        let Params { temperature, top_k, top_p, min_p, .. } = self.params;
        let scaled: Vec<f32> =
            logits.iter().map(|&l| if l.is_nan() { f32::NEG_INFINITY } else { l / temperature }).collect();
        let mut order: Vec<usize> = (0..scaled.len()).collect();
        order.sort_by(|&a, &b| scaled[b].total_cmp(&scaled[a]).then(a.cmp(&b)));
        if top_k > 0 {
            order.truncate(top_k);
        }
        let Some(&first) = order.first() else { return Vec::new() };
        let top = scaled[first];
        let weights: Vec<f32> =
            order.iter().map(|&i| if top.is_finite() { (scaled[i] - top).exp() } else { 1.0 }).collect();
        let total: f32 = weights.iter().sum();
        let probs: Vec<f32> = weights.iter().map(|w| w / total).collect();
        let mut keep = probs.len();
        if top_p < 1.0 {
            let mut running = 0.0f32;
            keep = probs
                .iter()
                .position(|&p| {
                    running += p;
                    running >= top_p
                })
                .map_or(keep, |i| i + 1);
        }
        let floor = min_p * probs[0];
        order.into_iter().zip(probs).take(keep).filter(|&(_, p)| p >= floor).collect()
    }

    /// Step 1 of the contract.
    fn penalised(&self, logits: &[f32], history: &[i64]) -> Vec<f32> {
        let mut out = logits.to_vec();
        let r = self.params.repetition_penalty;
        if r == 1.0 {
            return out;
        }
        let mut seen = vec![false; out.len()];
        for id in history.iter().filter_map(|&id| usize::try_from(id).ok()) {
            if let (Some(l), Some(false)) = (out.get_mut(id), seen.get(id).copied()) {
                *l = if *l > 0.0 { *l / r } else { *l * r };
                seen[id] = true;
            }
        }
        out
    }
}

/// The greedy token: `ref_graph::argmax`, the one rule every delegate's `next_token` and every host follows
/// (the first index of the largest value, a NaN never winning).
pub use ref_graph::argmax;
