//! The device loop: every method queued on the program's stream, and a one-thread feedback kernel after each
//! that hands the next token and position to the decode method's inputs and appends the token to a device
//! history, read back once at the end (see the module docs of [`crate::generate`]). With a sampler, the
//! sampler kernel draws each token from the logits on the device first ([`super::sample`]); when streaming,
//! the feedback kernel also publishes each token in pinned memory the host polls ([`super::stream`]).

use std::time::Instant;

use program_manifest::Generate;
use sampling::Sampler;

use super::protocol::{prompt_calls, reserve};
use super::sample::{DeviceSampler, LogitsRow};
use super::statistics::Timing;
use super::step::{i64_bytes, logits_row, read_token};
use super::stream::{Pacer, StreamStats};
use super::{Generation, Options, Step};
use crate::buffer::{AllocError, Storage};
use crate::cuda::{Context, Contexts, DevicePtr, Error as CudaError, FeedbackArgs, FeedbackKernel, Mailbox};
use crate::program::{Captured, CopyStats, Error, Program, RunStats};

/// The device-side state of a generation loop: the feedback kernel and the token history it appends to, the
/// sampler when tokens are drawn, the mailbox when they stream.
pub(crate) struct DeviceLoop {
    /// The program whose stream and device it was made for ([`Program::id`]).
    program: u64,
    kernel: FeedbackKernel,
    /// `capacity` `i64` tokens, and its address.
    history: (Storage, DevicePtr),
    /// The `u32` count of tokens appended (past `capacity` too), and its address.
    length: (Storage, DevicePtr),
    capacity: u32,
    sampler: Option<DeviceSampler>,
    mailbox: Option<Mailbox>,
}

impl DeviceLoop {
    /// The feedback kernel (compiled once per process per device) and a token history of `capacity` tokens,
    /// zeroed, on the program's device; a mailbox of as many tokens when `streaming`.
    ///
    /// # Errors
    /// [`Error::NoStream`] for a program without CUDA memory, [`Error::Stream`] when the kernel cannot be
    /// loaded, [`Error::LoopMemory`] when the history or the mailbox cannot be allocated.
    pub(crate) fn new(
        program: &Program,
        capacity: u32,
        sampler: Option<DeviceSampler>,
        streaming: bool,
    ) -> Result<DeviceLoop, Error> {
        let (mut device, kernel) = OnDevice::with_kernel(program, Purpose::Loop, FeedbackKernel::new)?;
        let history = device.zeroed("token history", capacity as usize * 8)?;
        let length = device.zeroed("token count", 4)?;
        let mailbox = match streaming {
            true => Some(Mailbox::new(device.ctx, capacity).map_err(|source| Error::LoopMemory {
                what: "token mailbox",
                source: AllocError::Cuda(source),
            })?),
            false => None,
        };
        Ok(DeviceLoop { program: program.id(), kernel, history, length, capacity, sampler, mailbox })
    }

    /// The tokens the feedback kernel appended (one synchronous read of each: the loop's only host
    /// synchronisations besides the stream's).
    pub(crate) fn tokens(&self) -> Result<Vec<i64>, Error> {
        let access = |source| Error::Stream { action: "reading the token history of", source };
        let length = self.length.0.read().map_err(access)?;
        let length = u32::from_le_bytes([length[0], length[1], length[2], length[3]]).min(self.capacity);
        let history = self.history.0.read().map_err(access)?;
        Ok(history
            .chunks_exact(8)
            .take(length as usize)
            .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect())
    }

    /// The mailbox, when the loop streams.
    pub(super) fn mailbox(&self) -> Option<&Mailbox> {
        self.mailbox.as_ref()
    }

    /// Queues the clock kernel (the mailbox's calibration) on the program's stream.
    pub(super) fn queue_clock(&self, program: &Program, mailbox: &Mailbox) -> Result<(), Error> {
        program.queue_on_stream("streaming on the device", "launching the clock kernel on", |stream| {
            self.kernel.launch_clock(stream, mailbox)
        })
    }

