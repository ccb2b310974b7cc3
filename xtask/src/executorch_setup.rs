//! `cargo xtask test` setup for `executorch-bridge`: ExecuTorch 1.5.1's C++ runtime and headers, from PyPI's
//! `executorch==1.5.1` wheel, downloaded with `python3 -m pip download --no-deps` (no torch, nothing
//! installed) into `<root>/.cache/executorch/` and unpacked there with Python's `zipfile`.
//!
//! The wheel's `executorch/` directory has `include/` (the runtime's headers), `lib/libexecutorch.so` (the
//! core runtime and the `Module` API) and `lib/libexecutorch_kernels_optimized.so` (+ its thread pool); they
//! depend only on glibc/libstdc++. [`EXECUTORCH_ROOT_ENV`] points `executorch-bridge`'s build script at it.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The environment variable `executorch-bridge`'s `build.rs` reads: the wheel's `executorch/` directory.
pub const EXECUTORCH_ROOT_ENV: &str = "EXECUTORCH_ROOT";

/// The PyPI wheel.
pub const WHEEL_REQUIREMENT: &str = "executorch==1.5.1";

/// Where the wheel is, once [`ensure`] has run.
#[derive(Debug, Clone)]
pub struct ExecutorchEnv {
    /// The unpacked `executorch/` package directory (with `include/` and `lib/`).
    pub root: PathBuf,
}

impl ExecutorchEnv {
    /// Sets [`EXECUTORCH_ROOT_ENV`] on the command.
    pub fn apply(&self, cmd: &mut Command) {
        cmd.env(EXECUTORCH_ROOT_ENV, &self.root);
    }
}

/// Downloads and unpacks the wheel unless `libexecutorch.so` is already there. Idempotent: no network I/O
/// once it is.
pub fn ensure(root: &Path) -> anyhow::Result<ExecutorchEnv> {
    let cache = root.join(".cache").join("executorch");
    let unpacked = cache.join("executorch-1.5.1");
    let package = unpacked.join("executorch");
    let lib = package.join("lib").join("libexecutorch.so");
    crate::util::pip_wheel(&cache, WHEEL_REQUIREMENT, "executorch-1.5.1-", &unpacked, &lib)?;
    for needed in ["lib/libexecutorch_kernels_optimized.so", "include/executorch/extension/module/module.h"] {
        anyhow::ensure!(package.join(needed).is_file(), "the executorch wheel has no {needed}");
    }
    Ok(ExecutorchEnv { root: package })
}

/// `cargo xtask executorch-setup`: installs the wheel and prints the variable to export.
pub fn run(root: &Path) -> anyhow::Result<()> {
    let env = ensure(root)?;
    println!("{EXECUTORCH_ROOT_ENV}={}", env.root.display());
    Ok(())
}
