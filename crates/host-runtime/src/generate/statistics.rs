//! What a generation measured: the [`Generation`] record and its per-decode-step means, and the CUDA events
//! that time each decode step on the GPU.

use std::time::Duration;

use super::{Options, Step};
use crate::cuda;
use crate::program::{CopyStats, Error, Program};

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
    /// A generation on the host loop, no step run yet.
    pub(super) fn on_host_loop() -> Generation {
        Generation {
            tokens: Vec::new(),
            steps: Vec::new(),
            device_loop: false,
            cuda_graph: false,
            capture_micros: None,
            host_syncs: 0,
            readback_host_syncs: 0,
        }
    }

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

/// Timed events around each decode step (a start and an end per step, so host work between steps is not
/// counted), when asked for and the program has a stream.
pub(super) struct Timing {
    events: Vec<(cuda::Event, cuda::Event)>,
}

impl Timing {
    pub(super) fn new(program: &Program, options: &Options) -> Result<Option<Timing>, Error> {
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
    pub(super) fn mark(&self, program: &Program, step: usize, end: bool) -> Result<(), Error> {
        let pair = step.checked_sub(1).and_then(|i| self.events.get(i));
        if let (Some((start, stop)), Some(stream)) = (pair, program.cuda_stream()) {
            let event = if end { stop } else { start };
            event
                .record(stream)
                .map_err(|source| Error::Stream { action: "recording an event on", source })?;
        }
        Ok(())
    }

    /// The GPU microseconds of each of the first `steps` steps (those that ran: an early stop leaves later
    /// events unrecorded), once the stream has passed their marks.
    pub(super) fn step_micros(&self, steps: usize) -> Result<Vec<f64>, Error> {
        self.events
            .iter()
            .take(steps)
            .map(|(start, end)| {
                end.elapsed_ms(start)
                    .map(|ms| f64::from(ms) * 1e3)
                    .map_err(|source| Error::Stream { action: "timing", source })
            })
            .collect()
    }
}
