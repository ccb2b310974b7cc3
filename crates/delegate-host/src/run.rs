//! `run` and `bench`: a program's generation as a person watches it (progress bar, summary) or as a program
//! reads it (`--json`), and both slot modes side by side; for a program with CUDA memory, GPU time per step
//! (CUDA events), host synchronisations per step, and zero-copy replayed as a CUDA graph where the device
//! loop runs. Programs are TOML manifests or ExecuTorch `.pte` files (told apart by content, `ET12`, or the
//! `.pte` extension). A program that is not a token generator, or one given `--input` or `--method`, runs
//! one method once; `--output-dir` writes its outputs and every buffer as `.npy` files.

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use clap::ValueEnum;
use host_runtime::generate::{default_steps, device_loop_refusal, generate_with, Generation, Options};
use host_runtime::manifest::{Manifest, TensorDecl};
use host_runtime::program::{CopyStats, Mode, Origin, Program};
use serde_json::{json, Value};

use crate::{emit, failure, npy, Failure};

/// How buffer-mutation outputs are passed (`--mode`); the library's [`Mode`] spelled for the command line.
#[derive(Clone, Copy, ValueEnum)]
pub enum ModeArg {
    /// The output slot is the buffer's own storage: the delegate updates it in place, nothing is copied.
    ZeroCopy,
    /// Upstream's behaviour: a separate output slot, the delegate reflects into it, the host writes it back.
    CopyBack,
}

impl From<ModeArg> for Mode {
    fn from(mode: ModeArg) -> Mode {
        match mode {
            ModeArg::ZeroCopy => Mode::ZeroCopy,
            ModeArg::CopyBack => Mode::CopyBack,
        }
    }
}

/// `mode`, made strict ([`Mode::RequireZeroCopy`]) by `--require-zero-copy`, which `--mode copy-back`
/// contradicts.
pub fn strict(mode: Mode, require_zero_copy: bool) -> Result<Mode, Failure> {
    match (mode, require_zero_copy) {
        (mode, false) => Ok(mode),
        (Mode::CopyBack, true) => Err(failure(
            "--require-zero-copy refuses every copy of cache bytes, but --mode copy-back copies them every step; drop one",
        )),
        (_, true) => Ok(Mode::RequireZeroCopy),
    }
}

/// Loads the program at `path`: a `.pte` (with `--prompt`, as a token generator) or a TOML manifest (whose
/// `[generate]` prompt `--prompt` replaces).
pub(crate) fn load(
    path: &Path,
    registry: &host_runtime::plugins::Registry,
    mode: Mode,
    args: &RunArgs,
) -> Result<Program, Failure> {
    if Origin::of_file(path) == Origin::Pte {
        return Ok(host_runtime::pte::load(path, registry, mode, args.prompt.as_deref())?);
    }
    let mut manifest = Manifest::load_with(path, blob_paths(args))?;
    if let Some(prompt) = &args.prompt {
        match &mut manifest.generate {
            Some(generate) => generate.prompt.clone_from(prompt),
            None => {
                return Err(failure(format!(
                    "--prompt: {} has no [generate] section, so it is not a token generator",
                    path.display()
                )))
            }
        }
    }
    Ok(Program::load(manifest, registry, mode)?)
}

/// Why `program` is not a token generator, as the end of a sentence naming it: a `.pte` is one only with
/// `--prompt`, a manifest one only with a `[generate]` section.
fn not_a_generator(program: &Program) -> &'static str {
    match program.origin() {
        Origin::Pte => " until given --prompt",
        _ => " (it has no [generate] section)",
    }
}

fn blob_paths(args: &RunArgs) -> host_runtime::manifest::BlobPaths {
    if args.allow_outside_blobs {
        host_runtime::manifest::BlobPaths::Anywhere
    } else {
        host_runtime::manifest::BlobPaths::WithinProgram
    }
}

