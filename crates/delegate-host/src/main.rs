//! `delegate-host`: inspect, validate and convert delegate blobs; list plugins; run and benchmark programs.
//!
//! The command line over the `host-runtime` library: this crate owns everything about arguments, text and
//! JSON output, progress bars and log set-up, so the library stays what an application embeds. Any bad input
//! ends in one line `error: ... [ExecuTorchCode]` on stderr and exit code 2.
#![forbid(unsafe_code)]

mod blob;
mod branch;
mod interactive;
mod npy;
mod out_file;
mod plan_report;
mod plugins;
mod prompt_cache;
mod pte;
mod run;
mod text;
mod text_run;

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use et_error::{ErrorCode, HasErrorCode};

use crate::blob::Target;
use crate::run::ModeArg;

/// Runs TensorRT and reference delegates over caller-owned KV caches.
#[derive(Parser)]
#[command(name = "delegate-host", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Load every plugin library found now (those with a manifest verified against it first), instead of
    /// reading manifests only and loading a library when a program needs its backend. Refused with --isolate.
    #[arg(long, global = true)]
    probe: bool,
    /// Run every plugin loaded from a library in a worker process of its own (`delegate-host worker`), as a
    /// manifest with `"isolate": true` asks for one plugin: a plugin that crashes or hangs fails its call
    /// instead of the host.
    #[arg(long, global = true)]
    isolate: bool,
    /// How long one call of an isolated plugin may take before its worker is killed and the call fails, in
    /// milliseconds.
    #[arg(long = "deadline-ms", global = true, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    deadline_ms: u64,
}

