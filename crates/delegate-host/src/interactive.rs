//! `run --chat --interactive`: a conversation read from stdin, one user turn per line, each reply streamed
//! as it is generated, the caches kept between turns.
//!
//! Each turn renders the whole conversation with the checkpoint's chat template (the template must see the
//! system turn and the earlier replies), encodes it, and feeds only the tokens past the longest prefix the
//! caches already hold: the earlier turns are never fed again. Where the template rewrites what the caches
//! hold (a reply re-encoded differently, a template that drops earlier text), the caches are rewound to the
//! shared prefix ([`Program::rewind`]) and only the rest is fed: as a prompt is fed (in chunks through the
//! prefill method, the rest through decode: [`host_runtime::generate::continue_from`]) but for its last token,
//! fed through the decode method, whose logits pick the reply's first token. Then the reply is sampled ([`sampling::Sampler`]) and ends at an end-of-sequence id, a `--stop`
//! string, `--max-new-tokens` (or `--steps` + 1) or the caches' last position; its last token is not fed
//! (the next turn's render holds it, or what the template puts in its place).
//!
//! Per turn, a line on stderr says how many tokens were fed, how many the caches kept, the time to the first
//! token (from the turn's start, its feeding included) and the tokens per second; with `--json`, stdout gets
//! one JSON object per turn instead of the streamed text (`fed`, `kept`, `prompt_ids`, `ids`, `text`, `stop`,
//! `time_to_first_token_ms`, `tokens_per_s`).

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use blob_format::model::DType;
use host_runtime::generate::{last_row, last_row_bf16, last_row_f16};
use host_runtime::manifest::Generate;
use host_runtime::program::{Mode, Program};
use serde_json::json;
use text_gen::{Conversation, Detokenizer, Settings, StopChecker, StopReason};

use crate::run::RunArgs;
use crate::{emit, failure, Failure};

/// What one turn did.
struct Turn {
    /// Tokens fed this turn (the new part of the rendered conversation).
    fed: usize,
    /// Tokens the caches kept from earlier turns.
    kept: usize,
    /// The reply's ids, the one that ended it included.
    ids: Vec<i64>,
    /// Why the reply ended.
    stop: StopReason,
    /// Each reply token's time since the turn began (its feeding included).
    times: Vec<Duration>,
}

/// The conversation's state on the program: what its caches hold.
struct Session<'a> {
    program: Program,
    generate: Generate,
    settings: &'a Settings,
    /// The ids at positions `0..cached.len()` of the caches.
    cached: Vec<i64>,
    /// Tokens generated in the conversation so far: the sampler's step counter.
    generated: u64,
    budget: Option<u64>,
}

/// Runs the conversation (see the module docs) with `args`' sampling and stop settings: `system` opens it,
/// stdin gives the user turns.
pub fn run(
    path: &Path,
    mode: Mode,
    dirs: &[PathBuf],
    mut args: RunArgs,
    system: Option<String>,
) -> Result<(), Failure> {
    refuse_options(&args)?;
    let settings = args.generation.take().ok_or_else(|| failure("--interactive: no sampling settings"))?;
    let settings = &settings;
    let tokenizer = args.tokenizer.take().ok_or_else(|| {
        failure(
            "--interactive needs the model's tokenizer: --tokenizer, or a tokenizer.json beside the program",
        )
    })?;
    let mut conversation = Conversation::new(text_gen::ChatTemplate::beside(&tokenizer)?, system);
    let mut session: Option<Session<'_>> = None;
    let tokenizer = &tokenizer;
    for line in std::io::stdin().lock().lines() {
        let line = line.map_err(|err| failure(format!("--interactive: reading a turn from stdin: {err}")))?;
        if line.trim().is_empty() {
            continue;
        }
        let rendered = conversation.user(line)?;
        let ids = text_gen::encode(tokenizer, "--interactive", &rendered, false)?;
        let session = match &mut session {
            Some(session) => session,
            None => {
                // A `.pte` is a token generator once it has a prompt: the first turn's, checked as `run` checks one.
                args.prompt = Some(ids.clone());
                session.insert(Session::load(path, mode, dirs, &args, settings)?)
            }
        };
        let mut detokenizer = Detokenizer::new(&tokenizer.tokenizer, &settings.stops);
        let turn = session.turn(&ids, &mut detokenizer, !args.json)?;
        let text = detokenizer.text().to_owned();
        let (ttft, rate) = text_gen::speed(&turn.times);
        if args.json {
            let value = json!({
                "fed": turn.fed,
                "kept": turn.kept,
                "prompt_ids": ids,
                "ids": turn.ids,
                "text": text,
                "stop": turn.stop.name(),
                "time_to_first_token_ms": ttft.map(|t| t.as_secs_f64() * 1e3),
                "tokens_per_s": rate,
            });
            emit(&format!("{value}\n"))?;
        } else {
            emit("\n")?;
            eprintln!(
                "fed {} tokens ({} kept in the caches), {} tokens (stop: {}), time to first token {:.1} ms, {}",
                turn.fed,
                turn.kept,
                turn.ids.len(),
                turn.stop.name(),
                ttft.unwrap_or_default().as_secs_f64() * 1e3,
                rate.map_or("- tokens/s".to_owned(), |r| format!("{r:.1} tokens/s"))
            );
        }
        conversation.assistant(text);
    }
    Ok(())
}

