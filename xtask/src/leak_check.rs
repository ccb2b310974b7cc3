//! The leak check (issue 10): the reference delegate's plugin library, loaded from disk, through 1 000 full
//! program lifetimes (every `init`, `execute` and `destroy` of the ABI) under valgrind, against a run of a few
//! cycles. What leaks once (the plugin library, which the host never unloads by design) is the same in both;
//! anything that leaks per cycle makes the 1 000-cycle run's leak summary larger and fails the check, as does
//! any memory error valgrind reports beyond those of the short run.
//!
//! valgrind is installed with apt-get when missing.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context};

use crate::util::{apt_install, cargo, run_cmd, target_dir};

/// Cycles of the long run.
const CYCLES: usize = 1000;
/// Cycles of the baseline run.
const BASELINE: usize = 3;

/// Builds the `cycles` example and the plugin library, runs both under valgrind and compares their summaries.
pub fn run(root: &Path) -> anyhow::Result<()> {
    if Command::new("valgrind").arg("--version").output().map(|o| !o.status.success()).unwrap_or(true) {
        eprintln!("xtask: valgrind not found; installing it with apt-get (the leak check needs it)");
        apt_install("valgrind")?;
    }
    run_cmd(
        root,
        cargo().args([
            "build",
            "-p",
            "host-runtime",
            "--example",
            "cycles",
            "-p",
            "reference-delegate-dylib",
        ]),
    )?;
    let debug = target_dir(root)?.join("debug");
    // Only the reference plugin's library: nothing else from the target dir is loaded.
    let plugins = tempfile::tempdir().context("creating a plugin directory")?;
    let library =
        format!("{}reference_delegate_dylib{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX);
    std::fs::copy(debug.join(&library), plugins.path().join(&library))
        .context("copying the plugin library")?;
    let example = debug.join("examples").join("cycles");
    let baseline = summary(&example, plugins.path(), BASELINE)?;
    let long = summary(&example, plugins.path(), CYCLES)?;
    eprintln!("xtask: leak check: {BASELINE} cycles: {baseline}; {CYCLES} cycles: {long}");
    if long != baseline {
        bail!("the leak summary grows with the number of init/execute/destroy cycles: {BASELINE} cycles: {baseline}; {CYCLES} cycles: {long}");
    }
    Ok(())
}

/// valgrind's leak and error summary lines for `cycles` cycles, joined: e.g.
/// `definitely lost: 86 bytes in 2 blocks, ..., ERROR SUMMARY: 2 errors from 2 contexts`.
fn summary(example: &Path, plugins: &Path, cycles: usize) -> anyhow::Result<String> {
    let output = Command::new("valgrind")
        .args(["--leak-check=full", "--errors-for-leak-kinds=definite"])
        .arg(example)
        .arg(plugins)
        .arg(cycles.to_string())
        .output()
        .context("starting valgrind")?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() || !stdout.contains(&format!("cycles: {cycles} ")) {
        bail!("the cycles example failed under valgrind ({}):\n{stdout}\n{stderr}", output.status);
    }
    // Without leaks valgrind prints "All heap blocks were freed" instead of the three leak lines.
    let wanted =
        ["definitely lost:", "indirectly lost:", "possibly lost:", "All heap blocks", "ERROR SUMMARY:"];
    let lines: Vec<&str> = stderr
        .lines()
        .filter_map(|line| {
            // Strip valgrind's `==pid== ` prefix and the suppression count.
            let text = line.split_once("== ").map_or(line, |(_, rest)| rest).trim();
            let text = text.split(" (suppressed").next().unwrap_or(text);
            wanted.iter().any(|w| text.starts_with(w)).then_some(text)
        })
        .collect();
    if !lines.iter().any(|l| l.starts_with("ERROR SUMMARY:")) {
        bail!("valgrind printed no summary:\n{stderr}");
    }
    Ok(lines.join(", "))
}
