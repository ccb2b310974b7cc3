//! Token sampling shared by the host loop and the device loop: a seed gives the same tokens on every run, and
//! the device loop's GPU kernel, which follows the arithmetic below operation for operation, draws the same
//! tokens where the logits agree. This crate is the oracle: the kernel is checked against it.
//!
//! # The contract
//! [`Sampler::pick`] turns one row of logits (f32, one per vocabulary id) into a token id, for generated
//! token `step` (0 for the token after the prompt, then 1, 2, ...), in this order. Every operation is one
//! IEEE-754 single-precision operation rounded to nearest (no fused multiply-add but where one is named, no
//! flush of subnormals), so a GPU doing the same operations in the same order gets the same bits.
//! 1. **Repetition penalty** `r` (1 = off): for every distinct id in the history (prompt and generated
//!    tokens) within the vocabulary, a logit `l > 0` becomes `l / r`, any other `l * r` (as transformers'
//!    `RepetitionPenaltyLogitsProcessor`).
//! 2. **Greedy** when the temperature is 0: the first index of the largest logit, a NaN never winning
//!    (`ref_graph::argmax`'s rule, the one every delegate's `next_token` follows). No draw is made.
//! 3. **Temperature** `T > 0`: every logit becomes `l / T`; a NaN becomes negative infinity.
//! 4. **Order**: ids sorted by logit, largest first in IEEE-754's total order (`f32::total_cmp`: `+0` above
//!    `-0`), ties broken by the smaller id.
//! 5. **Candidates**: only the first `K` ids stay, `K` = top-k, or [`MAX_CANDIDATES`] (1024) when top-k is 0
//!    (off), or the vocabulary when it is smaller. The bound lets a GPU select the candidates with block
//!    reductions and sort only them in shared memory; top-k above it is refused ([`Sampler::new`]).
//! 6. **Softmax** over the candidates, in sorted order: `w_i = exp(l_i - l_0)` with the contract's
//!    exponential ([`exp`]: fixed operations, 0 below -87), or `w_i = 1` for every candidate when `l_0` is
//!    infinite; `total = w_0 + w_1 + ...`, summed left to right in sorted order; `p_i = w_i / total`.
//! 7. **Top-p** (`p` = 1: off): the shortest sorted prefix whose probabilities, summed left to right, reach
//!    `p` stays (at least one id).
//! 8. **Min-p** (`m` = 0: off): ids whose probability (of step 6) is below `m * p_0` go.
//! 9. **Draw**: `u = uniform(seed, step)` ([`uniform`]: Philox4x32-10, counter `(step, 0, 0)`, key `seed`,
//!    the first word's top 24 bits times 2^-24), `target = u * S` where `S` is the sum, left to right in
//!    sorted order, of the probabilities of step 6 of the ids that stay; the token is the first id, in sorted
//!    order, at which the running sum (left to right, of the ids that stay) exceeds `target`, or the last id
//!    that stays when rounding leaves none.
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

mod exp;
mod philox;

use std::borrow::Cow;

pub use exp::{exp, EXP_FLOOR};
pub use philox::{philox4x32_10, uniform};

/// The most candidates a draw chooses among (step 5 of the contract): top-k 0 keeps this many, top-k above it
/// is refused.
pub const MAX_CANDIDATES: usize = 1024;

/// How to sample; the default is greedy with seed 0.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    /// Temperature; 0 is greedy.
    pub temperature: f32,
    /// Keep the `top_k` most likely ids, at most [`MAX_CANDIDATES`]; 0 keeps the [`MAX_CANDIDATES`] most
    /// likely.
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
    /// Checks `params`: a finite temperature `>= 0`, `top_k` at most [`MAX_CANDIDATES`], `top_p` in `(0, 1]`,
    /// `min_p` in `[0, 1]`, a finite repetition penalty `> 0`.
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
            (
                "--top-k",
                params.top_k as f32,
                params.top_k <= MAX_CANDIDATES,
                "at most 1024 (0: the 1024 most likely)",
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
        let target = uniform(self.params.seed, step) * sum(kept.iter().map(|c| c.1));
        let mut running = 0.0f32;
        for &(id, p) in &kept {
            running += p;
            if running > target {
                return id;
            }
        }
        kept.last().map_or(0, |c| c.0)
    }

    /// The number of candidates for a row of `vocab` logits (step 5 of the contract).
    pub fn candidate_count(&self, vocab: usize) -> usize {
        let k = if self.params.top_k == 0 { MAX_CANDIDATES } else { self.params.top_k };
        k.min(vocab)
    }

    /// Steps 3 to 8 of the contract: the ids that stay, in sorted order, with their probabilities of step 6.
    pub fn candidates(&self, logits: &[f32]) -> Vec<(usize, f32)> {
        let Params { temperature, top_p, min_p, .. } = self.params;
        let scaled: Vec<f32> =
            logits.iter().map(|&l| if l.is_nan() { f32::NEG_INFINITY } else { l / temperature }).collect();
        let order = top_sorted(&scaled, self.candidate_count(scaled.len()));
        let Some(&first) = order.first() else { return Vec::new() };
        let top = scaled[first];
        let weights: Vec<f32> =
            order.iter().map(|&i| if top.is_finite() { exp(scaled[i] - top) } else { 1.0 }).collect();
        let total = sum(weights.iter().copied());
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

    /// Step 1 of the contract; the row itself, uncopied, when the penalty is off.
    fn penalised<'l>(&self, logits: &'l [f32], history: &[i64]) -> Cow<'l, [f32]> {
        let r = self.params.repetition_penalty;
        if r == 1.0 {
            return Cow::Borrowed(logits);
        }
        let mut out = logits.to_vec();
        let mut seen = vec![false; out.len()];
        for id in history.iter().filter_map(|&id| usize::try_from(id).ok()) {
            if let (Some(l), Some(false)) = (out.get_mut(id), seen.get(id).copied()) {
                *l = if *l > 0.0 { *l / r } else { *l * r };
                seen[id] = true;
            }
        }
        Cow::Owned(out)
    }
}

/// The first `k` ids of `scaled` in the contract's order (step 4: largest first in the total order, ties by
/// the smaller id), sorted: the `k`-th found by selection, then only the `k` sorted.
fn top_sorted(scaled: &[f32], k: usize) -> Vec<usize> {
    let before = |a: &usize, b: &usize| scaled[*b].total_cmp(&scaled[*a]).then(a.cmp(b));
    if k == 0 {
        return Vec::new();
    }
    let mut order: Vec<usize> = (0..scaled.len()).collect();
    if k < order.len() {
        order.select_nth_unstable_by(k - 1, before);
        order.truncate(k);
    }
    order.sort_unstable_by(before);
    order
}

/// The sum of `values` left to right from 0, in f32 (the contract's every sum).
fn sum(values: impl Iterator<Item = f32>) -> f32 {
    values.fold(0.0, |total, v| total + v)
}

/// The greedy token: `ref_graph::argmax`, the one rule every delegate's `next_token` and every host follows
/// (the first index of the largest value, a NaN never winning).
pub use ref_graph::argmax;
