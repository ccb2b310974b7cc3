//! Token generation: prefill once over the prompt, then decode steps that feed back the argmax token.
//!
//! Prefill feeds the prompt in chunks of the prefill method's token count, and the tokens short of a chunk one
//! a call through the decode method (a prompt shorter than a chunk goes through decode alone): a program
//! with a chunked prefill method takes any prompt, and leaves the caches as token-by-token prefill would.
//!
//! Two loops, one result:
//! - **the host loop** (any program): each step's token and position are written into the method's inputs
//!   by the host, the method runs to completion, and the host reads the next token back (from the
//!   `next_token_output` when the program has one, else the argmax of the last logits row);
//! - **the device loop**, taken when the program's `[generate]` names a `next_token_output` and the decode
//!   method's token input, position input and next-token output are device or managed memory: after each
//!   method is queued, a one-thread feedback kernel copies the next token into the decode method's token
//!   input, sets its position input to the position just run plus the rows it processed, and appends the
//!   token to a device history, all on the program's stream. Nothing is read back until the end, when the
//!   history is read once: no host synchronisation per decode step (counted: [`Generation::host_syncs`]).
//!   With [`Options::cuda_graph`] the decode step (every delegate call of the method, its device
//!   write-backs and the feedback kernel) is captured once into a CUDA graph and replayed per step.

mod device;
mod host;
mod prompt;
mod resume;

use std::time::Duration;

use blob_format::model::DType;
use program_manifest::Generate;

use crate::cuda;
use crate::program::{CopyStats, Error, Program};
use device::device_loop;
use host::host_loop;
pub use resume::continue_from;

/// How to generate.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Options {
    /// Decode steps after prefill.
    pub steps: usize,
    /// Where decode starts: the position written into the decode method's position input after prefill,
    /// decoding from there with whatever the caches hold (`None`: right after the prompt). Benchmarks use it
    /// to measure a step at a given cache fill.
    pub start_position: Option<i64>,
    /// Capture one decode step into a CUDA graph and replay it (the device loop only).
    pub cuda_graph: bool,
    /// Time each decode step on the GPU with CUDA events (programs with CUDA memory).
    pub gpu_timing: bool,
    /// Decode every step at the start position, overwriting the same cache row (the tokens are then not a
    /// generation): a benchmark's steady state at one cache fill, the way PyTorch's decode anchors measure.
    pub hold_position: bool,
    /// Run the host loop even where the device loop could run (to observe every step's outputs as it
    /// happens).
    pub host_loop: bool,
}

impl Options {
    /// `steps` decode steps, everything else default.
    pub fn steps(steps: usize) -> Options {
        Options { steps, ..Options::default() }
    }
}

/// One method run of a generation.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Step {
    /// 0 for prefill, then 1, 2, ... for decode steps.
    pub index: usize,
    /// The method that ran (for prefill, the last of the prompt's calls: its outputs hold the token).
    pub method: String,
    /// Method calls the step made: for prefill, the prompt's chunks through the prefill method and the tokens
    /// short of a chunk through the decode method, one a call (the module docs); 1 for a decode
    /// step.
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
    /// GPU time of the step, in microseconds, when timed ([`Options::gpu_timing`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_micros: Option<f64>,
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
    /// Whether the device loop ran (no host round trip per step).
    pub device_loop: bool,
    /// Whether decode steps were replays of a CUDA graph.
    pub cuda_graph: bool,
    /// Host time spent capturing the graph, in microseconds (not part of any step).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capture_micros: Option<f64>,
    /// Host synchronisations of the generating thread (`cuda_rt::stats::thread_host_syncs`: the host's and
    /// every embedded delegate's) during the decode steps, the final read-back excluded.
    pub host_syncs: u64,
    /// Host synchronisations of the final read-back of the tokens (the device loop's only ones).
    pub readback_host_syncs: u64,
}

impl Generation {
    fn decode_steps(&self) -> &[Step] {
        self.steps.get(1..).unwrap_or_default()
    }