/// What `run` and `bench` take besides the program and the plugins.
pub struct RunArgs {
    /// `--steps`.
    pub steps: Option<usize>,
    /// `--position`.
    pub position: Option<i64>,
    /// `--cuda-graph`.
    pub cuda_graph: bool,
    /// `--hold-position`.
    pub hold_position: bool,
    /// `--allow-outside-blobs`.
    pub allow_outside_blobs: bool,
    /// `--json`.
    pub json: bool,
    /// `--require-zero-copy`.
    pub require_zero_copy: bool,
    /// `--prompt`.
    pub prompt: Option<Vec<i64>>,
    /// `--input NAME=FILE.npy`, as given.
    pub inputs: Vec<String>,
    /// `--method`.
    pub method: Option<String>,
    /// `--output-dir`.
    pub output_dir: Option<PathBuf>,
    /// `--prompt-cache`.
    pub prompt_cache: Option<PathBuf>,
    /// `--branch`: a second prompt, run on a fork of the caches.
    pub branch: Option<Vec<i64>>,
    /// The tokenizer (`--tokenizer`, or the tokenizer.json beside the program).
    pub tokenizer: Option<crate::text::TextTokenizer>,
    /// `run`'s sampling and stop settings (`None` for `bench`).
    pub generation: Option<crate::text_run::Settings>,
}

pub(crate) fn options(steps: usize, args: &RunArgs, program: &Program, cuda_graph: bool) -> Options {
    let mut options = Options::steps(steps);
    options.start_position = args.position;
    options.hold_position = args.hold_position;
    options.cuda_graph = cuda_graph;
    options.gpu_timing = program.cuda_context().is_some();
    options
}

