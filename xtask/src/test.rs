//! `cargo xtask test`: everything CI checks, in the order that fails fastest.

use std::path::Path;

use crate::util::{cargo, run_cmd};

/// Runs fmt, codegen --check, clippy and the whole test suite (with the real plugin dylibs built first).
pub fn run(root: &Path) -> anyhow::Result<()> {
    run_cmd(root, cargo().args(["fmt", "--all", "--check"]))?;
    crate::codegen::run(root, true)?;
    // Plugin dylibs are loaded from disk by the tests; build them first so the tests do not build them again
    // under a second cargo lock.
    run_cmd(root, cargo().args(["build", "-p", "reference-delegate", "-p", "abi-test"]))?;
    let plugin_dir = root.join("target").join("debug");
    run_cmd(root, cargo().args(["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"]))?;
    run_cmd(root, cargo().args(["test", "--workspace"]).env("DELEGATE_TEST_PLUGIN_DIR", &plugin_dir))?;
    eprintln!("xtask test: all checks passed");
    Ok(())
}