    /// Queues the hand-over for `link` on the program's stream: the sampler kernel's draw from the link's
    /// logits when the loop samples, then the feedback kernel.
    ///
    /// # Errors
    /// [`Error::Usage`] when the link or this loop was made for another program, or the loop samples and the
    /// link has no logits; [`Error::Stream`] when a launch fails.
    pub(crate) fn feedback(&self, program: &Program, link: &FeedbackLink) -> Result<(), Error> {
        if link.program != program.id() || self.program != program.id() {
            return Err(Error::Usage("the device loop was prepared for another program".into()));
        }
        let next_token = match (&self.sampler, &link.logits) {
            (Some(sampler), Some(row)) => {
                sampler.queue(program, row)?;
                sampler.token_ptr()
            }
            (Some(_), None) => {
                return Err(Error::Usage("the device loop samples, but the link reads no logits".into()))
            }
            (None, _) => link.next_token,
        };
        let args = FeedbackArgs {
            next_token,
            position_from: link.position_from,
            rows: link.rows,
            token_to: link.token_to,
            position_to: link.position_to,
            history: self.history.1,
            length: self.length.1,
            capacity: self.capacity,
            mailbox: self.mailbox.as_ref().map_or(0, Mailbox::device_ptr),
        };
        program.queue_on_stream("generating on the device", "launching the feedback kernel on", |stream| {
            self.kernel.launch(stream, args)
        })
    }
}

/// The generation loop's device-side feedback between one method's run and the decode method's next one:
/// the device addresses the token and position come from and go to, resolved once (a program's storages
/// keep their addresses for its life), and the row of logits a sampler draws from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FeedbackLink {
    /// The program whose storages the addresses are ([`Program::id`]).
    program: u64,
    /// The `from` method's next-token output.
    next_token: DevicePtr,
    /// The `from` method's position input.
    position_from: DevicePtr,
    /// The rows `from` processed: the next position is `position_from + rows`.
    rows: i64,
    /// The `to` method's token input.
    token_to: DevicePtr,
    /// The `to` method's position input.
    position_to: DevicePtr,
    /// The last row of the `from` method's logits, when a sampler draws the token.
    logits: Option<LogitsRow>,
}

impl FeedbackLink {
    /// Links `from`'s next-token output and position input to `to`'s token and position inputs.
    ///
    /// # Errors
    /// [`Error::Usage`] for an unknown method, input or output; [`Error::Memory`] when one of the four is not
    /// device or managed memory.
    pub(crate) fn new(
        program: &Program,
        (from, next_token): (&str, &str),
        rows: i64,
        to: &str,
        (token_input, position_input): (&str, &str),
    ) -> Result<FeedbackLink, Error> {
        Ok(FeedbackLink {
            program: program.id(),
            next_token: program.output_ptr(from, next_token)?,
            position_from: program.input_ptr(from, position_input)?,
            rows,
            token_to: program.input_ptr(to, token_input)?,
            position_to: program.input_ptr(to, position_input)?,
            logits: None,
        })
    }

    /// The link, with `from`'s logits read by a sampler ([`LogitsRow::of`]'s errors).
    fn sampling(mut self, program: &Program, g: &Generate, from: &str) -> Result<FeedbackLink, Error> {
        self.logits = Some(LogitsRow::of(program, g, from)?);
        Ok(self)
    }
}

/// What the decode steps of a device loop left: each step's host time and copies, the graph when one was
/// captured, the host synchronisations they cost.
struct DecodeRun {
    step_host: Vec<f64>,
    step_copies: Vec<CopyStats>,
    captured: Option<Captured>,
    capture_micros: Option<f64>,
    host_syncs: u64,
}

/// What the device loop does besides feeding back the program's argmax: draw tokens with a sampler (not
/// plain greedy), stream them to a callback.
pub(super) struct Extras<'a> {
    pub sampler: Option<&'a Sampler>,
    pub pacer: Option<Pacer<'a>>,
}

