//! `et-run`'s text, chat and sampling: the prompt read as `delegate-host run` reads it, and the generation
//! with a sampler, stop rules and a streamed text reply ([`executorch_bridge::runner::run_choosing`]).
//!
//! Streamed, the reply's text goes to stdout as it is generated (one flush per token) and a summary line to
//! stderr (`N tokens (stop: eos), time to first token X ms, Y tokens/s`); `--json` prints one object instead:
//! `text` (without a tokenizer, none), `ids` (every generated id, the one that ended the reply included),
//! `prompt_ids`, `stop` (`eos`, `stop_string`, `length`), `time_to_first_token_ms`, `tokens_per_s`,
//! `sampling`, `planned_memory` and `served_by`.

use std::io::Write;
use std::process::ExitCode;

use executorch_bridge::runner::{self, Protocol};
use host_runtime::plugins::Registry;
use text_gen::{Reply, Settings, TextError, TextTokenizer};

use crate::{fail, Args};

/// The example's prompt, when none is given.
const DEFAULT_PROMPT: [i64; 4] = [1, 7, 3, 12];

/// The tokenizer (given or beside the program), the prompt's ids and the checked sampling and stop options.
pub fn read(args: &Args) -> Result<(Option<TextTokenizer>, Vec<i64>, Settings), TextError> {
    let tokenizer = text_gen::find_tokenizer(&args.program, args.tokenizer.as_deref())?;
    let prompt = match (&args.user, &tokenizer) {
        (Some(user), Some(t)) => {
            let messages = text_gen::chat::messages(args.system.clone(), user.clone());
            let rendered = text_gen::ChatTemplate::beside(t)?.render(&messages)?;
            text_gen::encode(t, "--chat", &rendered, false)?
        }
        (Some(_), None) => {
            return Err(TextError::invalid(
                "--chat needs the model's tokenizer: --tokenizer, or a tokenizer.json beside the program",
            ))
        }
        (None, t) => text_gen::prompt_ids(args.prompt.as_deref(), args.prompt_ids.clone(), t.as_ref())?
            .unwrap_or_else(|| DEFAULT_PROMPT.to_vec()),
    };
    let settings = args.generation.clone().settings(&args.program, tokenizer.is_some())?;
    Ok((tokenizer, prompt, settings))
}

/// Why writing the reply stopped early.
enum Closed {
    /// The reader of stdout went away: end quietly, with success.
    Quietly,
    /// Writing failed otherwise.
    Failed(std::io::Error),
}

fn write_out(text: &str) -> Result<(), Closed> {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()).map_err(|err| match err.kind() {
        std::io::ErrorKind::BrokenPipe => Closed::Quietly,
        _ => Closed::Failed(err),
    })
}

/// Runs the generation (see the module docs).
pub fn run(
    args: &Args,
    registry: &Registry,
    protocol: &Protocol,
    settings: &Settings,
    tokenizer: Option<&TextTokenizer>,
) -> ExitCode {
    // The budget is the protocol's steps (`--max-new-tokens` set them).
    let mut reply = Reply::new(tokenizer.map(|t| &t.tokenizer), settings);
    let stream = !args.json && reply.has_text();
    let mut history = protocol.prompt.clone();
    let mut closed = None;
    let choose = |row: &[f32], step: usize| {
        let token = settings.sampler.pick(row, &history, step as u64) as i64;
        history.push(token);
        token
    };
    let go_on = |token: i64| {
        let pushed = reply.push(token);
        if stream && !pushed.text.is_empty() {
            if let Err(err) = write_out(&pushed.text) {
                closed = Some(err);
                return false;
            }
        }
        !pushed.stopped
    };
    let report = match runner::run_choosing(&args.program, registry, protocol, args.memory, choose, go_on) {
        Ok(report) => report,
        Err(err) => return fail(&err),
    };
    match closed {
        Some(Closed::Quietly) => return ExitCode::SUCCESS,
        Some(Closed::Failed(err)) => return write_failure(&err),
        None => {}
    }
    // Finishing releases the text held back, into the stream and into `--json`'s `text` alike.
    let rest = reply.finish();
    if stream {
        return finish_stream(&rest, &reply, &report);
    }
    crate::emit(&format!("{}\n", reply_json(args, protocol, settings, &reply, &report)))
}

/// The streamed reply's end: the rest of the text and a newline on stdout, the summary line on stderr.
fn finish_stream(rest: &str, reply: &Reply<'_>, report: &runner::Report) -> ExitCode {
    let written = write_out(&format!("{rest}\n"));
    eprintln!("{}", reply.summary(report.tokens.len()));
    match written {
        Err(Closed::Failed(err)) => write_failure(&err),
        _ => ExitCode::SUCCESS,
    }
}

/// `--json`'s object (see the module docs).
fn reply_json(
    args: &Args,
    protocol: &Protocol,
    settings: &Settings,
    reply: &Reply<'_>,
    report: &runner::Report,
) -> serde_json::Value {
    let mut fields = reply.json_fields(settings.sampler.params());
    let served_by: std::collections::BTreeMap<_, _> = report.served_by.iter().cloned().collect();
    for (key, value) in [
        ("program", serde_json::json!(args.program.display().to_string())),
        ("runtime", serde_json::json!("executorch 1.5.1")),
        ("ids", serde_json::json!(report.tokens)),
        ("prompt_ids", serde_json::json!(protocol.prompt)),
        ("planned_memory", serde_json::json!(report.planned_memory)),
        ("served_by", serde_json::json!(served_by)),
    ] {
        fields.insert(key.to_owned(), value);
    }
    fields.into()
}

fn write_failure(err: &std::io::Error) -> ExitCode {
    eprintln!("error: cannot write to stdout: {err} [{}]", et_error::ErrorCode::AccessFailed.name());
    ExitCode::from(2)
}