    /// Mean host time of the decode steps.
    pub fn mean_decode_time(&self) -> Duration {
        let decode = self.decode_steps();
        if decode.is_empty() {
            return Duration::ZERO;
        }
        Duration::from_secs_f64(decode.iter().map(|s| s.micros).sum::<f64>() / decode.len() as f64 / 1e6)
    }

    /// Mean GPU time of the decode steps, in microseconds, when they were timed.
    pub fn mean_decode_gpu_micros(&self) -> Option<f64> {
        let times: Vec<f64> = self.decode_steps().iter().filter_map(|s| s.gpu_micros).collect();
        (!times.is_empty()).then(|| times.iter().sum::<f64>() / times.len() as f64)
    }

    /// Host synchronisations per decode step.
    pub fn host_syncs_per_decode_step(&self) -> f64 {
        self.host_syncs as f64 / self.decode_steps().len().max(1) as f64
    }

    /// Mean bytes copied per decode step.
    pub fn mean_decode_copies(&self) -> CopyStats {
        let decode = self.decode_steps();
        let n = decode.len().max(1) as u64;
        let sum = decode.iter().fold(CopyStats::default(), |mut acc, s| {
            acc.add(s.copies);
            acc
        });
        CopyStats {
            reflect_bytes: sum.reflect_bytes / n,
            staged_bytes: sum.staged_bytes / n,
            writeback_bytes: sum.writeback_bytes / n,
            op_bytes: sum.op_bytes / n,
        }
    }
}

fn i64_bytes(values: &[i64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Reads f32 logits; the last row of `[T, vocab]`.
pub fn last_row(bytes: &[u8], vocab: usize) -> Vec<f32> {
    let values = bytes.len() / 4;
    let row = &bytes[values.saturating_sub(vocab) * 4..values * 4];
    row.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// An IEEE 754 half-precision value, widened.
pub fn f16_to_f32(bits: u16) -> f32 {
    let sign = u32::from(bits >> 15) << 31;
    let exponent = u32::from((bits >> 10) & 0x1f);
    let mantissa = u32::from(bits & 0x3ff);
    let magnitude = match (exponent, mantissa) {
        (0, 0) => 0,
        // Subnormal: mantissa × 2^-24, exact in f32.
        (0, m) => {
            let value = m as f32 * 2f32.powi(-24);
            return if sign != 0 { -value } else { value };
        }
        (0x1f, 0) => 0xff << 23,
        (0x1f, m) => (0xff << 23) | (m << 13),
        (e, m) => ((e + 127 - 15) << 23) | (m << 13),
    };
    f32::from_bits(sign | magnitude)
}

/// Reads f16 logits; the last row of `[T, vocab]`, widened to f32.
pub fn last_row_f16(bytes: &[u8], vocab: usize) -> Vec<f32> {
    let values = bytes.len() / 2;
    let row = &bytes[values.saturating_sub(vocab) * 2..values * 2];
    row.chunks_exact(2).map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]]))).collect()
}

/// Reads bf16 logits; the last row of `[T, vocab]`, widened to f32 (a bf16 is the top half of an f32).
pub fn last_row_bf16(bytes: &[u8], vocab: usize) -> Vec<f32> {
    let values = bytes.len() / 2;
    let row = &bytes[values.saturating_sub(vocab) * 2..values * 2];
    row.chunks_exact(2).map(|c| f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16)).collect()
}

/// Runs prefill over the prompt, then `steps` decode steps, calling `observe` after every step with the
/// program (to read logits and buffers); [`generate_with`] with [`Options::steps`].
pub fn generate(
    program: &mut Program,
    steps: usize,
    observe: impl FnMut(&Step, &Program) -> Result<(), Error>,
) -> Result<Generation, Error> {
    generate_with(program, &Options::steps(steps), observe)
}