/// Runs the device loop: the generation, and what streaming measured when it streamed.
pub(super) fn device_loop(
    program: &mut Program,
    g: &Generate,
    options: &Options,
    extras: Extras<'_>,
) -> Result<(Generation, Option<StreamStats>), Error> {
    let Extras { sampler, mut pacer } = extras;
    let next = g.next_token_output.as_deref().expect("the device loop needs a next-token output");
    let steps = options.steps;
    let capacity = steps
        .checked_add(1)
        .and_then(|tokens| u32::try_from(tokens).ok())
        .ok_or_else(|| Error::Usage(format!("{steps} decode steps are more than the device loop counts")))?;
    let inputs = (g.token_input.as_str(), g.position_input.as_str());
    let rows = i64::from(!options.hold_position);
    let mut decode_link = FeedbackLink::new(program, (&g.decode, next), rows, &g.decode, inputs)?;
    let device_sampler = match sampler {
        Some(sampler) => {
            decode_link = decode_link.sampling(program, g, &g.decode)?;
            let vocab = decode_link.logits.map_or(0, |row| row.vocab());
            Some(DeviceSampler::new(program, sampler, vocab, &g.prompt)?)
        }
        None => None,
    };
    let mut device = DeviceLoop::new(program, capacity, device_sampler, pacer.is_some())?;
    let timing = Timing::new(program, options)?;

    let prefilled = prefill(program, g, options, &mut device, sampler)?;
    if let (Some(pacer), Some(mailbox)) = (pacer.as_mut(), device.mailbox()) {
        pacer.start(program, &device, mailbox, prefilled.token_on_host)?;
    }
    let decode = decode_steps(program, g, options, (&device, &decode_link), timing.as_ref(), pacer.as_mut())?;
    let queued = decode.step_host.len();
    if let (Some(pacer), Some(mailbox)) = (pacer.as_mut(), device.mailbox()) {
        pacer.drain(mailbox, queued + 1)?;
    }

    let readback_before = cuda_rt::stats::thread_host_syncs();
    program.synchronize()?;
    let history = device.tokens()?;
    let readback_host_syncs = cuda_rt::stats::thread_host_syncs() - readback_before;
    let gpu_micros = match &timing {
        Some(timing) => timing.step_micros(queued)?,
        None => Vec::new(),
    };
    let mut tokens: Vec<i64> = prefilled.token_on_host.into_iter().chain(history).collect();
    if tokens.len() != queued + 1 {
        return Err(Error::LostFeedback { tokens: tokens.len(), steps: queued + 1 });
    }
    let stream = pacer.map(|pacer| pacer.finish(sampler.is_some()));
    if let Some(stream) = &stream {
        // The tokens past the one that stopped the stream were made but are not the generation's.
        tokens.truncate(stream.tokens.max(1));
    }
    let decoded = tokens.len() - 1;
    let mut generation = Generation {
        tokens: tokens.clone(),
        steps: Vec::with_capacity(reserve(g, decoded) + 1),
        device_loop: true,
        cuda_graph: decode.captured.is_some(),
        capture_micros: decode.capture_micros,
        host_syncs: decode.host_syncs,
        readback_host_syncs,
    };
    generation.steps.push(Step {
        index: 0,
        method: prefilled.method,
        calls: prefilled.calls,
        position: 0,
        input_tokens: g.prompt.clone(),
        token: tokens[0],
        micros: prefilled.micros,
        gpu_micros: None,
        copies: prefilled.stats.copies,
    });
    let first_decode = options.start_position.unwrap_or(g.prompt.len() as i64);
    for step in 1..=decoded {
        generation.steps.push(Step {
            index: step,
            method: g.decode.clone(),
            calls: 1,
            position: if options.hold_position { first_decode } else { first_decode + step as i64 - 1 },
            input_tokens: vec![tokens[step - 1]],
            token: tokens[step],
            micros: decode.step_host[step - 1],
            gpu_micros: gpu_micros.get(step - 1).copied(),
            copies: decode.step_copies[step - 1],
        });
    }
    Ok((generation, stream))
}

