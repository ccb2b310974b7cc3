//! Streaming: each token handed to the caller as it is made, the sampler's pick where the caller asked for
//! one ([`generate_streaming`]).
//!
//! On the device loop the feedback kernel publishes every token in pinned host memory (the mailbox: the
//! token, the device's clock, then a count), and the host polls it between queuing steps: no host
//! synchronisation per step, the GPU running up to [`AHEAD`] tokens ahead of the caller. A caller that stops
//! (an end-of-sequence id, a stop string) ends the queuing; the steps already queued still run, and their
//! tokens are not the generation's. What streaming measured ([`StreamStats`]) is the lag: how many tokens
//! the device had published past each one when the caller was done with it, and how long after the device
//! wrote it (the device's `%globaltimer` mapped onto the host's clock by one calibration launch before the
//! decode steps).
//!
//! On the host loop (any program the device loop cannot run, or [`Options::host_loop`]) each step runs to
//! completion, the sampler picks from its logits on the host, and the caller gets the token at once.

use std::time::{Duration, Instant};

use program_manifest::Generate;
use sampling::Sampler;

use super::device::{device_loop, DeviceLoop, Extras};
use super::host::host_loop;
use super::protocol::decode_end;
use super::step::{logits_row, read_token};
use super::{refusal, Generation, Options};
use crate::cuda::{Event, Mailbox};
use crate::program::{Error, Program};

/// The most tokens the device loop runs ahead of the tokens handed to the caller.
pub const AHEAD: usize = 16;

/// How long the host polls without a new token before it asks whether the queued work is done (and so the
/// tokens lost).
const QUIET: Duration = Duration::from_micros(200);

/// How long the clock calibration waits for the device's clock reading.
const CLOCK_WAIT: Duration = Duration::from_secs(1);

/// A token as it reaches the caller of [`generate_streaming`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct StreamedToken {
    /// Its index in the generation: 0 for prefill's token, then one per decode step.
    pub index: usize,
    /// The token.
    pub token: i64,
    /// How many later tokens the device had already published when this one was handed on (0 on the host
    /// loop).
    pub lag_tokens: u64,
}

/// What streaming measured.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct StreamStats {
    /// Tokens handed to the caller (the one that stopped the generation included).
    pub tokens: usize,
    /// Whether tokens reached the host through the device loop's mailbox (else the host loop's steps).
    pub device_loop: bool,
    /// Whether the device loop's sampler kernel drew the tokens (else the program's argmax, or the host).
    pub sampled_on_device: bool,
    /// Mean and largest number of tokens the device had published past a token when it was handed on.
    pub mean_lag_tokens: f64,
    /// See `mean_lag_tokens`.
    pub max_lag_tokens: u64,
    /// Mean and largest microseconds between the device writing a token (on the host loop: the host reading
    /// it) and the caller returning from it; `None` where the device's clock could not be calibrated.
    pub mean_lag_micros: Option<f64>,
    /// See `mean_lag_micros`.
    pub max_lag_micros: Option<f64>,
}

impl StreamStats {
    fn from_lags(lags: &[(u64, Option<f64>)], device_loop: bool, sampled_on_device: bool) -> StreamStats {
        let n = lags.len().max(1) as f64;
        let micros: Option<Vec<f64>> = lags.iter().map(|l| l.1).collect();
        let micros = micros.filter(|m| !m.is_empty());
        StreamStats {
            tokens: lags.len(),
            device_loop,
            sampled_on_device,
            mean_lag_tokens: lags.iter().map(|l| l.0 as f64).sum::<f64>() / n,
            max_lag_tokens: lags.iter().map(|l| l.0).max().unwrap_or(0),
            mean_lag_micros: micros.as_ref().map(|m| m.iter().sum::<f64>() / m.len() as f64),
            max_lag_micros: micros.map(|m| m.iter().copied().fold(0.0, f64::max)),
        }
    }
}

/// A streamed generation: the [`Generation`] (its tokens end at the one the caller stopped at) and what
/// streaming measured.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StreamedGeneration {
    /// The generation.
    pub generation: Generation,
    /// The lag and how the tokens were made.
    pub stream: StreamStats,
}