/// Whether `memory` is device-addressable (device or managed).
fn on_device(memory: delegate_abi::MemoryKind) -> bool {
    matches!(memory, delegate_abi::MemoryKind::Device | delegate_abi::MemoryKind::Managed)
}

/// Why the device loop cannot run `program`'s generation, or `None` when it can (see the module docs).
///
/// # Errors
/// [`Error::NotAGenerator`] when the program has no `[generate]`.
pub fn device_loop_refusal(program: &Program) -> Result<Option<String>, Error> {
    let g = program.manifest().generate.clone().ok_or(Error::NotAGenerator)?;
    refusal(program, &g)
}

/// How many tokens a method's token input takes per call.
pub(super) fn token_rows(program: &Program, g: &Generate, method: &str) -> Option<usize> {
    let decl = program.manifest().methods.get(method)?.inputs.iter().find(|d| d.name == g.token_input)?;
    usize::try_from(decl.numel()).ok()
}

fn refusal(program: &Program, g: &Generate) -> Result<Option<String>, Error> {
    let Some(next) = &g.next_token_output else {
        return Ok(Some("the program's [generate] names no next_token_output".into()));
    };
    for (role, name, memory) in [
        ("input", &g.token_input, program.input_memory(&g.decode, &g.token_input)?),
        ("input", &g.position_input, program.input_memory(&g.decode, &g.position_input)?),
        ("output", next, program.output_memory(&g.decode, next)?),
    ] {
        if !on_device(memory) {
            return Ok(Some(format!(
                "{role} '{name}' of method '{}' is in {memory} memory, not device or managed memory",
                g.decode
            )));
        }
    }
    Ok(None)
}

/// Runs prefill over the prompt, then `options.steps` decode steps, on the device loop where the program
/// allows it (see the module docs) and on the host loop otherwise.
///
/// `observe` is called once per step with the program: on the host loop right after the step ran (its
/// outputs readable); on the device loop after the last step, once the tokens have been read back (reading
/// every step's outputs as it happens would cost a host synchronisation per step: use
/// [`Options::host_loop`] for that).
///
/// # Errors
/// [`Error::NotAGenerator`] when the program has no `[generate]`, [`Error::Usage`] when the steps (from the
/// start position) do not fit the caches or an `i64` position, before anything runs,
/// [`Error::GraphNeedsDeviceLoop`] when a CUDA graph is asked of a
/// program the device loop cannot run; the errors of the
/// runs themselves, [`Error::TornBuffers`] among them when an earlier failed run left the caches torn (reset
/// them with [`Program::reset`] first: a generation starts at position 0).
pub fn generate_with(
    program: &mut Program,
    options: &Options,
    observe: impl FnMut(&Step, &Program) -> Result<(), Error>,
) -> Result<Generation, Error> {
    let g: Generate = program.manifest().generate.clone().ok_or(Error::NotAGenerator)?;
    let end = decode_end(&g, options)?;
    let refusal = refusal(program, &g)?;
    let generation = match (refusal, options.host_loop) {
        (None, false) => {
            if options.cuda_graph {
                program.require_capturable(&g.decode)?;
            }
            device_loop(program, &g, options, observe)
        }
        (refusal, _) => {
            if options.cuda_graph {
                let why = refusal.unwrap_or_else(|| "the host loop was asked for".into());
                return Err(Error::GraphNeedsDeviceLoop { why });
            }
            host_loop(program, &g, options, |p, method, _| read_token(p, &g, method), go_on(observe))
        }
    }?;
    program.set_position(u64::try_from(end).ok());
    Ok(generation)
}

/// `observe`, going on after every step.
fn go_on(
    mut observe: impl FnMut(&Step, &Program) -> Result<(), Error>,
) -> impl FnMut(&Step, &Program) -> Result<bool, Error> {
    move |step, program| observe(step, program).map(|()| true)
}

