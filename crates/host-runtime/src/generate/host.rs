//! The host loop: each step's token and position written by the host, the method run to completion, the
//! next token read back.

use program_manifest::Generate;

use super::{i64_bytes, token_rows, Generation, Options, Step, Timing};
use crate::program::{Error, Program, RunStats};

/// Runs the host loop: `choose` picks each step's token once the step ran (`program`, the method that
/// ran, the step's index), `observe` sees the step and says whether to go on (`false` ends the generation
/// after this step, its token not fed).
pub(super) fn host_loop(
    program: &mut Program,
    g: &Generate,
    options: &Options,
    mut choose: impl FnMut(&Program, &str, usize) -> Result<i64, Error>,
    mut observe: impl FnMut(&Step, &Program) -> Result<bool, Error>,
) -> Result<Generation, Error> {
    let timing = Timing::new(program, options)?;
    let mut generation = Generation {
        tokens: Vec::new(),
        steps: Vec::new(),
        device_loop: false,
        cuda_graph: false,
        capture_micros: None,
        host_syncs: 0,
        readback_host_syncs: 0,
    };
    let mut position = 0i64;
    let mut feed = g.prompt.clone();
    let mut syncs_before = 0;
    for index in 0..=options.steps {
        let method = if index == 0 { &g.prefill } else { &g.decode };
        if index == 1 {
            syncs_before = cuda_rt::stats::thread_host_syncs();
        }
        let (chunk, chunk_position, chunk_stats) = run_head_chunks(program, g, method, &feed, position)?;
        program.write_input(method, &g.token_input, &i64_bytes(chunk))?;
        program.write_input(method, &g.position_input, &i64_bytes(&[chunk_position]))?;
        if let Some(timing) = &timing {
            timing.mark(program, index, false)?;
        }
        let mut stats = program.execute(method)?;
        stats.elapsed += chunk_stats.elapsed;
        stats.copies.add(chunk_stats.copies);
        if let Some(timing) = &timing {
            timing.mark(program, index, true)?;
        }
        let token = choose(program, method, index)?;
        // The run itself, as before there was a device loop (writing inputs and reading the token are not
        // part of it).
        let micros = stats.elapsed.as_secs_f64() * 1e6;
        let step = Step {
            index,
            method: method.clone(),
            position,
            input_tokens: feed.clone(),
            token,
            micros,
            gpu_micros: None,
            copies: stats.copies,
        };
        let go_on = observe(&step, program)?;
        position = if index == 0 {
            options.start_position.unwrap_or(feed.len() as i64)
        } else {
            position + i64::from(!options.hold_position)
        };
        feed = vec![token];
        generation.tokens.push(token);
        generation.steps.push(step);
        if !go_on {
            break;
        }
    }
    if generation.steps.len() > 1 {
        generation.host_syncs = cuda_rt::stats::thread_host_syncs() - syncs_before;
    }
    if let Some(timing) = timing {
        program.synchronize()?;
        for (step, micros) in generation.steps.iter_mut().skip(1).zip(timing.step_micros()?) {
            step.gpu_micros = Some(micros);
        }
    }
    Ok(generation)
}

/// A method that takes fewer tokens than it is fed (a single-method program's `forward` over the prompt)
/// runs over them in chunks of its size: every chunk but the last runs here, to completion. Returns the last
/// chunk (all of `feed` when it is not chunked), its position and what the runs before it cost.
fn run_head_chunks<'f>(
    program: &mut Program,
    g: &Generate,
    method: &str,
    feed: &'f [i64],
    position: i64,
) -> Result<(&'f [i64], i64, RunStats), Error> {
    let mut stats = RunStats::default();
    let Some(rows) = token_rows(program, g, method).filter(|&rows| rows > 0 && rows < feed.len()) else {
        return Ok((feed, position, stats));
    };
    if feed.len() % rows != 0 {
        return Err(Error::Generation(format!(
            "method '{method}' takes {rows} tokens per call, which does not divide the prompt of {}",
            feed.len()
        )));
    }
    let (head, last) = feed.split_at(feed.len() - rows);
    let mut chunk_position = position;
    for part in head.chunks(rows) {
        program.write_input(method, &g.token_input, &i64_bytes(part))?;
        program.write_input(method, &g.position_input, &i64_bytes(&[chunk_position]))?;
        let run = program.execute(method)?;
        stats.elapsed += run.elapsed;
        stats.copies.add(run.copies);
        chunk_position += rows as i64;
    }
    Ok((last, chunk_position, stats))
}