/// Runs prefill over the prompt, then up to `options.steps` decode steps, handing each token to `on_token`
/// as it is made; `on_token` ends the generation by returning `false` (that token is the last). Tokens are
/// drawn by `sampler` (its contract: [`sampling`]'s crate docs); a plain greedy sampler takes the program's
/// own next token.
///
/// Where the device loop can run (the module docs of [`crate::generate`]; for a sampler that is not plain
/// greedy, the decode method's logits in device or managed memory too) and `options.host_loop` is not set,
/// the sampler kernel draws on the device and the tokens stream through pinned memory with no host
/// synchronisation per step, optionally as a replayed CUDA graph; otherwise the host loop runs.
///
/// # Errors
/// As [`super::generate_with`]; [`Error::LostFeedback`] when the device's work completed without
/// publishing a token it queued; the errors `on_token` returns.
pub fn generate_streaming(
    program: &mut Program,
    options: &Options,
    sampler: &Sampler,
    mut on_token: impl FnMut(&StreamedToken) -> Result<bool, Error>,
) -> Result<StreamedGeneration, Error> {
    let g: Generate = program.manifest().generate.clone().ok_or(Error::NotAGenerator)?;
    decode_end(&g, options)?;
    let draws = (!sampler.is_plain_greedy()).then_some(sampler);
    let refused = match refusal(program, &g)? {
        Some(why) => Some(why),
        None if draws.is_some() => logits_refusal(program, &g)?,
        None => None,
    };
    let (generation, stream) = match (refused, options.host_loop) {
        (None, false) => {
            if options.cuda_graph {
                program.require_capturable(&g.decode)?;
            }
            let pacer = Pacer::new(&mut on_token);
            let (generation, stream) =
                device_loop(program, &g, options, Extras { sampler: draws, pacer: Some(pacer) })?;
            (generation, stream.unwrap_or_default())
        }
        (refused, _) => {
            if options.cuda_graph {
                let why = refused.unwrap_or_else(|| "the host loop was asked for".into());
                return Err(Error::GraphNeedsDeviceLoop { why });
            }
            on_host_loop(program, &g, options, draws, &mut on_token)?
        }
    };
    let ran = Options { steps: generation.steps.len().saturating_sub(1), ..options.clone() };
    program.set_position(decode_end(&g, &ran).ok().and_then(|end| u64::try_from(end).ok()));
    Ok(StreamedGeneration { generation, stream })
}

/// Why the device loop's sampler cannot read the decode method's logits on the device, or `None`.
fn logits_refusal(program: &Program, g: &Generate) -> Result<Option<String>, Error> {
    let memory = program.output_memory(&g.decode, &g.logits_output)?;
    Ok((!super::on_device(memory)).then(|| {
        format!(
            "output '{}' of method '{}' is in {memory} memory, so the sampler cannot read it on the device",
            g.logits_output, g.decode
        )
    }))
}

/// The host loop, streaming: each token picked on the host and handed on after its step.
fn on_host_loop(
    program: &mut Program,
    g: &Generate,
    options: &Options,
    draws: Option<&Sampler>,
    on_token: &mut dyn FnMut(&StreamedToken) -> Result<bool, Error>,
) -> Result<(Generation, StreamStats), Error> {
    let mut history = g.prompt.clone();
    let picked = std::cell::Cell::new(Instant::now());
    let choose = |p: &Program, method: &str, index: usize| {
        let token = match draws {
            Some(sampler) => sampler.pick(&logits_row(p, g, method)?, &history, index as u64) as i64,
            None => read_token(p, g, method)?,
        };
        history.push(token);
        picked.set(Instant::now());
        Ok(token)
    };
    let mut lags = Vec::new();
    let observe = |step: &super::Step, _: &Program| {
        let go_on = on_token(&StreamedToken { index: step.index, token: step.token, lag_tokens: 0 })?;
        lags.push((0, Some(picked.get().elapsed().as_secs_f64() * 1e6)));
        Ok(go_on)
    };
    let generation = host_loop(program, g, options, choose, observe)?;
    Ok((generation, StreamStats::from_lags(&lags, false, false)))
}

/// The device loop's side of streaming: hands the mailbox's tokens to the caller in order, once each, holds
/// the queuing back to [`AHEAD`] tokens past them, and notices a stop or lost work.
pub(super) struct Pacer<'a> {
    on_token: &'a mut dyn FnMut(&StreamedToken) -> Result<bool, Error>,
    /// Tokens handed on.
    delivered: usize,
    /// Mailbox entries read (prefill's token is not one when it went through the host).
    read: u32,
    stopped: bool,
    /// A device clock reading and the host's instant it was seen at.
    clock: Option<(u64, Instant)>,
    /// Each token's lag: tokens, microseconds.
    lags: Vec<(u64, Option<f64>)>,
    /// Recorded after every queued step: complete when all of it ran.
    done: Option<Event>,
}

