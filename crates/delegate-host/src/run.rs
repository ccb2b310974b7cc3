//! `run` and `bench`: a program's generation as a person watches it (progress bar, summary) or as a program
//! reads it (`--json`), and both slot modes side by side.

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use clap::ValueEnum;
use host_runtime::generate::{generate, Generation};
use host_runtime::manifest::Manifest;
use host_runtime::plugins::Registry;
use host_runtime::program::{Mode, Program};
use serde_json::json;

use crate::{emit, failure, Failure};

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

/// `--steps`, or as many decode steps as the program's caches hold, or 15.
fn default_steps(manifest: &Manifest, steps: Option<usize>) -> usize {
    steps.or_else(|| manifest.generate.as_ref().and_then(|g| g.max_decode_steps())).unwrap_or(15)
}

pub fn run_program(
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
    report(&generation, mode, json)
}

fn report(generation: &Generation, mode: Mode, json: bool) -> Result<(), Failure> {
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
        return emit(&format!("{value}\n"));
    }
    emit(&format!(
        "tokens: {:?}\nsteps: prefill + {} decode, {:.1} us per decode step ({} mode)\n\
         bytes copied per decode step: {} (reflect {}, write-back {}, staging {})\n",
        generation.tokens,
        generation.steps.len().saturating_sub(1),
        time.as_secs_f64() * 1e6,
        mode.name(),
        copies.total(),
        copies.reflect_bytes,
        copies.writeback_bytes,
        copies.staged_bytes
    ))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

pub fn bench(
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
        return emit(&format!(
            "{}\n",
            json!({ "program": path, "steps": steps, "runs": runs - 1, "modes": rows })
        ));
    }
    let mut out = format!(
        "{}: {} decode steps x {} runs per mode (after 1 warm-up run)\n",
        path.display(),
        steps,
        runs - 1
    );
    let _ = writeln!(
        out,
        "{:<10} {:>12} {:>12} {:>12} {:>16} {:>14} {:>14}",
        "mode", "median us", "p10 us", "p90 us", "bytes/step", "reflect", "write-back"
    );
    for r in &rows {
        let _ = writeln!(
            out,
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
    emit(&out)
}
