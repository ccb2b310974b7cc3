//! `run`'s generation with a sampler, stop conditions and a streamed text reply, through
//! `generate::generate_streaming`: where the device loop runs (a GPU program), the sampler kernel draws each
//! token on the device and tokens reach the host through pinned memory it polls, with no host
//! synchronisation per step (`--cuda-graph` replays the step); elsewhere the host loop picks each token from
//! the logits ([`sampling::Sampler`], the same arithmetic). The generation ends at an end-of-sequence id of the
//! checkpoint's `generation_config.json`, at a `--stop` string or after `--max-new-tokens`, and the reply is
//! printed as it is generated (one flush per token); `--json` reports the text, the ids, the time to first
//! token and the tokens per second instead, and `stats` with the streaming lag (tokens and microseconds
//! between the device writing a token and the host printing it) and the host synchronisations per decode
//! step. The ids are every generated id, the end-of-sequence id or the one that completed a stop string
//! included; the text stops before either. Without a tokenizer (a sampled run of token ids) the report is
//! `run`'s usual one, with the lag in its stats.

use std::time::{Duration, Instant};

use host_runtime::generate::{generate_streaming, Generation, Options, StreamStats};
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
    if args.hold_position || args.output_dir.is_some() || args.prompt_cache.is_some() {
        return Err(failure(
            "a sampled, stopped or text generation runs from the prompt: \
             it takes no --hold-position, --output-dir or --prompt-cache",
        ));
    }
    let prompt = program.manifest().generate.as_ref().map(|g| g.prompt.clone()).unwrap_or_default();
    let options: Options = crate::run::options(steps, args, program, args.cuda_graph);
    let mut detokenizer = args.tokenizer.as_ref().map(|t| Detokenizer::new(&t.tokenizer, &settings.stops));
    let stream = !args.json && detokenizer.is_some();
    let (mut stop, mut failed) = (Stop::Length, None);
    let start = Instant::now();
    let mut times = Vec::new();
    let streamed = generate_streaming(program, &options, &settings.sampler, |streamed| {
        times.push(start.elapsed());
        if settings.eos.contains(&streamed.token) {
            stop = Stop::Eos;
            return Ok(false);
        }
        let Some(d) = detokenizer.as_mut() else { return Ok(true) };
        let pushed = d.push(streamed.token);
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
    let generation = &streamed.generation;
    if let Some(err) = failed {
        return Err(err);
    }
    let Some(mut detokenizer) = detokenizer else {
        return crate::run::report(generation, mode, args.json, used, Some(&stats_json(&streamed.stream)));
    };
    let rest = if matches!(stop, Stop::Text) { String::new() } else { detokenizer.finish() };
    if stream {
        emit(&format!("{rest}\n"))?;
        eprintln!("{}", summary(generation, stop, &times));
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
        "stats": {
            "host_syncs_per_decode_step": generation.host_syncs_per_decode_step(),
            "device_loop": generation.device_loop,
            "cuda_graph": generation.cuda_graph,
            "stream": stats_json(&streamed.stream),
        },
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

/// The streaming lag as `--json` reports it: how many tokens the device had written past each token when it
/// was printed, and how many microseconds after the device wrote it (`null` where not measured).
fn stats_json(s: &StreamStats) -> Value {
    json!({
        "tokens": s.tokens,
        "sampled_on_device": s.sampled_on_device,
        "mean_lag_tokens": s.mean_lag_tokens,
        "max_lag_tokens": s.max_lag_tokens,
        "mean_lag_us": s.mean_lag_micros,
        "max_lag_us": s.max_lag_micros,
    })
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