/// Options that make no sense for a conversation on the host loop.
fn refuse_options(args: &RunArgs) -> Result<(), Failure> {
    if args.cuda_graph
        || args.hold_position
        || args.position.is_some()
        || args.output_dir.is_some()
        || args.prompt_cache.is_some()
        || args.branch.is_some()
        || args.method.is_some()
        || !args.inputs.is_empty()
    {
        return Err(failure(
            "--interactive runs a conversation on the host loop: it takes no --cuda-graph, --position, \
             --hold-position, --output-dir, --prompt-cache, --branch, --method or --input",
        ));
    }
    Ok(())
}

impl<'a> Session<'a> {
    fn load(
        path: &Path,
        mode: Mode,
        dirs: &[PathBuf],
        args: &RunArgs,
        settings: &'a Settings,
    ) -> Result<Session<'a>, Failure> {
        let registry = crate::plugins::registry(dirs);
        let program = crate::run::load(path, &registry, mode, args)?;
        let generate =
            program.manifest().generate.clone().ok_or_else(|| {
                failure(format!("--interactive: {} is not a token generator", path.display()))
            })?;
        let budget = settings.max_new_tokens.or(args.steps.map(|s| u64::try_from(s).unwrap_or(u64::MAX) + 1));
        Ok(Session { program, generate, settings, cached: Vec::new(), generated: 0, budget })
    }

    /// Feeds what `ids` (the whole conversation) adds to the caches, then generates the reply, streaming its
    /// text when `stream`.
    fn turn(
        &mut self,
        ids: &[i64],
        detokenizer: &mut Detokenizer<'_>,
        stream: bool,
    ) -> Result<Turn, Failure> {
        if let Some(max) = self.generate.max_positions.filter(|&max| ids.len() as u64 >= max) {
            return Err(failure(format!(
                "--interactive: the conversation is {} tokens, and the caches hold {max} positions: it does not fit",
                ids.len()
            )));
        }
        let start = Instant::now();
        let kept = self.cached.iter().zip(ids).take_while(|(a, b)| a == b).count();
        // The last token must be fed to get the logits that pick the reply's first token.
        let kept = kept.min(ids.len() - 1);
        if kept < self.cached.len() {
            self.program.rewind(kept as u64)?;
            self.cached.truncate(kept);
        }
        // All but the last new token as a prompt is fed (chunks through the prefill method, the rest through
        // decode); the last through decode, whose logits pick the reply's first token.
        let (head, last) = ids[kept..].split_at(ids.len() - kept - 1);
        if !head.is_empty() {
            host_runtime::generate::continue_from(&mut self.program, kept as u64, head, 0)?;
            self.cached.extend_from_slice(head);
        }
        let mut row = self.feed(last[0])?;
        let mut stops = StopChecker::new(text_gen::StopRules {
            max_new_tokens: self.budget,
            ..self.settings.stop_rules()
        });
        let (mut reply, mut times) = (Vec::new(), Vec::new());
        loop {
            let mut history = self.cached.clone();
            history.extend_from_slice(&reply);
            let token = self.settings.sampler.pick(&row, &history, self.generated) as i64;
            self.generated += 1;
            reply.push(token);
            times.push(start.elapsed());
            let mut stop = stops.push(token, "");
            if stop != Some(StopReason::Eos) {
                let pushed = detokenizer.push(token);
                if stream && !pushed.text.is_empty() {
                    emit(&pushed.text)?;
                }
                if pushed.stopped {
                    stop = Some(StopReason::StopString);
                }
            }
            // The caches' last position is taken: the token cannot be fed.
            let full = self.generate.max_positions.is_some_and(|max| self.cached.len() as u64 >= max);
            if let Some(stop) = stop.or(full.then_some(StopReason::Length)) {
                let done = Turn { fed: ids.len() - kept, kept, ids: reply, stop, times };
                return self.finish(detokenizer, stream, done);
            }
            row = self.feed(token)?;
        }
    }

    /// Releases the reply's last text (none after a stop string) and returns the turn.
    fn finish(&self, detokenizer: &mut Detokenizer<'_>, stream: bool, turn: Turn) -> Result<Turn, Failure> {
        let rest = if turn.stop == StopReason::StopString { String::new() } else { detokenizer.finish() };
        if stream && !rest.is_empty() {
            emit(&rest)?;
        }
        Ok(turn)
    }

    /// Feeds `token` at the next position through the decode method; the last row of its logits.
    fn feed(&mut self, token: i64) -> Result<Vec<f32>, Failure> {
        let g = &self.generate;
        let position = self.cached.len() as i64;
        self.program.write_input(&g.decode, &g.token_input, &token.to_le_bytes())?;
        self.program.write_input(&g.decode, &g.position_input, &position.to_le_bytes())?;
        self.program.execute(&g.decode)?;
        self.cached.push(token);
        let decl =
            self.program.manifest().methods[&g.decode].outputs.iter().find(|d| d.name == g.logits_output);
        let decl =
            decl.ok_or_else(|| failure(format!("the decode method has no output '{}'", g.logits_output)))?;
        let vocab = decl.shape.last().copied().unwrap_or(1) as usize;
        let dtype = decl.dtype;
        let bytes = self.program.read_output(&g.decode, &g.logits_output)?;
        Ok(match dtype {
            DType::F16 => last_row_f16(&bytes, vocab),
            DType::BF16 => last_row_bf16(&bytes, vocab),
            _ => last_row(&bytes, vocab),
        })
    }
}
