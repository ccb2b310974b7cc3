//! `et-run PROGRAM.pte`: runs a `.pte` inside ExecuTorch 1.5.1's own runtime (`Module` API, arenas shared
//! across methods) with our plugins registered as its backends: prefill the prompt, then greedy decode steps.
//!
//! Text, chat and sampling as `delegate-host run` has them (the `text-gen` crate's, shared): with a tokenizer
//! (`--tokenizer`, or a `tokenizer.json` beside the program) `--prompt` is text and the reply is streamed as
//! text; `--chat --system --user` renders the checkpoint's chat template; `--temperature`, `--top-k`,
//! `--top-p`, `--min-p`, `--repetition-penalty` and `--seed` pick each token with the same sampler; the reply
//! ends at the checkpoint's end-of-sequence ids, a `--stop` string or `--max-new-tokens` (`text`).
//!
//! The program is read once (a regular file only, opened without blocking: a FIFO or a device in its place is
//! refused at once), checked (every backend served; every argument a delegate writes is planned memory, never
//! a constant of the program), and ExecuTorch loads exactly those bytes: it never opens the path itself.
//!
//! Planned memory (activations and the caches' mutable buffers): host memory, or CUDA managed memory for a
//! program a GPU delegate runs, so it updates the caches in place on the GPU (`executorch_bridge::planned`);
//! `--memory host|managed` overrides the choice, and the report says which it was.
//!
//! Plugins: the libraries in `--plugin-dir` and `DELEGATE_PLUGIN_PATH`, then the reference and CUDA delegates
//! this binary embeds (registered with `Registry::with_embedded`; host-runtime links no plugin)
//! (the same discovery as `delegate-host`: by their manifests, a library loaded only when the program calls
//! its backend; `--probe` loads them all). A plugin whose manifest asks for isolation is never loaded: the run
//! is refused, naming `delegate-host run PROGRAM.pte`, which isolates it. Every failure is one `error:` line and exit status 2; a reader of
//! stdout that went away (`et-run ... | head -1`) ends it quietly with success, as `delegate-host`.

mod text;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use delegate_abi::host::HostConfig;
use executorch_bridge::runner::{self, Protocol};
use executorch_bridge::{CopyStats, PlannedMemory};
use host_runtime::isolate::Isolation;
use host_runtime::plugins::{Discovery, Registry};

/// Runs a .pte inside ExecuTorch's runtime through our delegate plugins.
#[derive(Debug, Parser)]
#[command(name = "et-run", version)]
struct Args {
    /// The program.
    program: PathBuf,
    /// Extra plugin directories, searched before DELEGATE_PLUGIN_PATH and the embedded plugins.
    #[arg(long = "plugin-dir")]
    plugin_dirs: Vec<PathBuf>,
    /// The prompt: text when there is a tokenizer (--tokenizer, or a tokenizer.json beside the program), else
    /// comma-separated token ids [default: 1,7,3,12]
    #[arg(long)]
    prompt: Option<String>,
    /// The prompt as token ids, e.g. 1,7,3,12, with or without a tokenizer.
    #[arg(long, value_delimiter = ',', num_args = 1.., conflicts_with = "prompt", value_name = "TOKENS")]
    prompt_ids: Option<Vec<i64>>,
    /// The model's tokenizer.json (Hugging Face tokenizers) [default: the tokenizer.json beside the program,
    /// when there is one]
    #[arg(long, value_name = "PATH")]
    tokenizer: Option<PathBuf>,
    /// Talk to the model: the prompt is --system (if any) and --user rendered with the checkpoint's chat
    /// template (chat_template.jinja, else tokenizer_config.json's, beside the tokenizer), ending where the
    /// assistant's reply begins.
    #[arg(long, requires = "user", conflicts_with_all = ["prompt", "prompt_ids"])]
    chat: bool,
    /// The system turn of --chat.
    #[arg(long, requires = "chat", value_name = "TEXT")]
    system: Option<String>,
    /// The user turn of --chat.
    #[arg(long, requires = "chat", value_name = "TEXT")]
    user: Option<String>,
    /// Decode steps after prefill.
    #[arg(long, default_value_t = 12)]
    steps: usize,
    #[command(flatten)]
    generation: text_gen::GenArgs,
    /// Load every plugin library found now (checking those with a manifest against it), instead of reading
    /// manifests only and loading a library when the program needs its backend (as `delegate-host --probe`).
    #[arg(long)]
    probe: bool,
    /// Print a JSON report: tokens, the last logits row after prefill and each step, and per decode step
    /// the bytes copied, counted as the copies ran (the same totals as the text report).
    #[arg(long)]
    json: bool,
    /// Strict zero-copy: refuse, before running, a program whose calls would copy cache bytes on every step
    /// (a `copy_` write-back of a buffer, a self-copy included, or a plugin that does not bind aliased
    /// outputs in place), naming the method, instruction, buffer and reason.
    #[arg(long)]
    require_zero_copy: bool,
    /// Where ExecuTorch's planned memory (activations and the caches' mutable buffers) lives: host memory, or
    /// CUDA managed memory a GPU delegate updates in place. Default: managed when a delegate the program calls
    /// updates managed but not host memory in place (the CUDA delegate), host otherwise.
    #[arg(long, value_name = "host|managed")]
    memory: Option<PlannedMemory>,
}