#[derive(Subcommand)]
enum Command {
    /// Print what a blob says: format, backend, bindings in delegate-argument order, aliases, engine extent;
    /// or what an ExecuTorch program (.pte) holds: methods, delegate calls with their blobs, mutable buffers,
    /// operators. With --plan: the kernel launches the CUDA delegate plans for each of its calls.
    Inspect {
        /// The blob or .pte file.
        blob: PathBuf,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
        /// For each call the CUDA delegate runs (CudaBackend), the launches of one call as its planner lowers
        /// the payload (computed on the CPU, no GPU needed): each launch's kind, fused or on its own, the
        /// tensors it writes and, for an op on its own, why it did not fuse; then launches a call and per
        /// layer. Reads each such payload whole, one at a time.
        #[arg(long)]
        plan: bool,
    },
    /// Check a blob's format-level rules (structure, integrity, alias table) without an engine.
    Validate {
        /// The blob file.
        blob: PathBuf,
    },
    /// Rewrite a blob in another wire format, refusing when the target cannot express it losslessly.
    Convert {
        /// The blob to read.
        input: PathBuf,
        /// Where to write.
        output: PathBuf,
        /// The target format.
        #[arg(long = "to", value_enum)]
        to: Target,
    },
    /// List every plugin candidate: path, name, version, ABI, backends, wire formats, status.
    Plugins {
        /// Directories to search before `DELEGATE_PLUGIN_PATH`.
        #[arg(long = "plugin-dir")]
        plugin_dirs: Vec<PathBuf>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Load each plugin library once and write its manifest next to it (`libfoo.so` -> `libfoo.plugin.json`):
    /// what discovery reads instead of loading libraries.
    PluginManifest {
        /// The plugin libraries.
        #[arg(required = true)]
        libraries: Vec<PathBuf>,
        /// Ask hosts to run these plugins in a worker process ("isolate": true in the manifest).
        #[arg(long)]
        isolate: bool,
    },
    /// Serve one isolated plugin instance on the socket a host passed as descriptor 3 (started by the host,
    /// not by people).
    #[command(hide = true)]
    Worker,
    /// Run a program (a TOML manifest or an ExecuTorch .pte): a token generator prefills once, then decodes
    /// feeding back the argmax token (or a sampled one: --temperature); with a tokenizer (--tokenizer, or a
    /// tokenizer.json beside the program) the prompt is text and the reply is printed as text while it is
    /// generated; any other program, or one given --input or --method, runs one method once.
    Run {
        #[command(flatten)]
        common: ProgramArgs,
        /// Run this method once instead of generating [default: the only method, or forward].
        #[arg(long)]
        method: Option<String>,
        /// A method input from a .npy file: NAME=FILE.npy (NAME: the input's name, or its index for a .pte
        /// without names); repeatable; inputs not given are zero. Runs the method once.
        #[arg(long = "input", value_name = "NAME=FILE")]
        inputs: Vec<String>,
        /// Write every output of the methods that ran (output.<method>.<name>.npy) and every buffer's final
        /// value (buffer.<name>.npy) into this directory; each file is replaced whole, and one whose name is
        /// taken by anything but a regular file (a FIFO, a device, a symbolic link) refuses the run.
        #[arg(long)]
        output_dir: Option<PathBuf>,
        /// How buffer-mutation outputs are passed.
        #[arg(long, value_enum, default_value = "zero-copy")]
        mode: ModeArg,
        /// Capture one decode step into a CUDA graph and replay it (needs the device loop: a
        /// `next_token_output` and the decode method's tokens, position and next token in device or
        /// managed memory).
        #[arg(long)]
        cuda_graph: bool,
        /// Keep the caches in FILE between runs: reuse the longest saved prefix that matches the prompt,
        /// feed only the rest, and save the new state to FILE at the end (a safetensors file).
        #[arg(long, value_name = "FILE")]
        prompt_cache: Option<PathBuf>,
        /// A second prompt, e.g. 1,7,9: after the run of --prompt, fork the caches at the prompts' longest
        /// shared prefix (copying only its rows), run this prompt's rest and the same decode steps on the
        /// fork, then decode one more step of the first prompt on its own caches; reports both branches, the
        /// fork position and the bytes copied. A generation only: no --method, --input, --output-dir,
        /// --position, --hold-position, --cuda-graph or --prompt-cache; plugins in a worker process
        /// (--isolate) cannot fork.
        #[arg(long, value_delimiter = ',', num_args = 1.., value_name = "TOKENS")]
        branch: Option<Vec<i64>>,
        #[command(flatten)]
        generation: text_run::GenArgs,
        /// A conversation with --chat: each line of stdin is a user turn, each reply is streamed, and the
        /// caches keep the conversation, so a turn feeds only its own tokens.
        #[arg(long, requires = "chat", group = "turn", conflicts_with_all = ["user", "branch"])]
        interactive: bool,
    },
    /// Measure decode steps of a program in both modes, side by side: time per step and bytes copied per step;
    /// with CUDA memory also GPU time per step, host synchronisations per step, and zero-copy as a CUDA graph.
    Bench {
        #[command(flatten)]
        common: ProgramArgs,
        /// Runs per mode; the first is a warm-up and is not counted.
        #[arg(long, default_value_t = 5)]
        runs: usize,
    },
}

/// What `run` and `bench` both take: the program, how to generate, where its blobs and plugins may come from,
/// and the output format.
#[derive(clap::Args)]
struct ProgramArgs {
    /// The program: a manifest (TOML) or an ExecuTorch program (.pte).
    program: PathBuf,
    /// The prompt (needed to generate with a .pte, which carries none; replaces a manifest's [generate]
    /// prompt): text when there is a tokenizer (--tokenizer, or a tokenizer.json beside the program), else
    /// token ids, e.g. 1,7,3,12.
    #[arg(long)]
    prompt: Option<String>,
    /// The prompt as token ids, e.g. 1,7,3,12, with or without a tokenizer.
    #[arg(long, value_delimiter = ',', num_args = 1.., conflicts_with = "prompt", value_name = "TOKENS")]
    prompt_ids: Option<Vec<i64>>,
    /// The model's tokenizer.json (Hugging Face tokenizers) [default: the tokenizer.json beside the program,
    /// when there is one]
    #[arg(long, value_name = "PATH")]
    tokenizer: Option<PathBuf>,
    /// Talk to the model: the prompt is --system (if any) and --user rendered with the checkpoint's chat template
    /// (chat_template.jinja, else tokenizer_config.json's, beside the tokenizer), ending where the assistant's reply
    /// begins.
    #[arg(long, requires = "turn", conflicts_with_all = ["prompt", "prompt_ids"])]
    chat: bool,
    /// The system turn of --chat.
    #[arg(long, requires = "chat", value_name = "TEXT")]
    system: Option<String>,
    /// The user turn of --chat.
    #[arg(long, requires = "chat", group = "turn", value_name = "TEXT")]
    user: Option<String>,
    /// Decode steps after prefill (bench: per run, each from zeroed caches) [default: as many as the caches
    /// hold ([generate] max_positions, a .pte's max_seq_len, or the rows its buffers' shapes share), or 15
    /// when the program does not tell]
    #[arg(long)]
    steps: Option<usize>,
    /// Start decode steps at this position, e.g. max/2 or max-1 (written into the position input after
    /// prefill; decoding goes on with whatever the caches hold) [default: right after the prompt]
    #[arg(long)]
    position: Option<i64>,
    /// Decode every step at --position, overwriting one cache row: a steady state at one cache fill, as
    /// PyTorch's decode anchors measure a step (the tokens are then not a generation).
    #[arg(long, requires = "position")]
    hold_position: bool,
    /// Load blobs the program names outside its own directory (absolute paths, paths through `..`).
    #[arg(long)]
    allow_outside_blobs: bool,
    /// Directories to search for plugins before `DELEGATE_PLUGIN_PATH`.
    #[arg(long = "plugin-dir")]
    plugin_dirs: Vec<PathBuf>,
    /// Print one JSON object instead of text (run: per-step summaries and stats; bench: the table's figures).
    #[arg(long)]
    json: bool,
    /// Strict zero-copy: refuse at load, naming the method, call, argument and reason, any call that would
    /// copy cache bytes on every step (staging, a reflect and write-back, a .pte's host copy of a buffer)
    /// (bench: its zero-copy rows).
    #[arg(long)]
    require_zero_copy: bool,
}

impl ProgramArgs {
    /// The options `run` and `bench` share; `run`'s own are set by the caller. The prompt is read here: text
    /// encoded by the tokenizer, or token ids.
    fn run_args(self) -> Result<(PathBuf, Vec<PathBuf>, run::RunArgs), Failure> {
        let tokenizer = text::find_tokenizer(&self.program, self.tokenizer.as_deref())?;
        let prompt =
            match (self.chat, &tokenizer) {
                (true, Some(t)) => match self.user {
                    Some(user) => Some(chat_prompt(t, self.system, user)?),
                    None => None, // --interactive: the turns come from stdin.
                },
                (true, None) => return Err(failure(
                    "--chat needs the model's tokenizer: --tokenizer, or a tokenizer.json beside the program",
                )),
                (false, _) => text::prompt_ids(self.prompt.as_deref(), self.prompt_ids, tokenizer.as_ref())?,
            };
        let args = run::RunArgs {
            steps: self.steps,
            position: self.position,
            cuda_graph: false,
            hold_position: self.hold_position,
            allow_outside_blobs: self.allow_outside_blobs,
            json: self.json,
            require_zero_copy: self.require_zero_copy,
            prompt,
            inputs: Vec::new(),
            method: None,
            output_dir: None,
            prompt_cache: None,
            branch: None,
            tokenizer,
            generation: None,
        };
        Ok((self.program, self.plugin_dirs, args))
    }
}

/// The ids of `--system` and `--user` rendered with the chat template beside the tokenizer (`chat`).
fn chat_prompt(t: &text::TextTokenizer, system: Option<String>, user: String) -> Result<Vec<i64>, Failure> {
    let rendered = text_gen::ChatTemplate::beside(t)?.render(&text_gen::chat::messages(system, user))?;
    Ok(text_gen::encode(t, "--chat", &rendered, false)?)
}

/// A failure the CLI reports in one line, with the ExecuTorch code where one applies.
pub(crate) struct Failure {
    code: Option<ErrorCode>,
    message: String,
    /// Ends the program without a word and with success: the reader of stdout went away (`| head -1`).
    quiet: bool,
}

impl<E: HasErrorCode + std::fmt::Display> From<E> for Failure {
    fn from(err: E) -> Failure {
        Failure { code: Some(err.error_code()), message: err.to_string(), quiet: false }
    }
}

impl Failure {
    /// A failure with an ExecuTorch code.
    pub(crate) fn coded(code: ErrorCode, message: impl Into<String>) -> Failure {
        Failure { code: Some(code), message: message.into(), quiet: false }
    }
}

/// A usage problem of the command line itself (`InvalidArgument`).
pub(crate) fn failure(message: impl Into<String>) -> Failure {
    Failure::coded(ErrorCode::InvalidArgument, message)
}

/// The command's own stdout: the process's fd 1 as it was at start, kept private, while fd 1 itself now points
/// at stderr. Plugins share the process's file descriptors, so a plugin (or a native library under one) that
/// prints would otherwise interleave its text with ours and break `--json`; this way whatever they print goes
/// to stderr, where logs already go, and stdout carries the command's output only.
#[cfg(unix)]
fn command_stdout() -> &'static std::sync::Mutex<Option<std::fs::File>> {
    static OUT: std::sync::OnceLock<std::sync::Mutex<Option<std::fs::File>>> = std::sync::OnceLock::new();
    OUT.get_or_init(|| {
        // Close-on-exec: a worker started for an isolated plugin must not inherit it (and write into `--json`).
        let private = rustix::io::fcntl_dupfd_cloexec(std::io::stdout(), 0).ok().map(std::fs::File::from);
        // Only once the private copy exists may fd 1 be redirected; if either step fails, fd 1 stays stdout.
        if private.is_some() && rustix::stdio::dup2_stdout(std::io::stderr()).is_err() {
            return std::sync::Mutex::new(None);
        }
        std::sync::Mutex::new(private)
    })
}