/// Runs prefill over the prompt, then up to `options.steps` decode steps on the host loop, where `choose`
/// picks each step's token from the last row of its logits (widened to f32) and the step's index (0 for
/// prefill), in place of the argmax; `observe` sees each step right after it ran and ends the generation by
/// returning `false` (its token is then not fed). A sampler and stop conditions run here (`delegate-host run
/// --temperature`, `--stop`).
///
/// # Errors
/// As [`generate_with`]; [`Error::GraphNeedsDeviceLoop`] when `options.cuda_graph` asks for a graph (the
/// host loop runs no graph).
pub fn generate_choosing(
    program: &mut Program,
    options: &Options,
    mut choose: impl FnMut(&[f32], usize) -> i64,
    observe: impl FnMut(&Step, &Program) -> Result<bool, Error>,
) -> Result<Generation, Error> {
    let g: Generate = program.manifest().generate.clone().ok_or(Error::NotAGenerator)?;
    decode_end(&g, options)?;
    if options.cuda_graph {
        return Err(Error::GraphNeedsDeviceLoop { why: "a chosen token is picked on the host".into() });
    }
    let pick = |p: &Program, method: &str, index: usize| Ok(choose(&logits_row(p, &g, method)?, index));
    let generation = host_loop(program, &g, options, pick, observe)?;
    let ran = Options { steps: generation.steps.len().saturating_sub(1), ..options.clone() };
    program.set_position(decode_end(&g, &ran).ok().and_then(|end| u64::try_from(end).ok()));
    Ok(generation)
}

/// Refuses, as [`generate_with`] would before anything runs, `options` whose decode steps do not fit the
/// program's caches (`max_positions`) or an `i64` position: for a caller that does other work first (a
/// restore) and would otherwise find out after it.
///
/// # Errors
/// [`Error::NotAGenerator`] when the program has no `[generate]`; [`Error::Usage`] naming what does not fit.
pub fn check_fit(program: &Program, options: &Options) -> Result<(), Error> {
    let g = program.manifest().generate.as_ref().ok_or(Error::NotAGenerator)?;
    decode_end(g, options).map(|_| ())
}

/// The position after the rows a generation writes (the prompt's, then one per decode step from the start,
/// or one when held), once checked: decode starts at or after the prompt, and every position fits the
/// caches (`max_positions`) and an `i64` position input. The step count is the caller's, so every
/// conversion of it is checked.
fn decode_end(g: &Generate, options: &Options) -> Result<i64, Error> {
    let steps = options.steps;
    let prompt = i64::try_from(g.prompt.len()).unwrap_or(i64::MAX);
    let start = options.start_position.unwrap_or(prompt);
    let advance = if options.hold_position { Some(1) } else { i64::try_from(steps).ok() };
    let end = advance.and_then(|advance| start.checked_add(advance)).filter(|_| start >= prompt);
    let fits = match g.max_positions {
        Some(max) => end.filter(|&end| u64::try_from(end).is_ok_and(|end| end <= max)),
        None => end,
    };
    match (fits, g.max_positions) {
        (Some(end), _) => Ok(if steps == 0 { prompt } else { end }),
        (None, Some(max)) => Err(Error::Usage(if options.start_position.is_some() {
            format!(
                "{steps} decode steps from position {start} do not fit: the caches hold {max} positions and the prompt takes {prompt}, so decode may start at positions {prompt}..{max} and run until position {}",
                max.saturating_sub(1)
            )
        } else {
            let most = g.max_decode_steps().unwrap_or_default();
            format!(
                "{steps} decode steps do not fit: the caches hold {max} positions and the prompt takes {prompt}, so at most {most} decode steps"
            )
        })),
        (None, None) if start < prompt => Err(Error::Usage(format!(
            "decode cannot start at position {start}, inside the prompt of {prompt} tokens"
        ))),
        (None, None) => Err(Error::Usage(format!(
            "{steps} decode steps from position {start} run past position {}, the last a position input holds",
            i64::MAX
        ))),
    }
}