/// What prefill left: its token when it went through the host, the runs' cost and host microseconds, the method
/// of the last call (whose outputs hold the token) and how many calls fed the prompt.
struct Prefilled {
    token_on_host: Option<i64>,
    stats: RunStats,
    micros: f64,
    method: String,
    calls: usize,
}

/// Prefill: the prompt's calls ([`prompt_calls`]) with their inputs from the host, then the last call's token
/// (drawn by the sampler when there is one) and position handed to decode on the device where its outputs
/// live there, else through the host (once, before the decode steps). Everything it queued is complete when
/// it returns.
fn prefill(
    program: &mut Program,
    g: &Generate,
    options: &Options,
    device: &mut DeviceLoop,
    sampler: Option<&Sampler>,
) -> Result<Prefilled, Error> {
    let next = g.next_token_output.as_deref().expect("the device loop needs a next-token output");
    let prompt_len = g.prompt.len() as i64;
    let inputs = (g.token_input.as_str(), g.position_input.as_str());
    let calls = prompt_calls(program, g)?;
    let last =
        *calls.last().ok_or_else(|| Error::Generation("the prompt is empty: nothing to feed".into()))?;
    // Decode's position follows the last call's: its position input plus its rows.
    let link = FeedbackLink::new(program, (last.method, next), last.tokens.len() as i64, &g.decode, inputs)
        .and_then(|link| match sampler {
            Some(_) => link.sampling(program, g, last.method),
            None => Ok(link),
        })
        .ok();
    let start = Instant::now();
    let mut stats = RunStats::default();
    for (i, call) in calls.iter().enumerate() {
        if i > 0 {
            // The previous call may still be reading its inputs on the stream.
            program.synchronize()?;
        }
        program.write_input(call.method, &g.token_input, &i64_bytes(call.tokens))?;
        program.write_input(call.method, &g.position_input, &i64_bytes(&[call.position]))?;
        let run = program.enqueue(call.method)?;
        stats.elapsed += run.elapsed;
        stats.copies.add(run.copies);
    }
    let token_on_host = match &link {
        Some(link) => {
            device.feedback(program, link)?;
            None
        }
        None => {
            let token = match (sampler, device.sampler.as_mut()) {
                (Some(sampler), Some(state)) => {
                    let token = sampler.pick(&logits_row(program, g, last.method)?, &g.prompt, 0) as i64;
                    state.drawn_on_host(token)?;
                    token
                }
                _ => read_token(program, g, last.method)?,
            };
            program.write_input(&g.decode, &g.token_input, &i64_bytes(&[token]))?;
            program.write_input(&g.decode, &g.position_input, &i64_bytes(&[prompt_len]))?;
            Some(token)
        }
    };
    if let Some(position) = options.start_position {
        program.write_input(&g.decode, &g.position_input, &i64_bytes(&[position]))?;
    }
    let micros = start.elapsed().as_secs_f64() * 1e6;
    // Everything before the decode steps is complete before they are counted.
    program.synchronize()?;
    Ok(Prefilled { token_on_host, stats, micros, method: last.method.to_owned(), calls: calls.len() })
}

