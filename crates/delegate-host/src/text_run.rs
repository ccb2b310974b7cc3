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

use host_runtime::generate::{generate_streaming, Options, StreamStats};
use host_runtime::program::{Mode, Program};
use serde_json::{json, Value};
use text_gen::Reply;
pub use text_gen::{GenArgs, Settings};

use crate::run::RunArgs;
use crate::{emit, failure, Failure};

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
    let mut reply = Reply::new(args.tokenizer.as_ref().map(|t| &t.tokenizer), settings);
    let stream = !args.json && reply.has_text();
    let mut failed = None;
    let streamed = generate_streaming(program, &options, &settings.sampler, |streamed| {
        let pushed = reply.push(streamed.token);
        if stream && !pushed.text.is_empty() {
            if let Err(err) = emit(&pushed.text) {
                failed = Some(err);
                return Ok(false);
            }
        }
        Ok(!pushed.stopped)
    })?;
    let generation = &streamed.generation;
    if let Some(err) = failed {
        return Err(err);
    }
    if !reply.has_text() {
        return crate::run::report(generation, mode, args.json, used, Some(&stats_json(&streamed.stream)));
    }
    let rest = reply.finish();
    if stream {
        emit(&format!("{rest}\n"))?;
        eprintln!("{}", reply.summary(generation.tokens.len()));
        return Ok(());
    }
    let mut value = reply.json_fields(settings.sampler.params());
    for (key, field) in [
        ("mode", json!(mode)),
        ("ids", json!(generation.tokens)),
        ("prompt_ids", json!(prompt)),
        (
            "stats",
            json!({
                "host_syncs_per_decode_step": generation.host_syncs_per_decode_step(),
                "device_loop": generation.device_loop,
                "cuda_graph": generation.cuda_graph,
                "stream": stats_json(&streamed.stream),
            }),
        ),
        ("plugins", json!(used)),
    ] {
        value.insert(key.to_owned(), field);
    }
    emit(&format!("{}\n", Value::from(value)))
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
