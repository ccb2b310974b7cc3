//! `run`'s generation with a sampler, stop conditions and a streamed text reply: the host loop picks each
//! token from the logits ([`sampling::Sampler`]), ends at an end-of-sequence id of the checkpoint's
//! `generation_config.json`, at a `--stop` string or after `--max-new-tokens`, and prints the reply as it is
//! generated (one flush per token); `--json` reports the text, the ids, the time to first token and the
//! tokens per second instead. The ids are every generated id, the end-of-sequence id or the one that
//! completed a stop string included; the text stops before either. Without a tokenizer (a sampled run of
//! token ids) the report is `run`'s usual one.

use std::time::{Duration, Instant};

use host_runtime::generate::{generate_choosing, Generation, Options};
use host_runtime::program::{Mode, Program};
use sampling::Params;
use serde_json::{json, Value};
use text_gen::{speed, Detokenizer};
pub use text_gen::{GenArgs, Settings};

use crate::run::RunArgs;
use crate::{emit, failure, Failure};

/// Why the generation ended.
#[derive(Clone, Copy)]
enum Stop {
    /// An end-of-sequence id.
    Eos,
    /// A `--stop` string.
    Text,
    /// The steps ran out.
    Length,
    /// Stdout went away.
    Closed,
}

impl Stop {
    fn name(self) -> &'static str {
        match self {
            Stop::Eos => "eos",
            Stop::Text => "stop_string",
            Stop::Length => "length",
            Stop::Closed => "closed",
        }
    }
}

/// Runs the generation of `program` for up to `steps` decode steps (see the module docs).
pub fn run(
    program: &mut Program,
    steps: usize,
    mode: Mode,
    args: &RunArgs,
    settings: &Settings,
    used: &[Value],
) -> Result<(), Failure> {
    if args.cuda_graph || args.hold_position || args.output_dir.is_some() || args.prompt_cache.is_some() {
        return Err(failure(
            "a sampled, stopped or text generation runs on the host loop from the prompt: \
             it takes no --cuda-graph, --hold-position, --output-dir or --prompt-cache",
        ));
    }
    let prompt = program.manifest().generate.as_ref().map(|g| g.prompt.clone()).unwrap_or_default();
    let mut options: Options = crate::run::options(steps, args, program, false);
    options.host_loop = true;
    let mut detokenizer = args.tokenizer.as_ref().map(|t| Detokenizer::new(&t.tokenizer, &settings.stops));
    let stream = !args.json && detokenizer.is_some();
    let mut history = prompt.clone();
    let (mut stop, mut failed) = (Stop::Length, None);
    let start = Instant::now();
    let mut times = Vec::new();
    let choose = |row: &[f32], index: usize| {
        let token = settings.sampler.pick(row, &history, index as u64) as i64;
        history.push(token);
        token
    };
    let generation = generate_choosing(program, &options, choose, |step, _| {
        times.push(start.elapsed());
        if settings.eos.contains(&step.token) {
            stop = Stop::Eos;
            return Ok(false);
        }
        let Some(d) = detokenizer.as_mut() else { return Ok(true) };
        let pushed = d.push(step.token);
        if pushed.stopped {
            stop = Stop::Text;
        }
        if stream && !pushed.text.is_empty() {
            if let Err(err) = emit(&pushed.text) {
                failed = Some(err);
                stop = Stop::Closed;
                return Ok(false);
            }
        }
        Ok(!pushed.stopped)
    })?;
    if let Some(err) = failed {
        return Err(err);
    }
    let Some(mut detokenizer) = detokenizer else {
        return crate::run::report(&generation, mode, args.json, used);
    };
    let rest = if matches!(stop, Stop::Text) { String::new() } else { detokenizer.finish() };
    if stream {
        emit(&format!("{rest}\n"))?;
        eprintln!("{}", summary(&generation, stop, &times));
        return Ok(());
    }
    let (ttft, rate) = speed(&times);
    let value = json!({
        "mode": mode,
        "text": detokenizer.text(),
        "ids": generation.tokens,
        "prompt_ids": prompt,
        "stop": stop.name(),
        "time_to_first_token_ms": ttft.map(|t| t.as_secs_f64() * 1e3),
        "tokens_per_s": rate,
        "sampling": params_json(settings.sampler.params()),
        "plugins": used,
    });
    emit(&format!("{value}\n"))
}

/// `N tokens (stop: eos), time to first token X ms, Y tokens/s`.
fn summary(generation: &Generation, stop: Stop, times: &[Duration]) -> String {
    let (ttft, rate) = speed(times);
    let reason = stop.name();
    format!(
        "{} tokens (stop: {reason}), time to first token {:.1} ms, {}",
        generation.tokens.len(),
        ttft.unwrap_or_default().as_secs_f64() * 1e3,
        rate.map_or("- tokens/s".to_owned(), |r| format!("{r:.1} tokens/s"))
    )
}

fn params_json(p: &Params) -> Value {
    json!({
        "temperature": p.temperature,
        "top_k": p.top_k,
        "top_p": p.top_p,
        "min_p": p.min_p,
        "repetition_penalty": p.repetition_penalty,
        "seed": p.seed,
    })
}
