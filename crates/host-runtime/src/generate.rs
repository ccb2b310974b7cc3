//! Token generation: prefill once over the prompt, then decode steps that feed back the argmax token.

use std::time::Duration;

use program_manifest::Generate;

use crate::program::{CopyStats, Error, Program};

/// One method run of a generation.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Step {
    /// 0 for prefill, then 1, 2, ... for decode steps.
    pub index: usize,
    /// The method that ran.
    pub method: String,
    /// Position of the first token this step processed.
    pub position: i64,
    /// Tokens fed in.
    pub input_tokens: Vec<i64>,
    /// Argmax of the last logits row: the generated token.
    pub token: i64,
    /// Wall time of the step, in microseconds.
    pub micros: f64,
    /// Bytes copied, by kind.
    pub copies: CopyStats,
}

/// A whole generation.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Generation {
    /// Generated tokens, one per step (prefill's included).
    pub tokens: Vec<i64>,
    /// Every step.
    pub steps: Vec<Step>,
}

impl Generation {
    /// Mean wall time of the decode steps.
    pub fn mean_decode_time(&self) -> Duration {
        let decode: Vec<&Step> = self.steps.iter().skip(1).collect();
        if decode.is_empty() {
            return Duration::ZERO;
        }
        Duration::from_secs_f64(decode.iter().map(|s| s.micros).sum::<f64>() / decode.len() as f64 / 1e6)
    }

    /// Mean bytes copied per decode step.
    pub fn mean_decode_copies(&self) -> CopyStats {
        let decode: Vec<&Step> = self.steps.iter().skip(1).collect();
        let n = decode.len().max(1) as u64;
        let sum = decode.iter().fold(CopyStats::default(), |mut acc, s| {
            acc.reflect_bytes += s.copies.reflect_bytes;
            acc.staged_bytes += s.copies.staged_bytes;
            acc.writeback_bytes += s.copies.writeback_bytes;
            acc
        });
        CopyStats {
            reflect_bytes: sum.reflect_bytes / n,
            staged_bytes: sum.staged_bytes / n,
            writeback_bytes: sum.writeback_bytes / n,
        }
    }
}

/// Index of the largest value (the first of equals); NaN never wins.
pub fn argmax(values: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] || values[best].is_nan() {
            best = i;
        }
    }
    best
}

fn write_i64s(bytes: &mut [u8], values: &[i64]) -> Result<(), Error> {
    if bytes.len() != values.len() * 8 {
        return Err(Error::Usage(format!(
            "expected {} bytes of i64, the input holds {}",
            values.len() * 8,
            bytes.len()
        )));
    }
    for (chunk, v) in bytes.chunks_exact_mut(8).zip(values) {
        chunk.copy_from_slice(&v.to_le_bytes());
    }
    Ok(())
}

/// Reads f32 logits; the last row of `[T, vocab]`.
pub fn last_row(bytes: &[u8], vocab: usize) -> Vec<f32> {
    let values = bytes.len() / 4;
    let row = &bytes[values.saturating_sub(vocab) * 4..values * 4];
    row.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// Runs prefill over the prompt, then `steps` decode steps, calling `observe` after every step with the
/// program (to read logits and buffers).
pub fn generate(
    program: &mut Program,
    steps: usize,
    mut observe: impl FnMut(&Step, &Program) -> Result<(), Error>,
) -> Result<Generation, Error> {
    let g: Generate = program.manifest().generate.clone().ok_or_else(|| {
        Error::Usage("the program has no [generate] section, so `run` cannot drive it".into())
    })?;
    if let Some(max) = g.max_decode_steps() {
        if steps > max {
            return Err(Error::Usage(format!(
                "{steps} decode steps do not fit: the caches hold {} positions and the prompt takes {}, so at most {max} decode steps",
                g.max_positions.unwrap_or_default(),
                g.prompt.len()
            )));
        }
    }
    let vocab = {
        let decode = &program.manifest().methods[&g.decode];
        let logits = decode.outputs.iter().find(|d| d.name == g.logits_output).expect("manifest checked");
        logits.shape.last().copied().unwrap_or(1) as usize
    };
    let mut generation = Generation { tokens: Vec::new(), steps: Vec::new() };
    let mut position = 0i64;
    let mut feed = g.prompt.clone();
    for index in 0..=steps {
        let method = if index == 0 { &g.prefill } else { &g.decode };
        write_i64s(program.input_mut(method, &g.token_input)?, &feed)?;
        write_i64s(program.input_mut(method, &g.position_input)?, &[position])?;
        let stats = program.execute(method)?;
        let token = argmax(&last_row(program.output(method, &g.logits_output)?, vocab)) as i64;
        let step = Step {
            index,
            method: method.clone(),
            position,
            input_tokens: feed.clone(),
            token,
            micros: stats.elapsed.as_secs_f64() * 1e6,
            copies: stats.copies,
        };
        observe(&step, program)?;
        position += feed.len() as i64;
        feed = vec![token];
        generation.tokens.push(token);
        generation.steps.push(step);
    }
    Ok(generation)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_picks_first_largest_and_ignores_nan() {
        assert_eq!(argmax(&[0.5, 2.0, 2.0, -1.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 1.0, 0.5]), 1);
        assert_eq!(argmax(&[3.0]), 0);
    }

    #[test]
    fn last_row_of_logits() {
        let bytes: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(last_row(&bytes, 2), vec![3.0, 4.0]);
    }
}
