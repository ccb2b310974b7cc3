//! `cargo xtask test`'s Python part: the ExecuTorch side's tests (`python/kv_delegate/tests`: the partitioner,
//! the lowering against torch eager's tokens in ExecuTorch's runtime, the memory plan), under pytest in
//! `.cache/export-venv` (set up by `export_venv`, pytest [`PYTEST`] added).
//!
//! Every tool they need is built here and named to them, `KV_DELEGATE_PACK` (the packer), `KV_ET_RUN`
//! (ExecuTorch's runtime with our delegates) and `KV_DELEGATE_HOST`, and `KV_DELEGATE_TESTS_STRICT=1` makes a
//! test that would skip fail instead (`tests/conftest.py`): no check is left out because a tool or a package is
//! missing. pytest collecting no test (exit code 5) is a failure too.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context};

use crate::{export_venv, util};

/// pytest, pinned.
const PYTEST: &str = "pytest==9.2.0";
/// The tests, relative to the project root.
const TESTS: &str = "python/kv_delegate/tests";
/// pytest's exit code when it collected no test.
const NO_TESTS_COLLECTED: i32 = 5;

/// Sets up the venv, builds `delegate-pack`, `et-run` and `delegate-host` with `with_env` (the environment the
/// workspace was built in, so nothing is rebuilt) and runs the tests, failing on any failure, skip or empty
/// collection.
pub fn run(root: &Path, with_env: &dyn Fn(Command) -> Command) -> anyhow::Result<()> {
    let python = export_venv::ensure(root)?;
    if !export_venv::imports(&python, "pytest") {
        eprintln!("xtask: installing {PYTEST}");
        export_venv::pip_install(root, &python, &[PYTEST])?;
    }
    util::run_cmd(
        root,
        with_env(util::cargo()).args([
            "build",
            "-p",
            "delegate-pack",
            "-p",
            "executorch-bridge",
            "-p",
            "delegate-host",
            "--bin",
            "delegate-pack",
            "--bin",
            "et-run",
            "--bin",
            "delegate-host",
        ]),
    )?;
    let debug = util::target_dir(root)?.join("debug");
    // Not `with_env`: its LD_LIBRARY_PATH (NVRTC's wheel) is for our crates, and would shadow torch's own.
    let mut pytest = Command::new(&python);
    pytest
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", TESTS])
        .current_dir(root)
        .env("PYTHONPATH", root.join("python").join("kv_delegate"))
        .env("KV_DELEGATE_PACK", debug.join("delegate-pack"))
        .env("KV_ET_RUN", debug.join("et-run"))
        .env("KV_DELEGATE_HOST", debug.join("delegate-host"))
        .env("KV_DELEGATE_TESTS_STRICT", "1");
    util::stdout_to_stderr(&mut pytest);
    eprintln!("$ {} -m pytest -q -p no:cacheprovider {TESTS}", python.display());
    let start = Instant::now();
    let status = pytest.status().with_context(|| format!("cannot start {}", python.display()))?;
    let took = start.elapsed().as_secs();
    verdict(status.code(), took)?;
    eprintln!("xtask test: the Python tests passed in {}m{:02}s", took / 60, took % 60);
    Ok(())
}

/// pytest's exit code as a result: 0 passes; 5 (no test collected) fails like any other code, or a signal.
fn verdict(code: Option<i32>, took: u64) -> anyhow::Result<()> {
    match code {
        Some(0) => Ok(()),
        Some(NO_TESTS_COLLECTED) => bail!("pytest collected no test in {TESTS}"),
        Some(code) => bail!("the Python tests in {TESTS} failed (pytest exit code {code}, after {took} s)"),
        None => bail!("the Python tests in {TESTS} were killed by a signal (after {took} s)"),
    }
}

#[cfg(test)]
mod tests {
    use super::verdict;

    #[test]
    fn only_exit_code_zero_passes_and_an_empty_collection_is_named() {
        assert!(verdict(Some(0), 1).is_ok());
        let empty = verdict(Some(5), 1).expect_err("exit code 5 fails").to_string();
        assert!(empty.contains("collected no test"), "{empty}");
        for code in [Some(1), Some(2), Some(4), None] {
            assert!(verdict(code, 1).is_err(), "{code:?}");
        }
    }
}