impl<'a> Pacer<'a> {
    pub(super) fn new(on_token: &'a mut dyn FnMut(&StreamedToken) -> Result<bool, Error>) -> Pacer<'a> {
        Pacer { on_token, delivered: 0, read: 0, stopped: false, clock: None, lags: Vec::new(), done: None }
    }

    /// After prefill (its work complete): calibrates the clock, then hands on prefill's token, from the host
    /// (`on_host`) or the mailbox.
    pub(super) fn start(
        &mut self,
        program: &Program,
        device: &DeviceLoop,
        mailbox: &Mailbox,
        on_host: Option<i64>,
    ) -> Result<(), Error> {
        let ctx = program.cuda_context().ok_or(Error::NoStream { what: "streaming on the device" })?;
        self.done =
            Some(Event::new(ctx).map_err(|source| Error::Stream { action: "creating an event on", source })?);
        device.queue_clock(program, mailbox)?;
        let asked = Instant::now();
        while mailbox.clock() == 0 && asked.elapsed() < CLOCK_WAIT {
            std::hint::spin_loop();
        }
        self.clock = (mailbox.clock() != 0).then(|| (mailbox.clock(), Instant::now()));
        match on_host {
            Some(token) => self.deliver(token, 0, Some(Instant::now())),
            None => self.wait(mailbox, 1),
        }
    }

    /// Before decode step `step` (from 1) is queued: hands on what has landed, waits while the device is
    /// [`AHEAD`] tokens ahead; `false` once the caller stopped.
    pub(super) fn before_step(&mut self, mailbox: &Mailbox, step: usize) -> Result<bool, Error> {
        self.poll(mailbox)?;
        // Tokens 0..step are queued: fewer than AHEAD of them not yet handed on before one more is.
        self.wait(mailbox, step.saturating_sub(AHEAD) + 1)?;
        Ok(!self.stopped)
    }

    /// After a step was queued: the event that tells when all queued work ran.
    pub(super) fn queued(&mut self, program: &Program) -> Result<(), Error> {
        if let (Some(done), Some(stream)) = (&self.done, program.cuda_stream()) {
            done.record(stream)
                .map_err(|source| Error::Stream { action: "recording an event on", source })?;
        }
        Ok(())
    }

    /// After the last step was queued: hands on every token up to `total` (or until the caller stops).
    pub(super) fn drain(&mut self, mailbox: &Mailbox, total: usize) -> Result<(), Error> {
        self.wait(mailbox, total)
    }

    /// What streaming measured.
    pub(super) fn finish(self, sampled_on_device: bool) -> StreamStats {
        StreamStats::from_lags(&self.lags, true, sampled_on_device)
    }

    /// Polls until `count` tokens were handed on or the caller stopped; fails when the queued work is done
    /// and a token it should have published is missing.
    fn wait(&mut self, mailbox: &Mailbox, count: usize) -> Result<(), Error> {
        let mut quiet = Instant::now();
        while !self.stopped && self.delivered < count {
            if self.poll(mailbox)? {
                quiet = Instant::now();
                continue;
            }
            if quiet.elapsed() < QUIET {
                std::hint::spin_loop();
                continue;
            }
            let complete = match &self.done {
                Some(done) => done
                    .is_complete()
                    .map_err(|source| Error::Stream { action: "querying an event on", source })?,
                // Only prefill was queued, and it completed before streaming started.
                None => true,
            };
            if complete && !self.poll(mailbox)? {
                return Err(Error::LostFeedback { tokens: self.delivered, steps: count });
            }
            quiet = Instant::now();
        }
        Ok(())
    }

    /// Hands on every token the mailbox holds past those read (until the caller stops); whether there was
    /// one.
    fn poll(&mut self, mailbox: &Mailbox) -> Result<bool, Error> {
        let published = mailbox.published();
        let fresh = published > self.read;
        while self.read < published && !self.stopped {
            let (token, written) = mailbox.token(self.read);
            self.read += 1;
            let written_at = self.clock.and_then(|(device, host)| match written.checked_sub(device) {
                Some(after) => host.checked_add(Duration::from_nanos(after)),
                None => host.checked_sub(Duration::from_nanos(device - written)),
            });
            self.deliver(token, u64::from(published - self.read), written_at)?;
        }
        Ok(fresh)
    }

    /// Hands `token` (the next index) to the caller, recording its lag.
    fn deliver(&mut self, token: i64, lag_tokens: u64, written_at: Option<Instant>) -> Result<(), Error> {
        let index = self.delivered;
        self.delivered += 1;
        let go_on = (self.on_token)(&StreamedToken { index, token, lag_tokens })?;
        let micros = written_at.map(|at| Instant::now().saturating_duration_since(at).as_secs_f64() * 1e6);
        self.lags.push((lag_tokens, micros));
        self.stopped = !go_on;
        Ok(())
    }
}
