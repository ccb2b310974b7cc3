//! `delegate-host`: inspect, validate and convert delegate blobs; list plugins; run programs.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use blob_format::model::{Header, Role};
use blob_format::Blob;
use clap::{Parser, Subcommand, ValueEnum};
use et_error::{ErrorCode, HasErrorCode};
use host_runtime::blob_file::BlobFile;
use host_runtime::generate::{generate, Generation};
use host_runtime::manifest::Manifest;
use host_runtime::plugins::Registry;
use host_runtime::program::{Mode, Program};
use serde_json::json;

/// Runs TensorRT and reference delegates over caller-owned KV caches.
#[derive(Parser)]
#[command(name = "delegate-host", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print what a blob says: format, backend, bindings in delegate-argument order, aliases, engine extent.
    Inspect {
        /// The blob file.
        blob: PathBuf,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
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
    /// Run a program: prefill once, then decode steps feeding back the argmax token.
    Run {
        /// The program manifest (TOML).
        program: PathBuf,
        /// Decode steps after prefill [default: as many as the caches hold, or 15 when the program does not
        /// say]
        #[arg(long)]
        steps: Option<usize>,
        /// How buffer-mutation outputs are passed.
        #[arg(long, value_enum, default_value_t = Mode::ZeroCopy)]
        mode: Mode,
        /// Directories to search for plugins before `DELEGATE_PLUGIN_PATH`.
        #[arg(long = "plugin-dir")]
        plugin_dirs: Vec<PathBuf>,
        /// Print one JSON object (per-step summaries and stats) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Measure decode steps of a program in both modes, side by side: time per step and bytes copied per step.
    Bench {
        /// The program manifest (TOML).
        program: PathBuf,
        /// Decode steps per run, each from zeroed caches [default: as many as the caches hold, or 15]
        #[arg(long)]
        steps: Option<usize>,
        /// Runs per mode; the first is a warm-up and is not counted.
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Directories to search for plugins before `DELEGATE_PLUGIN_PATH`.
        #[arg(long = "plugin-dir")]
        plugin_dirs: Vec<PathBuf>,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Target {
    /// Our native format, current version.
    Native,
    /// Torch-TensorRT 2.14's layout (magic TR02, or TR01 when there are no aliases, as upstream writes it).
    Tr02,
}

/// A failure the CLI reports in one line, with the ExecuTorch code where one applies.
struct Failure {
    code: Option<ErrorCode>,
    message: String,
}

impl<E: HasErrorCode + std::fmt::Display> From<E> for Failure {
    fn from(err: E) -> Failure {
        Failure { code: Some(err.error_code()), message: err.to_string() }
    }
}

fn failure(message: impl Into<String>) -> Failure {
    Failure { code: None, message: message.into() }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("DELEGATE_HOST_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_target(true)
        .init();
    let cli = Cli::parse();
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure { code, message }) => {
            let message = message.replace('\n', " ");
            match code {
                Some(code) => eprintln!("error: {message} [{}]", code.name()),
                None => eprintln!("error: {message}"),
            }
            ExitCode::from(2)
        }
    }
}

fn run(command: Command) -> Result<(), Failure> {
    match command {
        Command::Inspect { blob, json } => inspect(&blob, json),
        Command::Validate { blob } => validate(&blob),
        Command::Convert { input, output, to } => convert(&input, &output, to),
        Command::Plugins { plugin_dirs, json } => plugins(&plugin_dirs, json),
        Command::Run { program, steps, mode, plugin_dirs, json } => {
            run_program(&program, steps, mode, &plugin_dirs, json)
        }
        Command::Bench { program, steps, runs, plugin_dirs, json } => {
            bench(&program, steps, runs, &plugin_dirs, json)
        }
    }
}

fn open(path: &Path) -> Result<BlobFile, Failure> {
    BlobFile::open(path).map_err(|err| Failure {
        code: Some(ErrorCode::AccessFailed),
        message: format!("cannot read {}: {err}", path.display()),
    })
}

fn parse<'a>(path: &Path, file: &'a BlobFile) -> Result<Blob<'a>, Failure> {
    Blob::parse(file.bytes()).map_err(|err| Failure {
        code: Some(err.error_code()),
        message: format!("{}: {err}", path.display()),
    })
}

fn names(header: &Header, role: Role) -> Vec<&str> {
    header.threaded(role).map(|b| b.name.as_str()).collect()
}

