//! `xtask-example demo`: the demo's steps once `cargo xtask demo` has built the host and the reference plugin
//! (and written its manifest) in one release directory.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};
use xtask::util::run_cmd;

/// Exports the example decoder into `out`, runs it through `release`'s `delegate-host` in both modes, then
/// checks every step against the independent f64 model with the plugin loaded from `release`.
pub fn run(release: &Path, out: &Path) -> anyhow::Result<()> {
    let host = release.join(format!("delegate-host{}", std::env::consts::EXE_SUFFIX));
    let cfg = kv_example::Config::tiny();
    kv_example::export::reference(&cfg, out).context("exporting the example decoder")?;
    println!("exported the example decoder to {}", out.display());

    // Prefill writes the prompt's positions; decode fills the rest of the cache.
    let steps = cfg.max_decode_steps();
    let program = out.join("program.toml");
    for mode in ["zero-copy", "copy-back"] {
        println!("\n== delegate-host run --mode {mode} --steps {steps}");
        run_cmd(
            release,
            Command::new(&host)
                .arg("run")
                .arg(&program)
                .args(["--steps", &steps.to_string(), "--mode", mode])
                .arg("--plugin-dir")
                .arg(release),
        )?;
    }

    println!("\n== acceptance check (reference plugin loaded from {})", release.display());
    let (report, _) = crate::acceptance::run(&program, &[PathBuf::from(release)], &cfg, steps)?;
    println!("{report}");
    if !report.passed() {
        bail!("the acceptance check failed");
    }
    Ok(())
}
