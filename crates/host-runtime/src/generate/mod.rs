//! Token generation: prefill once over the prompt, then decode steps that feed back the argmax token.
//!
//! Prefill feeds the prompt in chunks of the prefill method's token count, and the tokens short of a chunk one
//! a call through the decode method (a prompt shorter than a chunk goes through decode alone): a program
//! with a chunked prefill method takes any prompt, and leaves the caches as token-by-token prefill would.
//! That plan is [`protocol`]'s, the one every runtime follows (the bridge's `et-run` too).
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
//!
//! [`generate_streaming`] draws the tokens with a [`sampling::Sampler`] and hands each to the caller as it is
//! made. On the device loop a sampler kernel draws each token from the logits on the device before the
//! feedback kernel hands it on (the same arithmetic as the host's sampler, its state in device memory, so a
//! graph captures it), and the feedback kernel publishes each token in pinned memory the host polls: still
//! no host synchronisation per step.
//!
//! One concern a file: `protocol` the calls that feed a prompt and the positions a generation reaches,
//! `step` one step's calls run and its token read back, `host`, `device` and `resume` the loops, `sample`
//! the device loop's sampler state, `stream` streaming and its lag, `statistics` what a generation measured,
//! `logits` the logits read as f32.

mod device;
mod host;
mod logits;
pub mod protocol;
mod resume;
mod sample;
mod statistics;
mod step;
mod stream;

use program_manifest::Generate;

use crate::program::{Error, Program};
use device::device_loop;
use host::host_loop;
pub use logits::{f16_to_f32, last_row, last_row_bf16, last_row_f16};
use protocol::decode_end;
pub use resume::continue_from;
pub use statistics::Generation;
pub use step::Step;
use step::{logits_row, read_token};
pub use stream::{generate_streaming, StreamStats, StreamedGeneration, StreamedToken, AHEAD};

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
            device_loop(program, &g, options, device::Extras { sampler: None, pacer: None })
                .and_then(|(generation, _)| observed(generation, program, observe))
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

/// Calls `observe` with every step of a device loop's `generation`, once its tokens have been read back.
fn observed(
    generation: Generation,
    program: &Program,
    mut observe: impl FnMut(&Step, &Program) -> Result<(), Error>,
) -> Result<Generation, Error> {
    for step in &generation.steps {
        observe(step, program)?;
    }
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

/// The decode steps to run: `steps` when given, else as many as the program's caches hold from `position`
/// (right after the prompt when `None`), else (a program that is not a generator) 15.
///
/// The caches hold `[generate] max_positions` (a `.pte`'s `max_seq_len` compile spec); a program that does
/// not say was given, at load, the positions its buffers' shapes tell (`Manifest::positions_from_buffers`:
/// the second to last dimension every buffer of two or more has), so the default never runs past a cache.
pub fn default_steps(program: &Program, steps: Option<usize>, position: Option<i64>) -> usize {
    steps
        .or_else(|| {
            let g = program.manifest().generate.as_ref()?;
            let max = g.max_positions?;
            let from = position.unwrap_or_else(|| i64::try_from(g.prompt.len()).unwrap_or(i64::MAX));
            Some(usize::try_from(i64::try_from(max).unwrap_or(i64::MAX).saturating_sub(from)).unwrap_or(0))
        })
        .unwrap_or(15)
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
