//! The sampling and stop options `delegate-host run` and `et-run` share, checked into [`Settings`].

use std::path::Path;

use sampling::{Params, Sampler};

use crate::{StopRules, TextError};

/// The sampling and stop options of a generating command line.
#[derive(Debug, Clone, clap::Args)]
pub struct GenArgs {
    /// Generate at most N tokens (the first comes from prefill: N - 1 decode steps) [default: as --steps]
    #[arg(long, value_name = "N", conflicts_with = "steps", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_new_tokens: Option<u64>,
    /// End the reply where this text appears (not printed); repeatable. Needs a tokenizer.
    #[arg(long = "stop", value_name = "STRING")]
    pub stops: Vec<String>,
    /// Sampling temperature; 0 picks the most likely token (greedy).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Sample among the K most likely tokens only (at most 1024); 0 keeps the 1024 most likely.
    #[arg(long, default_value_t = 0, value_name = "K")]
    pub top_k: usize,
    /// Sample among the most likely tokens whose probabilities reach P; 1 keeps all.
    #[arg(long, default_value_t = 1.0, value_name = "P")]
    pub top_p: f32,
    /// Drop tokens less likely than P times the most likely one; 0 keeps all.
    #[arg(long, default_value_t = 0.0, value_name = "P")]
    pub min_p: f32,
    /// Divide positive (multiply negative) logits of tokens already in the prompt or reply by R; 1 is off.
    #[arg(long, default_value_t = 1.0, value_name = "R")]
    pub repetition_penalty: f32,
    /// The sampler's seed: the same seed gives the same tokens.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// [`GenArgs`], checked, with the checkpoint's end-of-sequence ids.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The sampler.
    pub sampler: Sampler,
    /// `--stop` strings.
    pub stops: Vec<String>,
    /// The checkpoint's end-of-sequence ids (none without a tokenizer).
    pub eos: Vec<i64>,
    /// `--max-new-tokens`.
    pub max_new_tokens: Option<u64>,
    /// `--max-new-tokens` as decode steps (the first token comes from prefill).
    pub steps: Option<usize>,
}

impl GenArgs {
    /// Checks the options for `program`; `text`: whether a tokenizer reads the reply (the end-of-sequence
    /// ids of the `generation_config.json` beside `program` then apply).
    ///
    /// # Errors
    /// A sampling parameter out of its range; `--stop` without a tokenizer; a bad `generation_config.json`.
    pub fn settings(self, program: &Path, text: bool) -> Result<Settings, TextError> {
        let params = Params {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            seed: self.seed,
        };
        let sampler = Sampler::new(params).map_err(|err| TextError::invalid(err.to_string()))?;
        if !self.stops.is_empty() && !text {
            return Err(TextError::invalid(
                "--stop ends the reply at a text, but there is no tokenizer (--tokenizer, or a tokenizer.json beside the program)",
            ));
        }
        let eos = if text { crate::eos_ids(program)? } else { Vec::new() };
        let steps = self.max_new_tokens.map(|n| usize::try_from(n - 1).unwrap_or(usize::MAX));
        Ok(Settings { sampler, stops: self.stops, eos, max_new_tokens: self.max_new_tokens, steps })
    }
}

impl Settings {
    /// Whether a run needs a host loop that picks tokens: a text reply (`text`), a sampler other than the
    /// argmax, or stop strings.
    pub fn wanted(&self, text: bool) -> bool {
        text || !self.sampler.is_plain_greedy() || !self.stops.is_empty()
    }

    /// The stop rules: the end-of-sequence ids, `--stop` and `--max-new-tokens`.
    pub fn stop_rules(&self) -> StopRules {
        StopRules { eos: self.eos.clone(), stops: self.stops.clone(), max_new_tokens: self.max_new_tokens }
    }
}
