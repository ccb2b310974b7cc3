//! `cargo xtask`: the project's maintainer tasks, one module per task.
//!
//! Run `cargo xtask --help`. Every task works from a fresh clone: it installs or builds what it needs.
//!
//! This binary is thin (clap, anyhow, serde_json, tempfile): `cargo xtask demo` and `cargo xtask test` compile
//! it before anything else. Tasks with heavy dependencies run in their own packages, built when first asked
//! for ([`on_demand`]): `release`, `dist`, `compat`, `package-check` and `plot-bench` in `xtask-release`,
//! `export-example` and the demo's checks in `xtask-example`.

mod codegen;
mod demo;
mod export_hf;
mod export_pte;
mod export_venv;
mod gpu;
mod leak_check;
mod nvrtc_setup;
mod python_test;
mod test;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
// The shared helpers, under the paths the tasks name them by (`crate::util`, ...).
use xtask::on_demand::{self, Tool};
use xtask::{executorch_setup, trt_setup, util};

#[derive(Parser)]
#[command(bin_name = "cargo xtask", about = "Maintainer tasks for the delegate workspace")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Build the host and the reference plugin, export the example decoder, run prefill and decode until its
    /// caches are full, and check every step against an independent f64 model; ends with `kv-decode: PASS`.
    Demo,
    /// Everything CI checks: fmt, codegen --check, clippy, tests.
    Test,
    /// The Python tests alone (`python/kv_delegate/tests`, part of `test`): sets up `.cache/export-venv`, builds
    /// delegate-pack, et-run and delegate-host, and runs pytest with every skip a failure.
    PythonTest,
    /// Install the executorch 1.5.1 wheel (runtime, kernels, headers; no torch) under .cache/executorch/ and
    /// print the EXECUTORCH_ROOT that `executorch-bridge` builds against.
    ExecutorchSetup,
    /// 1 000 init/execute/destroy cycles of the reference plugin library under valgrind, against a few: the
    /// leak summary must not grow (part of `test`).
    LeakCheck,
    /// Regenerate committed generated code (flatbuffers), or check it is current.
    Codegen {
        /// Fail if the committed code differs from what would be generated.
        #[arg(long)]
        check: bool,
    },
    /// Build the GPU bundle (release host, CUDA delegate, GPU test executables) and print the one command
    /// that runs every GPU test on a GPU machine.
    GpuTest,
    /// Build the GPU bundle and print the command that runs the side-by-side benchmark (ours and PyTorch's)
    /// on a GPU machine.
    BenchGpu,
    /// Export the example decoder as ExecuTorch `.pte` programs for ReferenceBackend (every variant: caches as
    /// mutable buffers or delegate-owned, one or two methods, with and without the KV-alias memory plan), plus
    /// torch eager's tokens and logits, into DIR; sets up torch and executorch 1.5.1 in `.cache/export-venv`.
    ExportPte {
        /// Output directory (the committed fixtures are `fixtures/executorch`).
        dir: PathBuf,
        /// Export the TensorRTBackend programs instead (TensorRT-RTX engines built here on the CPU; the
        /// library is installed when missing).
        #[arg(long)]
        tensorrt: bool,
    },
    /// A Hugging Face checkpoint folder (config.json, *.safetensors, tokenizer files) to a program: `python -m
    /// kv_delegate export-hf ARGS` in `.cache/export-venv` (set up first) with `delegate-pack` built, e.g.
    /// `cargo xtask export-hf DIR --dtype bf16 --max-len 2048 --out model.pte` (`-- --help` lists ARGS).
    ExportHf {
        /// The exporter's arguments: DIR --backend reference|cuda --dtype f32|f16|bf16 --max-len N --out FILE.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Tasks another package runs (see [`on_demand`]).
    #[command(flatten)]
    OnDemand(OnDemandTask),
}