pub fn run_program(path: &Path, mode: Mode, dirs: &[PathBuf], args: &RunArgs) -> Result<(), Failure> {
    let json = args.json;
    if args.branch.is_some() {
        crate::branch::refuse_options(args)?;
    }
    let registry = crate::plugins::registry(dirs);
    let mut program = load(path, &registry, mode, args)?;
    if let Some(branch) = &args.branch {
        return run_branch(&mut program, path, branch, mode, args);
    }
    if !args.inputs.is_empty() || args.method.is_some() || program.manifest().generate.is_none() {
        let used = plugins_used(&program, &registry);
        return run_once(&mut program, path, mode, args, &used);
    }
    let steps = default_steps(&program, args.steps, args.position);
    if let Some(settings) = args.generation.as_ref().filter(|s| s.wanted(args.tokenizer.is_some())) {
        let used = plugins_used(&program, &registry);
        return crate::text_run::run(&mut program, steps, mode, args, settings, &used);
    }
    if let Some(file) = &args.prompt_cache {
        if args.position.is_some() || args.hold_position || args.cuda_graph {
            return Err(failure(
                "--prompt-cache decodes from the prompt on the host loop: \
                 it takes no --position, --hold-position or --cuda-graph",
            ));
        }
        return crate::prompt_cache::run(&mut program, file, steps, mode, json);
    }
    if let (true, Some(g)) = (args.cuda_graph, &program.manifest().generate) {
        // Decided at load, before any method runs: a plugin that cannot be captured is refused now.
        program.require_capturable(&g.decode)?;
    }
    if let Some(dir) = &args.output_dir {
        refuse_output_files(&program, dir, &generation_methods(&program, true))?;
    }
    let options = options(steps, args, &program, args.cuda_graph);
    let bar = if std::io::stderr().is_terminal() && !json {
        let bar = indicatif::ProgressBar::new(u64::try_from(steps).unwrap_or(u64::MAX).saturating_add(1));
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
    let generation = generate_with(&mut program, &options, |_, _| {
        bar.inc(1);
        Ok(())
    })?;
    bar.finish_and_clear();
    if let Some(dir) = &args.output_dir {
        write_outputs(&program, dir, &generation_methods(&program, generation.steps.len() > 1))?;
    }
    report(&generation, mode, json, &plugins_used(&program, &registry), None)
}

/// `run --branch`: refused for a program that is not a token generator; the default steps leave room for
/// both branches.
fn run_branch(
    program: &mut Program,
    path: &Path,
    branch: &[i64],
    mode: Mode,
    args: &RunArgs,
) -> Result<(), Failure> {
    let Some(prompt) = program.manifest().generate.as_ref().map(|g| g.prompt.clone()) else {
        return Err(failure(format!(
            "--branch forks a generation, but {} is not a token generator{}",
            path.display(),
            not_a_generator(program)
        )));
    };
    let default = default_steps(program, None, None);
    let steps = crate::branch::steps(default, args.steps, &prompt, branch);
    crate::branch::run(program, branch, steps, mode, args.json)
}

/// The plugin serving each backend the program calls: which one, from where, and whether it runs isolated
/// (item 20 of issue 17: plugin-wide state lives once per worker when it does).
pub(crate) fn plugins_used(program: &Program, registry: &host_runtime::plugins::Registry) -> Vec<Value> {
    let backends: std::collections::BTreeSet<&str> = program
        .manifest()
        .methods
        .values()
        .flat_map(|m| m.calls.iter().map(|c| c.backend.as_str()))
        .collect();
    backends
        .into_iter()
        .filter_map(|backend| {
            let c = registry.candidate_for_backend(backend)?;
            Some(json!({
                "backend": backend,
                "name": c.info.as_ref().map(|i| &i.name),
                "path": c.path,
                "isolated": registry.runs_isolated(c),
            }))
        })
        .collect()
}

/// `plugin for B: NAME (PATH), in process|isolated` lines.
fn plugins_text(used: &[Value]) -> String {
    let mut out = String::new();
    for p in used {
        let _ = writeln!(
            out,
            "plugin for {}: {} ({}), {}",
            p["backend"].as_str().unwrap_or("-"),
            p["name"].as_str().unwrap_or("-"),
            p["path"].as_str().unwrap_or("embedded"),
            if p["isolated"] == true { "isolated" } else { "in process" }
        );
    }
    out
}

/// The method `--method` names, or the program's only method, or `forward`.
fn pick_method(program: &Program, method: Option<&str>) -> Result<String, Failure> {
    let methods = &program.manifest().methods;
    if let Some(name) = method {
        if methods.contains_key(name) {
            return Ok(name.to_owned());
        }
        let all: Vec<_> = methods.keys().map(String::as_str).collect();
        return Err(failure(format!(
            "--method {name}: the program has no method '{name}' (its methods: {})",
            all.join(", ")
        )));
    }
    if methods.len() == 1 {
        return Ok(methods.keys().next().expect("one method").clone());
    }
    if methods.contains_key("forward") {
        return Ok("forward".to_owned());
    }
    let all: Vec<_> = methods.keys().map(String::as_str).collect();
    Err(failure(format!("the program has methods {}: say which to run with --method", all.join(", "))))
}

/// `name` as one file name component (path separators and control characters replaced by `_`).
fn file_part(name: &str) -> String {
    name.chars().map(|c| if c == '/' || c == '\\' || c.is_control() { '_' } else { c }).collect()
}

/// The methods whose outputs a generation leaves: prefill, and decode when it ran (`decoded`).
fn generation_methods(program: &Program, decoded: bool) -> Vec<String> {
    let Some(g) = &program.manifest().generate else { return Vec::new() };
    let mut methods = vec![g.prefill.clone()];
    if g.decode != g.prefill && decoded {
        methods.push(g.decode.clone());
    }
    methods
}

/// A tensor `--output-dir` writes.
enum Written<'p> {
    /// Output `decl` of `method`.
    Output { method: &'p str, decl: &'p TensorDecl },
    /// A buffer.
    Buffer(&'p TensorDecl),
}

/// Every file `--output-dir` writes for `methods`, with its tensor: each (non-internal) output of `methods`
/// as `DIR/output.<method>.<output>.npy`, each buffer as `DIR/buffer.<buffer>.npy`.
fn output_files<'p>(program: &'p Program, dir: &Path, methods: &'p [String]) -> Vec<(PathBuf, Written<'p>)> {
    let manifest = program.manifest();
    let outputs = methods.iter().flat_map(|method| {
        let decls = manifest.methods[method].outputs.iter();
        decls.filter(|d| !host_runtime::pte::is_internal(&d.name)).map(move |decl| {
            let path = dir.join(format!("output.{}.{}.npy", file_part(method), file_part(&decl.name)));
            (path, Written::Output { method, decl })
        })
    });
    let buffers = manifest
        .buffers
        .iter()
        .map(|(name, decl)| (dir.join(format!("buffer.{}.npy", file_part(name))), Written::Buffer(decl)));
    outputs.chain(buffers).collect()
}