/// Writes a command's whole output to stdout. A reader that went away (`| head -1`) ends the program quietly;
/// any other write failure (a full disk) is one `error:` line.
pub(crate) fn emit(text: &str) -> Result<(), Failure> {
    #[cfg(unix)]
    let result = match command_stdout().lock().as_deref_mut() {
        Ok(Some(out)) => out.write_all(text.as_bytes()).and_then(|()| out.flush()),
        _ => write_stdout(text),
    };
    #[cfg(not(unix))]
    let result = write_stdout(text);
    match result {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => {
            Err(Failure { code: None, message: String::new(), quiet: true })
        }
        Err(err) => Err(Failure::coded(ErrorCode::AccessFailed, format!("cannot write to stdout: {err}"))),
    }
}

fn write_stdout(text: &str) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush())
}

/// `text` with every control character escaped (`\n`, `\u{1b}`, ...), so that a name from a file cannot
/// break the one-line error contract or drive the terminal.
pub(crate) fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// A usage error as one line: clap's first line without its `error: ` prefix, then where to read more.
fn usage_error(err: &clap::Error) -> Failure {
    let rendered = err.to_string();
    let mut lines = rendered.lines().map(str::trim).filter(|l| !l.is_empty());
    let first = lines.next().unwrap_or("invalid arguments");
    let first = first.strip_prefix("error: ").unwrap_or(first);
    // "the following required arguments were not provided:" names them on the next line.
    let named = if first.ends_with(':') { lines.next().unwrap_or_default() } else { "" };
    failure(format!("{first} {named} (see delegate-host --help)").replace("  ", " "))
}