fn inspect(path: &Path, json: bool) -> Result<(), Failure> {
    let file = open(path)?;
    let blob = parse(path, &file)?;
    let h = &blob.header;
    if json {
        let bindings: Vec<_> = h
            .bindings
            .iter()
            .map(|b| {
                json!({
                    "name": b.name,
                    "role": b.role.as_str(),
                    "dtype": b.dtype.map(|d| d.name()),
                    "shape": b.shape.as_ref().map(|s| s.iter().map(|d| match d {
                        blob_format::model::Dim::Static(n) => json!(n),
                        blob_format::model::Dim::Dynamic => json!(null),
                    }).collect::<Vec<_>>()),
                    "threaded": b.threaded,
                })
            })
            .collect();
        let aliases: Vec<_> = h
            .aliases
            .iter()
            .map(|a| json!({"output": a.output, "input": a.input, "kind": a.kind.as_str()}))
            .collect();
        let value = json!({
            "format": blob.format.name(),
            "version": blob.format.version(),
            "backend": h.backend_id,
            "payload_kind": h.payload_kind.as_str(),
            "producer": h.producer.as_ref().map(|p| json!({"name": p.name, "version": p.version})),
            "inputs": names(h, Role::Input),
            "outputs": names(h, Role::Output),
            "bindings": bindings,
            "aliases": aliases,
            "device_id": h.device_id,
            "hardware_compatible": h.hardware_compatible,
            "hardware_target": h.hardware_target,
            "engine_library_version": h.engine_library_version,
            "engine_offset": blob.engine_offset(),
            "engine_size": blob.engine.len(),
        });
        println!("{value}");
        return Ok(());
    }
    let mut out = String::new();
    use std::fmt::Write as _;
    let _ = writeln!(out, "format:   {}", blob.format);
    let _ = writeln!(out, "backend:  {}", h.backend_id);
    let _ = writeln!(
        out,
        "payload:  {} ({} bytes at offset {})",
        h.payload_kind,
        blob.engine.len(),
        blob.engine_offset()
    );
    if let Some(p) = &h.producer {
        let _ = writeln!(out, "producer: {} {}", p.name, p.version);
    }
    let _ = writeln!(out, "device:   {}", h.device_id);
    if let Some(v) = &h.engine_library_version {
        let _ = writeln!(out, "library:  {v}");
    }
    if let Some(t) = &h.hardware_target {
        let _ = writeln!(out, "target:   {t}");
    }
    let _ = writeln!(out, "bindings (delegate-argument order):");
    let mut position = 0;
    for b in &h.bindings {
        let arg = if b.threaded {
            position += 1;
            format!("arg {:>2}", position - 1)
        } else {
            "  (not threaded)".to_owned()
        };
        let dtype = b.dtype.map_or("?".to_owned(), |d| d.to_string());
        let shape =
            b.shape.as_ref().map_or("?".to_owned(), |s| blob_format::model::DisplayShape(s).to_string());
        let _ = writeln!(out, "  {arg}  {:<6} {:<24} {dtype:<5} {shape}", b.role.as_str(), b.name);
    }
    if h.aliases.is_empty() {
        let _ = writeln!(out, "aliases:  none");
    } else {
        let _ = writeln!(out, "aliases:");
        for a in &h.aliases {
            let _ = writeln!(out, "  {} <- {} ({})", a.output, a.input, a.kind);
        }
    }
    print!("{out}");
    Ok(())
}

fn validate(path: &Path) -> Result<(), Failure> {
    let file = open(path)?;
    let blob = parse(path, &file)?;
    blob.verify_payload().map_err(|err| Failure {
        code: Some(err.error_code()),
        message: format!("{}: {err}", path.display()),
    })?;
    let plan = alias_validate::validate_format(&blob.header).map_err(|err| Failure {
        code: Some(err.error_code()),
        message: format!("{}: {err}", path.display()),
    })?;
    for warning in plan.warnings() {
        eprintln!("warning: {warning}");
    }
    println!(
        "ok: {} blob for {}, {} bindings, {} aliases, {} engine bytes",
        blob.format,
        blob.header.backend_id,
        blob.header.bindings.len(),
        plan.aliases().len(),
        blob.engine.len()
    );
    Ok(())
}

fn convert(input: &Path, output: &Path, to: Target) -> Result<(), Failure> {
    let file = open(input)?;
    let blob = parse(input, &file)?;
    let write_err = |err: std::io::Error| Failure {
        code: Some(ErrorCode::AccessFailed),
        message: format!("cannot write {}: {err}", output.display()),
    };
    let mut out = std::io::BufWriter::new(std::fs::File::create(output).map_err(write_err)?);
    match to {
        Target::Native => {
            blob_format::native::write(&blob.header, blob.engine, &mut out).map_err(write_err)?
        }
        Target::Tr02 => {
            let bytes = blob_format::upstream::write_tr02(&blob.header, blob.engine).map_err(|err| {
                let _ = std::fs::remove_file(output);
                Failure {
                    code: Some(err.error_code()),
                    message: format!("{}: cannot convert to tr02: {err}", input.display()),
                }
            })?;
            out.write_all(&bytes).map_err(write_err)?;
        }
    }
    out.flush().map_err(write_err)?;
    Ok(())
}

fn plugins(dirs: &[PathBuf], json: bool) -> Result<(), Failure> {
    let registry = Registry::discover(dirs, true, true);
    if json {
        let value = serde_json::to_string(registry.candidates()).map_err(|e| failure(e.to_string()))?;
        println!("{value}");
    } else {
        print!("{}", registry.table());
    }
    Ok(())
}

