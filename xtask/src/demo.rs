//! `cargo xtask demo`: the project's main job on the reference delegate, end to end.

use std::path::Path;

use anyhow::{bail, Context};

use crate::util::{cargo, run_cmd, target_dir, write_plugin_manifests};

/// Builds the host and the reference plugin, exports the example, runs it through `delegate-host` in both
/// modes, then checks every step against the independent f64 model.
pub fn run(root: &Path) -> anyhow::Result<()> {
    run_cmd(
        root,
        cargo().args(["build", "--release", "-p", "delegate-host", "-p", "reference-delegate-dylib"]),
    )?;
    let target = target_dir(root)?;
    let release = target.join("release");
    let host = release.join(format!("delegate-host{}", std::env::consts::EXE_SUFFIX));
    // The plugin library is found through its manifest, so `run` loads it from disk (and nothing else).
    write_plugin_manifests(&release, &host, &["reference_delegate_dylib"], |_| {})?;
    let dir = target.join("demo");
    let cfg = kv_example::Config::tiny();
    kv_example::export::reference(&cfg, &dir).context("exporting the example decoder")?;
    println!("exported the example decoder to {}", dir.display());

    // Prefill writes the prompt's positions; decode fills the rest of the cache.
    let steps = cfg.max_decode_steps();
    let program = dir.join("program.toml");
    for mode in ["zero-copy", "copy-back"] {
        println!("\n== delegate-host run --mode {mode} --steps {steps}");
        run_cmd(
            root,
            std::process::Command::new(&host)
                .arg("run")
                .arg(&program)
                .args(["--steps", &steps.to_string(), "--mode", mode])
                .arg("--plugin-dir")
                .arg(&release),
        )?;
    }

    println!("\n== acceptance check (reference plugin loaded from {})", release.display());
    let (report, _) = crate::acceptance::run(&program, &[release], &cfg, steps)?;
    println!("{report}");
    if !report.passed() {
        bail!("the acceptance check failed");
    }
    Ok(())
}
