//! Writes the example program for a benchmark configuration, on a machine without a Rust toolchain (the GPU
//! machine runs this from the bundle `cargo xtask bench-gpu` builds).
//!
//! ```text
//! export <a|b|c|tiny|big> DIR [--backend reference|cuda] [--memory host|device|managed] [--config-json PATH]
//! ```
//!
//! `--config-json` also writes the config as JSON, which `gpu/torch_baseline.py` reads to build the same
//! model with the same weights.

use std::path::PathBuf;
use std::process::ExitCode;

use kv_example::export::{Backend, Target};
use kv_example::{BenchConfig, Config};
use program_manifest::MemoryKind;

fn usage(message: &str) -> ExitCode {
    eprintln!(
        "[InvalidArgument] {message}\nusage: export <a|b|c|tiny|big> DIR [--backend reference|cuda] [--memory host|device|managed] [--config-json PATH]"
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(which), Some(dir)) = (args.first(), args.get(1)) else {
        return usage("a config and a directory are needed");
    };
    let cfg = match which.as_str() {
        "tiny" => Config::tiny(),
        "big" => Config::big(),
        name => match BenchConfig::from_name(name) {
            Some(bench) => Config::bench(bench),
            None => return usage(&format!("unknown config '{name}'")),
        },
    };
    let mut target = Target::REFERENCE;
    let mut config_json: Option<PathBuf> = None;
    let mut rest = args[2..].iter();
    while let Some(flag) = rest.next() {
        let Some(value) = rest.next() else { return usage(&format!("{flag} needs a value")) };
        match flag.as_str() {
            "--backend" => {
                target.backend = match value.as_str() {
                    "reference" => Backend::Reference,
                    "cuda" => Backend::Cuda,
                    other => return usage(&format!("unknown backend '{other}'")),
                }
            }
            "--memory" => match MemoryKind::from_name(value) {
                Some(memory) => target.memory = memory,
                None => return usage(&format!("unknown memory kind '{value}'")),
            },
            "--config-json" => config_json = Some(PathBuf::from(value)),
            other => return usage(&format!("unknown option '{other}'")),
        }
    }
    match kv_example::export::program(&cfg, dir.as_ref(), &target) {
        Ok(program) => println!("wrote {}", program.manifest_path.display()),
        Err(err) => {
            eprintln!("[{:?}] {err}", et_error::HasErrorCode::error_code(&err));
            return ExitCode::from(1);
        }
    }
    if let Some(path) = config_json {
        if let Err(err) = std::fs::write(&path, cfg.to_json()) {
            eprintln!("[AccessFailed] cannot write {}: {err}", path.display());
            return ExitCode::from(1);
        }
    }
    ExitCode::SUCCESS
}