/// The plugins `args` asks for, then those this binary embeds.
fn registry(args: &Args) -> Registry {
    // Isolation requests are honoured, never dropped: `Registry::served` decides which plugins run in a worker
    // (those whose manifest asks), and the bridge refuses each of them, naming `delegate-host run`. et-run
    // starts no worker, so the worker command is never run.
    let discovery = Discovery::new()
        .dirs(&args.plugin_dirs)
        .use_env(true)
        .probe(args.probe)
        .isolation(Isolation::new("delegate-host", ["worker"]));
    let config = HostConfig::default();
    Registry::discover(discovery)
        .with_embedded(reference_delegate::delegate_root(), &config)
        .with_embedded(cuda_delegate::delegate_root(), &config)
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("ET_RUN_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("off")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let registry = registry(&args);
    let (tokenizer, prompt, settings) = match text::read(&args) {
        Ok(read) => read,
        Err(err) => return fail(&err),
    };
    let protocol = Protocol {
        prompt,
        steps: settings.steps.unwrap_or(args.steps),
        require_zero_copy: args.require_zero_copy,
    };
    if settings.wanted(tokenizer.is_some()) {
        return text::run(&args, &registry, &protocol, &settings, tokenizer.as_ref());
    }
    let report = match runner::run_with_memory(&args.program, &registry, &protocol, args.memory) {
        Ok(report) => report,
        Err(err) => return fail(&err),
    };
    let text = if args.json { json_report(&args, &protocol, &report) } else { text_report(&report) };
    emit(&text)
}

/// One `error: ... [Code]` line on stderr and exit status 2.
fn fail(err: &(impl et_error::HasErrorCode + std::fmt::Display)) -> ExitCode {
    eprintln!("error: {err} [{}]", err.error_code().name());
    ExitCode::from(2)
}

/// What `measured` says in the JSON report: where the byte counts come from.
const MEASURED: &str = "bytes copied per step, counted where each copy runs: ExecuTorch's copy kernels (aten::copy_ \
                        write-backs and the copy/clone out kernels, wrapped by counting kernels that run the \
                        original), the bridge's own write-backs, and the plugins' reflects; method inputs and \
                        outputs are I/O, not counted";

/// The text report: tokens, then per decode step the bytes copied, in total and by kind.
fn text_report(report: &runner::Report) -> String {
    let tokens: Vec<String> = report.tokens.iter().map(i64::to_string).collect();
    let per_step = |f: fn(&CopyStats) -> u64| -> String {
        report.decode.iter().map(|s| f(s).to_string()).collect::<Vec<_>>().join(" ")
    };
    format!(
        "tokens: {}\nplanned memory: {}\nbytes copied per decode step: {}\n  write-back kernels (aten::copy_): {}\n  bridge \
         write-backs: {}\n  other copy kernels: {}\n  reflect: {}\n",
        tokens.join(" "),
        planned_memory(report),
        per_step(CopyStats::total),
        per_step(|s| s.write_back_bytes),
        per_step(|s| s.bridge_write_back_bytes),
        per_step(|s| s.op_bytes),
        per_step(|s| s.reflect_bytes),
    )
}

/// Where the planned buffers were, as the text report says it.
fn planned_memory(report: &runner::Report) -> String {
    match report.planned_memory {
        PlannedMemory::Host => "host".to_owned(),
        PlannedMemory::Managed => {
            let delegate: Vec<String> = report.decode_syncs.iter().map(|s| s.delegate.to_string()).collect();
            format!(
                "managed (CUDA managed memory, device 0; host syncs inside the delegates per decode step: {})",
                delegate.join(" ")
            )
        }
    }
}

/// The JSON report: the text report's totals, the logits, and each step's counts by kind.
fn json_report(args: &Args, protocol: &Protocol, report: &runner::Report) -> String {
    let per_step = |f: fn(&CopyStats) -> u64| report.decode.iter().map(f).collect::<Vec<_>>();
    let json = serde_json::json!({
        "program": args.program.display().to_string(),
        "runtime": "executorch 1.5.1",
        "methods": report.methods,
        "served_by": report.served_by.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
        "prompt": protocol.prompt,
        "steps": protocol.steps,
        "tokens": report.tokens,
        "logits": report.logits,
        "planned_memory": report.planned_memory,
        "host_syncs_per_decode_step": report.decode_syncs,
        "prefill": report.prefill,
        "decode": report.decode,
        "bytes_copied_per_decode_step": per_step(CopyStats::total),
        "write_back_bytes_per_decode_step": per_step(|s| s.write_back_bytes),
        "bridge_write_back_bytes_per_decode_step": per_step(|s| s.bridge_write_back_bytes),
        "op_bytes_per_decode_step": per_step(|s| s.op_bytes),
        "reflect_bytes_per_decode_step": per_step(|s| s.reflect_bytes),
        "measured": MEASURED,
    });
    format!("{json:#}\n")
}

/// Writes the whole output to stdout. A reader that went away (`| head -1`) ends the program quietly with
/// success, as `delegate-host` does; any other write failure (a full disk) is one `error:` line.
fn emit(text: &str) -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: cannot write to stdout: {err} [{}]", et_error::ErrorCode::AccessFailed.name());
            ExitCode::from(2)
        }
    }
}
