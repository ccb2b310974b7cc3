//! Tasks whose code lives in a package of its own, built the first time one of them runs: `cargo xtask demo`
//! and the first steps of `cargo xtask test` compile neither.
//!
//! - [`Tool::Release`], `xtask-release` (`xtask/release/`): `release`, `dist`, `compat`, `package-check`,
//!   `plot-bench`; what needs HTTP (ureq, rustls), archives, plots, `cargo_metadata` and the host runtime.
//! - [`Tool::Example`], `xtask-example` (`xtask/example/`): `export-example` and the demo's export and
//!   acceptance check, linked against host-runtime and kv-example. Built in release mode, the profile the
//!   demo builds `delegate-host` in, so those crates compile once.

use std::ffi::OsString;
use std::path::Path;
use std::process::{Command, ExitCode};

use anyhow::Context;

use crate::util::{cargo, run_cmd};

/// The tasks `xtask-release` carries, as `cargo xtask` names them.
pub const RELEASE_TASKS: [&str; 5] = ["dist", "compat", "plot-bench", "release", "package-check"];

/// The tasks `xtask-example` carries for users (its `demo` is the demo's second half, run by `cargo xtask demo`).
pub const EXAMPLE_TASKS: [&str; 1] = ["export-example"];

/// A task package.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tool {
    /// `xtask-release`.
    Release,
    /// `xtask-example`.
    Example,
}

impl Tool {
    /// The package (and binary) name.
    pub fn package(self) -> &'static str {
        match self {
            Tool::Release => "xtask-release",
            Tool::Example => "xtask-example",
        }
    }

    /// The cargo profile it is built in (`cargo build`'s flag).
    pub fn profile_args(self) -> &'static [&'static str] {
        match self {
            Tool::Release => &[],
            Tool::Example => &["--release"],
        }
    }

    /// `cargo run` of the tool with `args`, in this workspace whatever the current directory is (which the
    /// tool keeps: relative paths in `args` mean what the user meant).
    fn command(self, root: &Path, args: &[OsString]) -> Command {
        let mut cmd = cargo();
        cmd.arg("run").arg("--manifest-path").arg(root.join("Cargo.toml"));
        cmd.args(self.profile_args()).args(["-p", self.package(), "--"]).args(args);
        cmd
    }
}

/// `cargo xtask TASK ARGS` for a task `tool` carries: the tool runs `TASK ARGS` as given (`--help` included).
/// Its standard output is xtask's (`release --json` prints the plan there) and its exit status xtask's.
pub fn forward(root: &Path, tool: Tool, task: &str, args: Vec<OsString>) -> anyhow::Result<ExitCode> {
    let mut all = vec![OsString::from(task)];
    all.extend(args);
    let status = tool
        .command(root, &all)
        .status()
        .with_context(|| format!("cannot start cargo to run {}", tool.package()))?;
    // Killed by a signal: no code to pass on, and still a failure.
    Ok(status.code().map_or(ExitCode::FAILURE, |code| ExitCode::from(u8::try_from(code).unwrap_or(1))))
}

/// Runs `tool` with `args` as a step of another task: echoed, its output to stderr, a failure an error.
pub fn run_step(root: &Path, tool: Tool, args: &[&str]) -> anyhow::Result<()> {
    let args: Vec<OsString> = args.iter().map(OsString::from).collect();
    run_cmd(root, &mut tool.command(root, &args))
}