/// Refuses, before anything runs, an `--output-dir` where a file it would write for `methods` is something
/// other than a regular file (a FIFO, a device, a symbolic link): [`npy::write`] refuses it again when it
/// writes.
fn refuse_output_files(program: &Program, dir: &Path, methods: &[String]) -> Result<(), Failure> {
    for (path, _) in output_files(program, dir, methods) {
        crate::out_file::refuse_special(&path).map_err(|source| npy::Error::Write { path, source })?;
    }
    Ok(())
}

/// Writes every file [`output_files`] names for `methods` (outputs as their last run left them, buffers'
/// values) into `dir`, created if missing.
fn write_outputs(program: &Program, dir: &Path, methods: &[String]) -> Result<Vec<PathBuf>, Failure> {
    std::fs::create_dir_all(dir).map_err(|source| npy::Error::Write { path: dir.to_owned(), source })?;
    let mut written = Vec::new();
    for (path, tensor) in output_files(program, dir, methods) {
        match tensor {
            Written::Output { method, decl } => {
                let bytes = program.read_output(method, &decl.name)?;
                npy::write(&path, &format!("output '{}' of method '{method}'", decl.name), decl, &bytes)?;
            }
            Written::Buffer(decl) => {
                let bytes = program.buffer(&decl.name)?;
                npy::write(&path, &format!("buffer '{}'", decl.name), decl, &bytes)?;
            }
        }
        written.push(path);
    }
    Ok(written)
}

/// Runs one method once with the `--input`s (other inputs zero), then reports it and writes `--output-dir`.
fn run_once(
    program: &mut Program,
    path: &Path,
    mode: Mode,
    args: &RunArgs,
    used: &[Value],
) -> Result<(), Failure> {
    let method = pick_method(program, args.method.as_deref())?;
    let decl = program.manifest().methods[&method].clone();
    if let Some(dir) = &args.output_dir {
        refuse_output_files(program, dir, std::slice::from_ref(&method))?;
    }
    for arg in &args.inputs {
        let (name, file) = npy::split(arg)?;
        let input = decl.inputs.iter().find(|d| d.name == name).ok_or_else(|| npy::Error::UnknownInput {
            name: name.clone(),
            path: file.clone(),
            method: method.clone(),
            inputs: decl.inputs.iter().map(|d| d.name.as_str()).collect::<Vec<_>>().join(", "),
        })?;
        let bytes = npy::read_input(&method, input, &file)?;
        program.write_input(&method, &name, &bytes)?;
    }
    let stats = program.execute(&method)?;
    let written = match &args.output_dir {
        Some(dir) => write_outputs(program, dir, std::slice::from_ref(&method))?,
        None => Vec::new(),
    };
    let outputs: Vec<_> = decl
        .outputs
        .iter()
        .filter(|d| !host_runtime::pte::is_internal(&d.name))
        .map(|d| json!({"name": d.name, "dtype": d.dtype.name(), "shape": d.shape}))
        .collect();
    if args.json {
        let value = json!({
            "program": path,
            "mode": mode,
            "method": method,
            "elapsed_us": stats.elapsed.as_secs_f64() * 1e6,
            "bytes_copied": stats.copies,
            "bytes_copied_total": stats.copies.total(),
            "outputs": outputs,
            "written": written,
            "plugins": used,
        });
        return emit(&format!("{value}\n"));
    }
    let mut out = format!(
        "method {method}: ran once in {:.1} us ({} mode)\nbytes copied: {}\n",
        stats.elapsed.as_secs_f64() * 1e6,
        mode.name(),
        copies_text(&stats.copies)
    );
    for d in decl.outputs.iter().filter(|d| !host_runtime::pte::is_internal(&d.name)) {
        let _ = writeln!(out, "output {}: {} {:?}", d.name, d.dtype, d.shape);
    }
    for path in &written {
        let _ = writeln!(out, "wrote {}", path.display());
    }
    out.push_str(&plugins_text(used));
    emit(&out)
}

/// `N (reflect R, write-back W, staging S, host ops O)`.
fn copies_text(copies: &CopyStats) -> String {
    format!(
        "{} (reflect {}, write-back {}, staging {}, host ops {})",
        copies.total(),
        copies.reflect_bytes,
        copies.writeback_bytes,
        copies.staged_bytes,
        copies.op_bytes
    )
}

