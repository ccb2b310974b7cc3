//! The host loop: each step's token and position written by the host, the method run to completion, the
//! next token read back.

use program_manifest::Generate;

use super::protocol::{prompt_calls, Call};
use super::statistics::Timing;
use super::step::run_calls;
use super::{Generation, Options, Step};
use crate::program::{Error, Program};

/// Runs the host loop, the prompt fed by [`prompt_calls`]: `choose` picks each step's token once the step ran
/// (`program`, the method that ran last, the step's index), `observe` sees the step and says whether to go on (`false` ends the generation
/// after this step, its token not fed).
pub(super) fn host_loop(
    program: &mut Program,
    g: &Generate,
    options: &Options,
    mut choose: impl FnMut(&Program, &str, usize) -> Result<i64, Error>,
    mut observe: impl FnMut(&Step, &Program) -> Result<bool, Error>,
) -> Result<Generation, Error> {
    let timing = Timing::new(program, options)?;
    let mut generation = Generation::on_host_loop();
    let prompt = prompt_calls(program, g)?;
    let mut position = 0i64;
    let mut feed = g.prompt.clone();
    let mut syncs_before = 0;
    for index in 0..=options.steps {
        if index == 1 {
            syncs_before = cuda_rt::stats::thread_host_syncs();
        }
        let decode = [Call { method: &g.decode, tokens: &feed, position }];
        let calls: &[Call<'_>] = if index == 0 { &prompt } else { &decode };
        if let Some(timing) = &timing {
            timing.mark(program, index, false)?;
        }
        let (method, stats) = run_calls(program, g, calls)?;
        if let Some(timing) = &timing {
            timing.mark(program, index, true)?;
        }
        let token = choose(program, method, index)?;
        // The runs themselves, as before there was a device loop (writing inputs and reading the token are not
        // part of it).
        let micros = stats.elapsed.as_secs_f64() * 1e6;
        let step = Step {
            index,
            method: method.to_owned(),
            calls: calls.len(),
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
        let decoded = generation.steps.len().saturating_sub(1);
        for (step, micros) in generation.steps.iter_mut().skip(1).zip(timing.step_micros(decoded)?) {
            step.gpu_micros = Some(micros);
        }
    }
    Ok(generation)
}
