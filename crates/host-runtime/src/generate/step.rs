//! One step of a generation: the method calls it makes, run to completion, the token read back, and the
//! record of the step ([`Step`]).

use program_manifest::Generate;

use super::logits::widen_last_row;
use super::protocol::Call;
use crate::program::{CopyStats, Error, Program, RunStats};

/// One method run of a generation.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Step {
    /// 0 for prefill, then 1, 2, ... for decode steps.
    pub index: usize,
    /// The method that ran (for prefill, the last of the prompt's calls: its outputs hold the token).
    pub method: String,
    /// Method calls the step made: for prefill, the prompt's chunks through the prefill method and the tokens
    /// short of a chunk through the decode method, one a call ([`super::protocol`]); 1 for a decode step.
    pub calls: usize,
    /// Position of the first token this step processed.
    pub position: i64,
    /// Tokens fed in.
    pub input_tokens: Vec<i64>,
    /// Argmax of the last logits row: the generated token.
    pub token: i64,
    /// Host time of the step, in microseconds: the method's run, to completion, on the host loop; queuing it
    /// and its feedback (or the graph replay) on the device loop.
    pub micros: f64,
    /// GPU time of the step, in microseconds, when timed ([`super::Options::gpu_timing`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_micros: Option<f64>,
    /// Bytes copied, by kind.
    pub copies: CopyStats,
}

/// `values` as the little-endian bytes of an `i64` input.
pub(super) fn i64_bytes(values: &[i64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Runs `calls` in order, each to completion: the method of the last (whose outputs hold the next token) and
/// what the runs cost together.
///
/// # Errors
/// [`Error::Generation`] when `calls` is empty; the errors of the runs.
pub(super) fn run_calls<'g>(
    program: &mut Program,
    g: &Generate,
    calls: &[Call<'g>],
) -> Result<(&'g str, RunStats), Error> {
    let mut stats = RunStats::default();
    for call in calls {
        program.write_input(call.method, &g.token_input, &i64_bytes(call.tokens))?;
        program.write_input(call.method, &g.position_input, &i64_bytes(&[call.position]))?;
        let run = program.execute(call.method)?;
        stats.elapsed += run.elapsed;
        stats.copies.add(run.copies);
    }
    let last =
        calls.last().ok_or_else(|| Error::Generation("the prompt is empty: nothing to feed".into()))?;
    Ok((last.method, stats))
}

/// The token `method`'s run left: its `next_token_output` when the program has one, else the argmax of the
/// last logits row.
pub(super) fn read_token(program: &Program, g: &Generate, method: &str) -> Result<i64, Error> {
    if let Some(next) = &g.next_token_output {
        let bytes = program.read_output(method, next)?;
        let bytes: [u8; 8] = bytes
            .get(..8)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| Error::Generation(format!("output '{next}' of method '{method}' holds no i64")))?;
        return Ok(i64::from_le_bytes(bytes));
    }
    Ok(ref_graph::argmax(&logits_row(program, g, method)?) as i64)
}

/// The last row of `method`'s logits, widened to f32.
pub(super) fn logits_row(program: &Program, g: &Generate, method: &str) -> Result<Vec<f32>, Error> {
    let decl = program.manifest().methods[method]
        .outputs
        .iter()
        .find(|d| d.name == g.logits_output)
        .expect("manifest checked the logits output");
    let vocab = decl.shape.last().copied().unwrap_or(1) as usize;
    let bytes = program.read_output(method, &g.logits_output)?;
    Ok(widen_last_row(&bytes, decl.dtype, vocab))
}
