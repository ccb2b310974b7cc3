//! `export_decode`: GPU time per decode step of an exported program's graph on the CUDA delegate, from a
//! hollow graph (`python -m kv_delegate.export_bench`: the reference-graph payload a real model's export
//! delegates, without its constants), filled from a seed here (`support/hollow.rs`) and run as the delegate
//! runs the exported program: the same graph, packed, initialised and called through the plugin ABI, replayed
//! as a CUDA graph at a held position (`support/decode.rs`, as `hf_decode` times the hand-built graph).
//!
//! ```text
//! export_decode --graph FILE.rgd [--position P] [--steps N] [--seed S] [--check]
//! ```
//!
//! Prints one JSON object with `hf_decode`'s keys (`gpu_us_per_step`, `bytes_per_step`, `position`, the
//! sizes) and the versions that exported the graph. `--check` reads and fills the graph and prints its op
//! counts and bytes per step without a GPU. The committed graphs are `fixtures/bench/*.rgd` (their README).

use std::path::PathBuf;
use std::process::ExitCode;

mod support;

use support::hollow::Hollow;

struct Args {
    graph: PathBuf,
    position: u64,
    steps: usize,
    seed: u64,
    check: bool,
}

fn parse() -> Result<Args, String> {
    let (mut graph, mut position, mut steps, mut seed, mut check) = (None, 1024u64, 100usize, 45u64, false);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |v: String| v.parse::<u64>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--graph" => graph = Some(PathBuf::from(value()?)),
            "--position" => position = number(value()?)?,
            "--steps" => steps = number(value()?)? as usize,
            "--seed" => seed = number(value()?)?,
            "--check" => check = true,
            "--bench" => {} // what `cargo bench` passes
            other => return Err(format!("unknown argument {other}")),
        }
    }
    let graph = graph.ok_or("--graph FILE.rgd is required (a hollow graph: fixtures/bench/*.rgd)")?;
    Ok(Args { graph, position, steps: steps.max(1), seed, check })
}

fn run(args: Args) -> Result<String, String> {
    let started = std::time::Instant::now();
    let hollow = Hollow::read(&args.graph).map_err(|e| e.to_string())?;
    let shape = &hollow.shape;
    if args.position >= shape.sizes.max_len {
        return Err(format!("--position {} is outside the {}-row cache", args.position, shape.sizes.max_len));
    }
    let graph = hollow.fill(args.seed).map_err(|e| e.to_string())?;
    let build_s = started.elapsed().as_secs_f64();
    let (kept, filled) = hollow.kept_and_filled();
    let extra = serde_json::json!({
        "graph": "exported", "file": args.graph.display().to_string(), "model": shape.model,
        "made_by": hollow.made_by, "op_counts": hollow.op_counts, "constants_kept": kept,
        "constants_filled": filled, "seed": args.seed,
    });
    let timed = if args.check {
        support::decode::Timed::default()
    } else {
        support::decode::time_decode(&graph, args.position as i64, args.steps)?
    };
    Ok(support::report::json(&shape.sizes, &graph, args.position, args.steps, &timed, build_s, extra))
}

fn main() -> ExitCode {
    support::report::finish("export_decode", parse().and_then(run))
}
