//! `et-run PROGRAM.pte`: runs a `.pte` inside ExecuTorch 1.5.1's own runtime (`Module` API, arenas shared
//! across methods) with our plugins registered as its backends: prefill the prompt, then greedy decode steps.
//!
//! Plugins: the libraries in `--plugin-dir` and `DELEGATE_PLUGIN_PATH`, then the reference and CUDA delegates
//! this binary embeds (registered with `Registry::with_embedded`; host-runtime links no plugin)
//! (the same discovery as `delegate-host`: by their manifests, a library loaded only when the program calls
//! its backend; `--probe` loads them all). A plugin whose manifest asks for isolation is never loaded: the run
//! is refused, naming `delegate-host run PROGRAM.pte`, which isolates it. Every failure is one `error:` line and exit status 2; a reader of
//! stdout that went away (`et-run ... | head -1`) ends it quietly with success, as `delegate-host`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use delegate_abi::host::HostConfig;
use executorch_bridge::runner::{self, Protocol};
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
    /// Prompt tokens, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,7,3,12")]
    prompt: Vec<i64>,
    /// Decode steps after prefill.
    #[arg(long, default_value_t = 12)]
    steps: usize,
    /// Load every plugin library found now (checking those with a manifest against it), instead of reading
    /// manifests only and loading a library when the program needs its backend (as `delegate-host --probe`).
    #[arg(long)]
    probe: bool,
    /// Print a JSON report: tokens, the last logits row after prefill and each step, and per decode step
    /// the bytes the program's `copy_` write-backs copy.
    #[arg(long)]
    json: bool,
    /// Strict zero-copy: refuse, before running, a program whose calls would copy cache bytes on every step
    /// (a `copy_` write-back the planning pass did not make a self-copy, a plugin that does not bind aliased
    /// outputs in place), naming the method, instruction, buffer and reason.
    #[arg(long)]
    require_zero_copy: bool,
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
    let protocol = Protocol {
        prompt: args.prompt.clone(),
        steps: args.steps,
        require_zero_copy: args.require_zero_copy,
    };
    let report = match runner::run(&args.program, &registry, &protocol) {
        Ok(report) => report,
        Err(err) => {
            let code = et_error::HasErrorCode::error_code(&err);
            eprintln!("error: {err} [{}]", code.name());
            return ExitCode::from(2);
        }
    };
    let text = if args.json {
        let json = serde_json::json!({
            "program": args.program.display().to_string(),
            "runtime": "executorch 1.5.1",
            "methods": report.methods,
            "served_by": report.served_by.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
            "prompt": protocol.prompt,
            "steps": protocol.steps,
            "tokens": report.tokens,
            "logits": report.logits,
            "prefill": report.prefill,
            "decode": report.decode,
            "write_back_bytes_per_decode_step": report.decode.iter().map(|s| s.write_back_bytes).collect::<Vec<_>>(),
            "measured": "per DelegateCall, for every KV output whose data pointer differs from its buffer input's, \
                         the output's nbytes (what the copy_ write-back then copies); equal pointers copy nothing",
        });
        format!("{json:#}\n")
    } else {
        let tokens: Vec<String> = report.tokens.iter().map(i64::to_string).collect();
        let per_step: Vec<String> = report.decode.iter().map(|s| s.write_back_bytes.to_string()).collect();
        format!("tokens: {}\nwrite-back bytes per decode step: {}\n", tokens.join(" "), per_step.join(" "))
    };
    emit(&text)
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
