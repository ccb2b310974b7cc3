//! `cargo xtask test`: everything CI checks, in the order that fails fastest.

use std::path::Path;
use std::process::Command;

use crate::trt_setup;
use crate::util::{cargo, run_cmd};

/// Installs what the tests need (libclang for `trtx`'s bindings, the TensorRT-RTX library, `flatc`), then
/// runs fmt, codegen --check, clippy and the whole test suite with the real plugin dylibs built first.
pub fn run(root: &Path) -> anyhow::Result<()> {
    run_cmd(root, cargo().args(["fmt", "--all", "--check"]))?;
    crate::codegen::run(root, true)?;
    let trt = trt_setup::ensure(root)?;
    let with_trt = |mut cmd: Command| {
        trt.apply(&mut cmd);
        cmd
    };
    // Plugin dylibs are loaded from disk by the tests; build them first so the tests do not build them again
    // under a second cargo lock.
    run_cmd(
        root,
        with_trt(cargo()).args([
            "build",
            "-p",
            "reference-delegate",
            "-p",
            "abi-test",
            "-p",
            "tensorrt-delegate",
        ]),
    )?;
    run_cmd(
        root,
        with_trt(cargo()).args(["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"]),
    )?;
    let plugin_dir = root.join("target").join("debug");
    run_cmd(
        root,
        with_trt(cargo()).args(["test", "--workspace"]).env("DELEGATE_TEST_PLUGIN_DIR", &plugin_dir),
    )?;
    eprintln!("xtask test: all checks passed");
    Ok(())
}