/// Reports a generation; `stream`: what streaming measured, when the tokens streamed (`--json`'s
/// `stats.stream`).
pub(crate) fn report(
    generation: &Generation,
    mode: Mode,
    json: bool,
    used: &[Value],
    stream: Option<&Value>,
) -> Result<(), Failure> {
    let time = generation.mean_decode_time();
    let copies = generation.mean_decode_copies();
    let gpu = generation.mean_decode_gpu_micros();
    // Time to first token: the prompt's runs (the prefill method's chunks and any tail through decode).
    let prefill = generation.steps.first();
    if json {
        let value = json!({
            "mode": mode,
            "tokens": generation.tokens,
            "steps": generation.steps,
            "stats": {
                "time_to_first_token_ms": prefill.map(|s| s.micros / 1e3),
                "prefill_calls": prefill.map(|s| s.calls),
                "decode_steps": generation.steps.len().saturating_sub(1),
                "mean_decode_step_us": time.as_secs_f64() * 1e6,
                "mean_decode_bytes_copied": copies,
                "mean_decode_bytes_copied_total": copies.total(),
                "mean_decode_gpu_us": gpu,
                "host_syncs_per_decode_step": generation.host_syncs_per_decode_step(),
                "readback_host_syncs": generation.readback_host_syncs,
                "device_loop": generation.device_loop,
                "cuda_graph": generation.cuda_graph,
                "capture_us": generation.capture_micros,
            },
            "plugins": used,
        });
        let mut value = value;
        if let Some(stream) = stream {
            value["stats"]["stream"] = stream.clone();
        }
        return emit(&format!("{value}\n"));
    }
    let mut out = format!(
        "tokens: {:?}\nsteps: prefill ({} calls, {:.1} ms) + {} decode, \
         {:.1} us per decode step on the host ({} mode{})\n\
         bytes copied per decode step: {}\n",
        generation.tokens,
        prefill.map_or(0, |s| s.calls),
        prefill.map_or(0.0, |s| s.micros / 1e3),
        generation.steps.len().saturating_sub(1),
        time.as_secs_f64() * 1e6,
        mode.name(),
        match (generation.device_loop, generation.cuda_graph) {
            (true, true) => ", device loop, CUDA graph",
            (true, false) => ", device loop",
            _ => "",
        },
        copies_text(&copies)
    );
    if let Some(gpu) = gpu {
        let _ = writeln!(
            out,
            "GPU time per decode step: {gpu:.1} us; host synchronisations per decode step: {}",
            generation.host_syncs_per_decode_step()
        );
    }
    out.push_str(&plugins_text(used));
    emit(&out)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Runs `runs` generations (the first a warm-up) and summarises the measured decode steps as one row.
fn bench_row(
    program: &mut Program,
    mode: Mode,
    steps: usize,
    runs: usize,
    args: &RunArgs,
    cuda_graph: bool,
) -> Result<serde_json::Value, Failure> {
    let options = options(steps, args, program, cuda_graph);
    let (mut times, mut gpu_times) = (Vec::new(), Vec::new());
    let (mut syncs, mut measured_runs) = (0u64, 0u64);
    let mut last = None;
    for run in 0..runs {
        program.reset_buffers()?;
        let generation = generate_with(program, &options, |_, _| Ok(()))?;
        if run > 0 {
            times.extend(generation.steps.iter().skip(1).map(|s| s.micros));
            gpu_times.extend(generation.steps.iter().skip(1).filter_map(|s| s.gpu_micros));
            syncs += generation.host_syncs;
            measured_runs += 1;
        }
        last = Some(generation);
    }
    times.sort_by(f64::total_cmp);
    gpu_times.sort_by(f64::total_cmp);
    let last = last.expect("at least two runs");
    let copies = last.mean_decode_copies();
    let gpu = |p| (!gpu_times.is_empty()).then(|| percentile(&gpu_times, p));
    Ok(json!({
        "mode": mode,
        "cuda_graph": last.cuda_graph,
        "device_loop": last.device_loop,
        "decode_steps_measured": times.len(),
        "median_us": percentile(&times, 0.5),
        "p10_us": percentile(&times, 0.1),
        "p90_us": percentile(&times, 0.9),
        "gpu_median_us": gpu(0.5),
        "gpu_p10_us": gpu(0.1),
        "gpu_p90_us": gpu(0.9),
        "host_syncs_per_step": syncs as f64 / (measured_runs.max(1) as f64 * steps as f64),
        "bytes_copied_per_step": copies.total(),
        "reflect_bytes_per_step": copies.reflect_bytes,
        "writeback_bytes_per_step": copies.writeback_bytes,
        "staged_bytes_per_step": copies.staged_bytes,
        "op_bytes_per_step": copies.op_bytes,
    }))
}

pub fn bench(path: &Path, runs: usize, dirs: &[PathBuf], args: &RunArgs) -> Result<(), Failure> {
    let registry = crate::plugins::registry(dirs);
    let mut rows = Vec::new();
    let mut steps = 0;
    for mode in [strict(Mode::ZeroCopy, args.require_zero_copy)?, Mode::CopyBack] {
        let mut program = load(path, &registry, mode, args)?;
        if program.manifest().generate.is_none() {
            return Err(failure(format!(
                "bench measures decode steps, but {} is not a token generator{}",
                path.display(),
                not_a_generator(&program)
            )));
        }
        steps = default_steps(&program, args.steps, args.position);
        if steps == 0 || runs < 2 {
            return Err(failure("bench needs --steps >= 1 and --runs >= 2 (the first run is a warm-up)"));
        }
        rows.push(bench_row(&mut program, mode, steps, runs, args, false)?);
        // Zero-copy replayed as a CUDA graph, where the device loop runs (the program keeps its generation
        // on the GPU).
        let decode = program.manifest().generate.as_ref().map(|g| g.decode.clone()).unwrap_or_default();
        if mode != Mode::CopyBack
            && device_loop_refusal(&program)?.is_none()
            && program.capture_refusal(&decode)?.is_none()
        {
            rows.push(bench_row(&mut program, mode, steps, runs, args, true)?);
        }
    }
    if args.json {
        let report = json!({
            "program": path,
            "steps": steps,
            "position": args.position,
            "hold_position": args.hold_position,
            "runs": runs - 1,
            "modes": rows,
        });
        return emit(&format!("{report}\n"));
    }
    emit(&bench_table(path, steps, runs, args, &rows))
}

/// `bench`'s rows as a table: a title line, a header, one line per mode (GPU columns when any row has them).
fn bench_table(path: &Path, steps: usize, runs: usize, args: &RunArgs, rows: &[Value]) -> String {
    let gpu = rows.iter().any(|r| !r["gpu_median_us"].is_null());
    let mut out = format!(
        "{}: {} decode steps{} x {} runs per mode (after 1 warm-up run)\n",
        path.display(),
        steps,
        args.position.map(|p| format!(" from position {p}")).unwrap_or_default(),
        runs - 1
    );
    let _ = write!(
        out,
        "{:<16} {:>12} {:>12} {:>12} {:>16} {:>14} {:>14}",
        "mode", "median us", "p10 us", "p90 us", "bytes/step", "reflect", "write-back"
    );
    if gpu {
        let _ = write!(out, " {:>12} {:>12}", "GPU us", "syncs/step");
    }
    out.push('\n');
    for r in rows {
        let name = match (r["mode"].as_str().unwrap_or("?"), r["cuda_graph"].as_bool()) {
            (mode, Some(true)) => format!("{mode}+graph"),
            (mode, _) => mode.to_owned(),
        };
        let _ = write!(
            out,
            "{:<16} {:>12.1} {:>12.1} {:>12.1} {:>16} {:>14} {:>14}",
            name,
            r["median_us"].as_f64().unwrap_or(0.0),
            r["p10_us"].as_f64().unwrap_or(0.0),
            r["p90_us"].as_f64().unwrap_or(0.0),
            r["bytes_copied_per_step"].as_u64().unwrap_or(0),
            r["reflect_bytes_per_step"].as_u64().unwrap_or(0),
            r["writeback_bytes_per_step"].as_u64().unwrap_or(0),
        );
        if gpu {
            let _ = write!(
                out,
                " {:>12.1} {:>12.2}",
                r["gpu_median_us"].as_f64().unwrap_or(0.0),
                r["host_syncs_per_step"].as_f64().unwrap_or(0.0)
            );
        }
        out.push('\n');
    }
    out
}
