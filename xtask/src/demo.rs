//! `cargo xtask demo`: the project's main job on the reference delegate, end to end.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context};

use crate::on_demand::Tool;
use crate::util::{cargo, run_cmd, target_dir, write_plugin_manifests};

/// Builds the host, the reference plugin and `xtask-example` in one release build (they share host-runtime
/// and kv-example), writes the plugin's manifest, then has `xtask-example demo` export the example, run it
/// through `delegate-host` in both modes and check every step against the independent f64 model.
pub fn run(root: &Path) -> anyhow::Result<()> {
    let example = Tool::Example.package();
    run_cmd(
        root,
        cargo().args([
            "build",
            "--release",
            "-p",
            "delegate-host",
            "-p",
            "reference-delegate-dylib",
            "-p",
            example,
        ]),
    )?;
    let target = target_dir(root)?;
    let release = target.join("release");
    let exe = |name: &str| release.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    // The plugin library is found through its manifest, so `run` loads it from disk (and nothing else).
    write_plugin_manifests(&release, &exe("delegate-host"), &["reference_delegate_dylib"], |_| {})?;
    // Its report is the demo's answer: on xtask's stdout.
    let status = Command::new(exe(example))
        .arg("demo")
        .arg(&release)
        .arg(target.join("demo"))
        .current_dir(root)
        .status()
        .with_context(|| format!("cannot start {}", exe(example).display()))?;
    if !status.success() {
        bail!("the demo failed ({status})");
    }
    Ok(())
}