fn main() -> ExitCode {
    // Logs go to stderr, coloured only on a terminal, so a redirected stderr holds plain text.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("DELEGATE_HOST_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(true)
        .init();
    let result = match Cli::try_parse() {
        Ok(cli) => {
            // Before any plugin can load (and after clap, whose `--help` belongs on stdout): the command's
            // output keeps the real stdout to itself.
            #[cfg(unix)]
            let _ = command_stdout();
            plugins::set_flags(plugins::PluginFlags {
                probe: cli.probe,
                isolate: cli.isolate,
                deadline: std::time::Duration::from_millis(cli.deadline_ms),
            });
            plugins::refuse_probe_with_isolate(cli.probe, cli.isolate).and_then(|()| dispatch(cli.command))
        }
        // `--help` and `--version` are not errors: clap prints them as it always does.
        Err(err) if !err.use_stderr() => {
            let _ = err.print();
            Ok(())
        }
        Err(err) => Err(usage_error(&err)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure { quiet: true, .. }) => ExitCode::SUCCESS,
        Err(Failure { code, message, .. }) => {
            let message = printable(&message);
            match code {
                Some(code) => eprintln!("error: {message} [{}]", code.name()),
                None => eprintln!("error: {message}"),
            }
            ExitCode::from(2)
        }
    }
}