/// The decode steps, each queued with its feedback: the first eagerly (delegates finish any lazy set-up
/// outside the capture); with a graph, the second is captured, and every later one replays it. A `pacer`
/// (streaming) hands on the tokens that have landed before each step and may hold the step back (the GPU
/// runs at most a window ahead of the host) or end the steps (the caller stopped).
fn decode_steps(
    program: &mut Program,
    g: &Generate,
    options: &Options,
    (device, link): (&DeviceLoop, &FeedbackLink),
    timing: Option<&Timing>,
    mut pacer: Option<&mut Pacer<'_>>,
) -> Result<DecodeRun, Error> {
    let decode = program.method_id(&g.decode)?;
    let mut run = DecodeRun {
        step_host: Vec::with_capacity(reserve(g, options.steps)),
        step_copies: Vec::with_capacity(reserve(g, options.steps)),
        captured: None,
        capture_micros: None,
        host_syncs: 0,
    };
    let syncs_before = cuda_rt::stats::thread_host_syncs();
    for step in 1..=options.steps {
        if let (Some(pacer), Some(mailbox)) = (pacer.as_deref_mut(), device.mailbox()) {
            if !pacer.before_step(mailbox, step)? {
                break;
            }
        }
        if options.cuda_graph && step == 2 && run.captured.is_none() {
            let start = Instant::now();
            let feedback = |program: &Program| device.feedback(program, link);
            run.captured = Some(program.capture_with(decode, Some(&feedback))?);
            run.capture_micros = Some(start.elapsed().as_secs_f64() * 1e6);
        }
        if let Some(timing) = timing {
            timing.mark(program, step, false)?;
        }
        let start = Instant::now();
        let copies = match &run.captured {
            Some(captured) => program.replay(captured)?,
            None => {
                let stats = program.enqueue_id(decode)?;
                device.feedback(program, link)?;
                stats.copies
            }
        };
        run.step_host.push(start.elapsed().as_secs_f64() * 1e6);
        run.step_copies.push(copies);
        if let Some(timing) = timing {
            timing.mark(program, step, true)?;
        }
        if let Some(pacer) = pacer.as_deref_mut() {
            pacer.queued(program)?;
        }
    }
    run.host_syncs = cuda_rt::stats::thread_host_syncs() - syncs_before;
    Ok(run)
}

/// Which device-side state an [`OnDevice`] makes: what its errors call the work and its preparation.
#[derive(Debug, Clone, Copy)]
pub(super) enum Purpose {
    /// The device loop ([`DeviceLoop`]).
    Loop,
    /// The device sampler ([`DeviceSampler`]).
    Sampler,
}

impl Purpose {
    /// The work, for [`Error::NoStream`].
    fn work(self) -> &'static str {
        match self {
            Purpose::Loop => "generating on the device",
            Purpose::Sampler => "sampling on the device",
        }
    }

    /// The kernel's preparation, for [`Error::Stream`].
    fn preparing(self) -> &'static str {
        match self {
            Purpose::Loop => "preparing the device loop for",
            Purpose::Sampler => "preparing the device sampler for",
        }
    }
}

/// Where a device-side state is made: the program's CUDA context, and the contexts its zeroed buffers are
/// allocated through.
pub(super) struct OnDevice<'p> {
    /// The program's CUDA context.
    pub(super) ctx: &'p Context,
    contexts: Contexts,
}

impl<'p> OnDevice<'p> {
    /// The program's CUDA context and the kernel `load` prepares in it for `purpose`.
    ///
    /// # Errors
    /// [`Error::NoStream`] for a program without CUDA memory, [`Error::Stream`] when `load` fails.
    pub(super) fn with_kernel<K>(
        program: &'p Program,
        purpose: Purpose,
        load: impl FnOnce(&Context) -> Result<K, CudaError>,
    ) -> Result<(OnDevice<'p>, K), Error> {
        let ctx = program.cuda_context().ok_or(Error::NoStream { what: purpose.work() })?;
        let kernel = load(ctx).map_err(|source| Error::Stream { action: purpose.preparing(), source })?;
        Ok((OnDevice { ctx, contexts: Contexts::new() }, kernel))
    }

    /// `bytes` of zeroed device memory for the state `what`, and its address.
    ///
    /// # Errors
    /// [`Error::LoopMemory`] when it cannot be allocated, [`Error::FeedbackAddress`] when it has no device
    /// address.
    pub(super) fn zeroed(&mut self, what: &'static str, bytes: usize) -> Result<(Storage, DevicePtr), Error> {
        let storage =
            Storage::zeroed(delegate_abi::MemoryKind::Device, self.ctx.ordinal(), bytes, &mut self.contexts)
                .map_err(|source: AllocError| Error::LoopMemory { what, source })?;
        let address = storage.device_ptr().ok_or(Error::FeedbackAddress { what })?;
        Ok((storage, address))
    }
}