/// How many steps' records to reserve for `steps` decode steps: at most as many as the caches hold (the
/// count is the caller's, never trusted with an allocation; records past it grow as the steps run).
pub(super) fn reserve(g: &Generate, steps: usize) -> usize {
    steps.min(g.max_positions.and_then(|max| usize::try_from(max).ok()).unwrap_or(0))
}

/// Timed events around each decode step (a start and an end per step, so host work between steps is not
/// counted), when asked for and the program has a stream.
struct Timing {
    events: Vec<(cuda::Event, cuda::Event)>,
}

impl Timing {
    fn new(program: &Program, options: &Options) -> Result<Option<Timing>, Error> {
        let Some(ctx) = program.cuda_context().filter(|_| options.gpu_timing) else {
            return Ok(None);
        };
        let events = (0..options.steps)
            .map(|_| Ok((cuda::Event::timed(ctx)?, cuda::Event::timed(ctx)?)))
            .collect::<Result<Vec<_>, cuda::Error>>()
            .map_err(|source| Error::Stream { action: "creating timing events for", source })?;
        Ok(Some(Timing { events }))
    }

    /// Records the start (`end == false`) or end of decode step `step` (from 1) on the program's stream (no
    /// host synchronisation).
    fn mark(&self, program: &Program, step: usize, end: bool) -> Result<(), Error> {
        let pair = step.checked_sub(1).and_then(|i| self.events.get(i));
        if let (Some((start, stop)), Some(stream)) = (pair, program.cuda_stream()) {
            let event = if end { stop } else { start };
            event
                .record(stream)
                .map_err(|source| Error::Stream { action: "recording an event on", source })?;
        }
        Ok(())
    }

    /// Each step's GPU microseconds, once the stream has passed every mark.
    fn step_micros(&self) -> Result<Vec<f64>, Error> {
        self.events
            .iter()
            .map(|(start, end)| {
                end.elapsed_ms(start)
                    .map(|ms| f64::from(ms) * 1e3)
                    .map_err(|source| Error::Stream { action: "timing", source })
            })
            .collect()
    }
}