fn dispatch(command: Command) -> Result<(), Failure> {
    match command {
        Command::Inspect { blob, json, plan: false } => blob::inspect(&blob, json),
        Command::Inspect { blob, json, plan: true } => plan_report::inspect_plan(&blob, json),
        Command::Validate { blob } => blob::validate(&blob),
        Command::Convert { input, output, to } => blob::convert(&input, &output, to),
        Command::Plugins { plugin_dirs, json } => plugins::plugins(&plugin_dirs, json),
        Command::PluginManifest { libraries, isolate } => plugins::write_manifests(&libraries, isolate),
        Command::Worker => plugins::worker(),
        Command::Run {
            common,
            method,
            inputs,
            output_dir,
            mode,
            cuda_graph,
            prompt_cache,
            branch,
            generation,
            interactive,
        } => {
            let system = common.system.clone();
            let (program, plugin_dirs, args) = common.run_args()?;
            let generation = generation.settings(&program, args.tokenizer.is_some())?;
            let steps = args.steps.or(generation.steps);
            let generation = Some(generation);
            let args = run::RunArgs {
                cuda_graph,
                inputs,
                method,
                output_dir,
                prompt_cache,
                branch,
                generation,
                steps,
                ..args
            };
            let mode = run::strict(mode.into(), args.require_zero_copy)?;
            if interactive {
                return interactive::run(&program, mode, &plugin_dirs, args, system);
            }
            run::run_program(&program, mode, &plugin_dirs, &args)
        }
        Command::Bench { common, runs } => {
            let (program, plugin_dirs, args) = common.run_args()?;
            run::bench(&program, runs, &plugin_dirs, &args)
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    fn parse(args: &[&str]) -> Result<Command, clap::Error> {
        Cli::try_parse_from([&["delegate-host"], args].concat()).map(|cli| cli.command)
    }

    #[test]
    fn the_cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    /// `run` and `bench` take the same program arguments, with the same names and rules.
    #[test]
    fn run_and_bench_share_their_program_arguments() {
        let shared = [
            "p.toml",
            "--prompt",
            "1,2",
            "--steps",
            "3",
            "--position",
            "4",
            "--hold-position",
            "--allow-outside-blobs",
            "--plugin-dir",
            "plugins",
            "--json",
            "--require-zero-copy",
        ];
        for command in ["run", "bench"] {
            let parsed = parse(&[&[command][..], &shared].concat()).expect("parses");
            let (Command::Run { common, .. } | Command::Bench { common, .. }) = parsed else {
                panic!("{command} parsed as another command");
            };
            let (program, plugin_dirs, args) = common.run_args().ok().expect("no tokenizer: ids");
            assert_eq!(program, PathBuf::from("p.toml"));
            assert_eq!(plugin_dirs, [PathBuf::from("plugins")]);
            assert_eq!(
                (
                    args.prompt,
                    args.steps,
                    args.position,
                    args.hold_position,
                    args.allow_outside_blobs,
                    args.json
                ),
                (Some(vec![1, 2]), Some(3), Some(4), true, true, true),
                "{command}"
            );
            assert!(args.require_zero_copy, "{command}");
            let err = parse(&[command, "p.toml", "--hold-position"]).err().expect("needs --position");
            assert_eq!(err.kind(), clap::error::ErrorKind::MissingRequiredArgument, "{command}");
        }
    }
}