/// The tasks of `xtask-release` and `xtask-example`: their arguments go to the package's binary as they are, so
/// `cargo xtask release --help` is its help.
#[derive(Subcommand)]
enum OnDemandTask {
    /// Reproducible release bundles: each plugin library with its manifest, README and SHA256SUMS, and the
    /// `delegate-host` binary with the docs a plugin author needs, as `.tar.gz` plus `dist-manifest.json`
    /// (`dist --help` for the flags; runs `xtask-release`).
    #[command(disable_help_flag = true)]
    Dist(Forwarded),
    /// The compatibility gate: golden blobs of every wire-format version read to the same model; the previous
    /// release's plugins (`fixtures/releases/<version>/`) load in the new host and the new plugins in its host;
    /// one entry symbol per plugin, the root interface unchanged, ABI/wire-format changes in the changelog
    /// (`compat --help` for the flags; runs `xtask-release`).
    #[command(disable_help_flag = true)]
    Compat(Forwarded),
    /// Draw the GPU benchmark's `summary.json` (from `run.sh bench`) as an SVG bar chart: `plot-bench SUMMARY
    /// OUT` (runs `xtask-release`).
    #[command(disable_help_flag = true)]
    PlotBench(Forwarded),
    /// The release plan of every publishable crate (writes nothing): last release, commits since, semver check,
    /// STABILITY.md tier, proposed version and why, dependents bumped. `--execute` applies it; `--execute
    /// --registry NAME` publishes it (`release --help` for the flags; runs `xtask-release`). stdout holds the plan
    /// (`--json`: as JSON) and the publish report.
    #[command(disable_help_flag = true)]
    Release(Forwarded),
    /// Check what `cargo publish` would upload, for every publishable crate: metadata, packaged files, tests
    /// that read outside their package, dev-dependency cycles (runs `xtask-release`).
    #[command(disable_help_flag = true)]
    PackageCheck(Forwarded),
    /// Write the example decoder's blobs and program manifest into DIR: `export-example [--backend
    /// reference|cuda|tensorrt] [--big | --config a|b|c] [--memory host|device|managed] DIR` (`export-example
    /// --help` for the flags; runs `xtask-example`).
    #[command(disable_help_flag = true)]
    ExportExample(Forwarded),
}

impl OnDemandTask {
    /// The package that runs the task, the task's name there, and its arguments.
    fn split(self) -> (Tool, &'static str, Vec<OsString>) {
        match self {
            OnDemandTask::Dist(f) => (Tool::Release, "dist", f.args),
            OnDemandTask::Compat(f) => (Tool::Release, "compat", f.args),
            OnDemandTask::PlotBench(f) => (Tool::Release, "plot-bench", f.args),
            OnDemandTask::Release(f) => (Tool::Release, "release", f.args),
            OnDemandTask::PackageCheck(f) => (Tool::Release, "package-check", f.args),
            OnDemandTask::ExportExample(f) => (Tool::Example, "export-example", f.args),
        }
    }
}

/// The arguments of a task another package runs, passed on as they are.
#[derive(clap::Args)]
struct Forwarded {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<OsString>,
}

fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    let root = util::project_root();
    let done = match cli.task {
        Task::Demo => demo::run(&root),
        Task::Test => test::run(&root),
        Task::PythonTest => {
            let executorch = executorch_setup::ensure(&root)?;
            python_test::run(&root, &|mut cmd| {
                executorch.apply(&mut cmd);
                cmd
            })
        }
        Task::LeakCheck => leak_check::run(&root),
        Task::Codegen { check } => codegen::run(&root, check),
        Task::ExecutorchSetup => executorch_setup::run(&root),
        Task::GpuTest => gpu::bundle(&root, "test"),
        Task::BenchGpu => gpu::bundle(&root, "bench"),
        Task::ExportPte { dir, tensorrt } => export_pte::run(&root, &dir, tensorrt),
        Task::ExportHf { args } => export_hf::run(&root, &args),
        Task::OnDemand(task) => {
            let (tool, name, args) = task.split();
            return on_demand::forward(&root, tool, name, args);
        }
    };
    done.map(|()| ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use xtask::on_demand::{EXAMPLE_TASKS, RELEASE_TASKS};

    use super::*;

    /// `cargo xtask release --json`, `cargo xtask compat --help`, ...: every task of the other packages reaches
    /// its package under its own name with every argument as the user typed it (`--help` included).
    #[test]
    fn every_task_of_the_other_packages_is_forwarded_with_its_arguments_as_given() {
        let tasks = RELEASE_TASKS
            .map(|t| (t, Tool::Release))
            .into_iter()
            .chain(EXAMPLE_TASKS.map(|t| (t, Tool::Example)));
        for (task, tool) in tasks {
            let args = ["--help", "--json", "a b", "-x"];
            let cli = Cli::try_parse_from(["xtask", task].into_iter().chain(args))
                .unwrap_or_else(|err| panic!("`cargo xtask {task}` does not parse: {err}"));
            let Task::OnDemand(on_demand) = cli.task else { panic!("`{task}` is not forwarded") };
            let (forwarded_to, name, forwarded) = on_demand.split();
            assert_eq!((forwarded_to, name), (tool, task));
            assert_eq!(forwarded, args.map(OsString::from));
        }
    }
}