fn read_token(program: &Program, g: &Generate, method: &str) -> Result<i64, Error> {
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
fn logits_row(program: &Program, g: &Generate, method: &str) -> Result<Vec<f32>, Error> {
    let decl = program.manifest().methods[method]
        .outputs
        .iter()
        .find(|d| d.name == g.logits_output)
        .expect("manifest checked the logits output");
    let vocab = decl.shape.last().copied().unwrap_or(1) as usize;
    let bytes = program.read_output(method, &g.logits_output)?;
    Ok(widen_last_row(&bytes, decl.dtype, vocab))
}

/// The last row of `[T, vocab]` logits of `dtype`, widened to f32.
fn widen_last_row(bytes: &[u8], dtype: DType, vocab: usize) -> Vec<f32> {
    match dtype {
        DType::F16 => last_row_f16(bytes, vocab),
        DType::BF16 => last_row_bf16(bytes, vocab),
        _ => last_row(bytes, vocab),
    }
}

/// The greedy token of `[T, vocab]` logits: [`ref_graph::argmax`] of the last row (first of equals, NaN never
/// wins), the rule every delegate's `next_token` follows.
#[cfg(test)]
fn logits_token(bytes: &[u8], dtype: DType, vocab: usize) -> i64 {
    ref_graph::argmax(&widen_last_row(bytes, dtype, vocab)) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_logits_token_is_the_first_largest_of_the_last_row_and_never_a_nan() {
        let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        // [2, 3]: the first row is larger everywhere, only the last row counts; its NaN first value never wins.
        let bytes = f32s(&[9.0, 9.0, 9.0, f32::NAN, 1.0, 1.0]);
        assert_eq!(logits_token(&bytes, DType::F32, 3), 1);
        assert_eq!(logits_token(&f32s(&[f32::NAN, f32::NAN]), DType::F32, 2), 1, "all NaN: the last index");
        // f16: NaN (0x7e00), 0.5 (0x3800), 1.0 (0x3c00).
        let f16s: Vec<u8> = [0x7e00u16, 0x3800, 0x3c00].iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(logits_token(&f16s, DType::F16, 3), 2);
    }

    fn generate(max_positions: Option<u64>) -> Generate {
        Generate {
            prefill: "prefill".into(),
            decode: "decode".into(),
            prompt: vec![1, 7, 3, 12],
            token_input: "tokens".into(),
            position_input: "input_pos".into(),
            logits_output: "logits".into(),
            next_token_output: None,
            max_positions,
        }
    }

    fn options(steps: usize, start: Option<i64>, hold: bool) -> Options {
        Options { start_position: start, hold_position: hold, ..Options::steps(steps) }
    }

    #[test]
    fn decode_steps_fit_the_caches_and_an_i64_position_whatever_the_count() {
        let usage = |result: Result<i64, Error>| match result {
            Err(Error::Usage(message)) => message,
            other => panic!("{other:?}"),
        };
        let held = generate(Some(16));
        assert_eq!(decode_end(&held, &options(12, None, false)).ok(), Some(16));
        assert_eq!(decode_end(&held, &options(0, None, false)).ok(), Some(4), "the prompt's rows");
        assert_eq!(decode_end(&held, &options(usize::MAX, Some(15), true)).ok(), Some(16), "held: one row");
        // `usize::MAX as i64` is -1, which once passed the check.
        for steps in [13, 1 << 40, usize::MAX] {
            let message = usage(decode_end(&held, &options(steps, None, false)));
            assert!(message.ends_with("so at most 12 decode steps"), "{message}");
        }
        let message = usage(decode_end(&held, &options(usize::MAX, Some(i64::MAX), false)));
        assert!(message.contains("from position 9223372036854775807 do not fit"), "{message}");
        assert!(
            usage(decode_end(&generate(Some(0)), &options(1, Some(0), false))).ends_with("until position 0")
        );

        let untold = generate(None);
        assert_eq!(decode_end(&untold, &options(1 << 40, None, false)).ok(), Some(4 + (1 << 40)));
        let message = usage(decode_end(&untold, &options(usize::MAX, None, false)));
        assert!(message.contains("run past position 9223372036854775807"), "{message}");
        let message = usage(decode_end(&untold, &options(1, Some(3), false)));
        assert!(message.contains("inside the prompt of 4 tokens"), "{message}");
    }

    #[test]
    fn records_are_reserved_for_no_more_steps_than_the_caches_hold() {
        assert_eq!(reserve(&generate(Some(16)), usize::MAX), 16);
        assert_eq!(reserve(&generate(Some(16)), 3), 3);
        assert_eq!(reserve(&generate(None), 1 << 40), 0);
    }

    #[test]
    fn last_row_of_logits() {
        let bytes: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(last_row(&bytes, 2), vec![3.0, 4.0]);
    }

    #[test]
    fn half_precision_widens_exactly() {
        for (bits, value) in [
            (0x0000u16, 0.0f32),
            (0x3c00, 1.0),
            (0xc000, -2.0),
            (0x3555, 0.333_251_95),
            (0x7bff, 65504.0),
            (0x0001, 2f32.powi(-24)),
            (0x8001, -(2f32.powi(-24))),
            (0x03ff, 1023.0 * 2f32.powi(-24)),
        ] {
            assert_eq!(f16_to_f32(bits), value, "{bits:#06x}");
        }
        assert_eq!(f16_to_f32(0x7c00), f32::INFINITY);
        assert_eq!(f16_to_f32(0xfc00), f32::NEG_INFINITY);
        assert!(f16_to_f32(0x7e00).is_nan());
        assert!(f16_to_f32(0x8000).is_sign_negative() && f16_to_f32(0x8000) == 0.0);
        let bytes: Vec<u8> = [0x3c00u16, 0x4000, 0x4200].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(last_row_f16(&bytes, 2), vec![2.0, 3.0]);
    }
}