/// `--steps`, or as many decode steps as the program's caches hold, or 15.
fn default_steps(manifest: &Manifest, steps: Option<usize>) -> usize {
    steps.or_else(|| manifest.generate.as_ref().and_then(|g| g.max_decode_steps())).unwrap_or(15)
}

fn run_program(
    path: &Path,
    steps: Option<usize>,
    mode: Mode,
    dirs: &[PathBuf],
    json: bool,
) -> Result<(), Failure> {
    let manifest = Manifest::load(path)?;
    let steps = default_steps(&manifest, steps);
    let registry = Registry::discover(dirs, true, true);
    let mut program = Program::load(manifest, &registry, mode)?;
    let bar = if std::io::stderr().is_terminal() && !json {
        let bar = indicatif::ProgressBar::new(steps as u64 + 1);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{spinner} {msg} [{bar:30}] {pos}/{len} steps")
                .expect("static template")
                .progress_chars("=> "),
        );
        bar.set_message("decoding");
        bar
    } else {
        indicatif::ProgressBar::hidden()
    };
    let generation = generate(&mut program, steps, |_, _| {
        bar.inc(1);
        Ok(())
    })?;
    bar.finish_and_clear();
    report(&generation, mode, json);
    Ok(())
}

fn report(generation: &Generation, mode: Mode, json: bool) {
    let time = generation.mean_decode_time();
    let copies = generation.mean_decode_copies();
    if json {
        let value = json!({
            "mode": mode,
            "tokens": generation.tokens,
            "steps": generation.steps,
            "stats": {
                "decode_steps": generation.steps.len().saturating_sub(1),
                "mean_decode_step_us": time.as_secs_f64() * 1e6,
                "mean_decode_bytes_copied": copies,
                "mean_decode_bytes_copied_total": copies.total(),
            },
        });
        println!("{value}");
        return;
    }
    println!("tokens: {:?}", generation.tokens);
    println!(
        "steps: prefill + {} decode, {:.1} us per decode step ({} mode)",
        generation.steps.len().saturating_sub(1),
        time.as_secs_f64() * 1e6,
        mode.name()
    );
    println!(
        "bytes copied per decode step: {} (reflect {}, write-back {}, staging {})",
        copies.total(),
        copies.reflect_bytes,
        copies.writeback_bytes,
        copies.staged_bytes
    );
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn bench(
    path: &Path,
    steps: Option<usize>,
    runs: usize,
    dirs: &[PathBuf],
    json: bool,
) -> Result<(), Failure> {
    let manifest = Manifest::load(path)?;
    let steps = default_steps(&manifest, steps);
    if steps == 0 || runs < 2 {
        return Err(failure("bench needs --steps >= 1 and --runs >= 2 (the first run is a warm-up)"));
    }
    let registry = Registry::discover(dirs, true, true);
    let mut rows = Vec::new();
    for mode in [Mode::ZeroCopy, Mode::CopyBack] {
        let mut program = Program::load(manifest.clone(), &registry, mode)?;
        let mut times = Vec::new();
        let mut bytes = None;
        for run in 0..runs {
            program.reset_buffers()?;
            let generation = generate(&mut program, steps, |_, _| Ok(()))?;
            if run > 0 {
                times.extend(generation.steps.iter().skip(1).map(|s| s.micros));
            }
            bytes = Some(generation.mean_decode_copies());
        }
        times.sort_by(f64::total_cmp);
        let copies = bytes.unwrap_or_default();
        rows.push(json!({
            "mode": mode,
            "decode_steps_measured": times.len(),
            "median_us": percentile(&times, 0.5),
            "p10_us": percentile(&times, 0.1),
            "p90_us": percentile(&times, 0.9),
            "bytes_copied_per_step": copies.total(),
            "reflect_bytes_per_step": copies.reflect_bytes,
            "writeback_bytes_per_step": copies.writeback_bytes,
            "staged_bytes_per_step": copies.staged_bytes,
        }));
    }
    if json {
        println!("{}", json!({ "program": path, "steps": steps, "runs": runs - 1, "modes": rows }));
        return Ok(());
    }
    println!("{}: {} decode steps x {} runs per mode (after 1 warm-up run)", path.display(), steps, runs - 1);
    println!(
        "{:<10} {:>12} {:>12} {:>12} {:>16} {:>14} {:>14}",
        "mode", "median us", "p10 us", "p90 us", "bytes/step", "reflect", "write-back"
    );
    for r in &rows {
        println!(
            "{:<10} {:>12.1} {:>12.1} {:>12.1} {:>16} {:>14} {:>14}",
            r["mode"].as_str().unwrap_or("?"),
            r["median_us"].as_f64().unwrap_or(0.0),
            r["p10_us"].as_f64().unwrap_or(0.0),
            r["p90_us"].as_f64().unwrap_or(0.0),
            r["bytes_copied_per_step"].as_u64().unwrap_or(0),
            r["reflect_bytes_per_step"].as_u64().unwrap_or(0),
            r["writeback_bytes_per_step"].as_u64().unwrap_or(0),
        );
    }
    Ok(())
}
