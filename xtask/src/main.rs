//! `cargo xtask`: the project's maintainer tasks, one module per task.
//!
//! Run `cargo xtask --help`. Every task works from a fresh clone: it installs or builds what it needs.

mod acceptance;
mod codegen;
mod demo;
mod gpu;
mod nvrtc_setup;
mod test;
mod trt_setup;
mod util;

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Maintainer tasks for the delegate workspace")]
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
    /// Write the example decoder's blobs and program manifest into DIR.
    ExportExample {
        /// Which delegate the blobs are for.
        #[arg(long, value_enum, default_value_t = Backend::Reference)]
        backend: Backend,
        /// Output directory.
        dir: PathBuf,
        /// The bigger configuration (8 layers, 8 heads x 64, max length 1024).
        #[arg(long)]
        big: bool,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Backend {
    /// The reference delegate (CPU op graph).
    Reference,
    /// The TensorRT delegate: engines built on this machine with TensorRT-RTX (installed when missing).
    Tensorrt,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let root = util::project_root();
    match cli.task {
        Task::Demo => demo::run(&root),
        Task::Test => test::run(&root),
        Task::Codegen { check } => codegen::run(&root, check),
        Task::GpuTest => gpu::bundle(&root, "test"),
        Task::BenchGpu => gpu::bundle(&root, "bench"),
        Task::ExportExample { backend: Backend::Reference, dir, big } => {
            let cfg = if big { kv_example::Config::big() } else { kv_example::Config::tiny() };
            kv_example::export::reference(&cfg, &dir)?;
            println!("wrote the example program to {}", dir.display());
            Ok(())
        }
        Task::ExportExample { backend: Backend::Tensorrt, dir, big } => {
            // Building engines needs `trt-build`, whose bindings need libclang at build time, so it runs as its
            // own program after the set-up rather than inside xtask.
            let trt = trt_setup::ensure(&root)?;
            let dir = std::path::absolute(&dir)?;
            let mut cmd = util::cargo();
            trt.apply(&mut cmd);
            cmd.args(["run", "--release", "-p", "kv-example-trt", "--example", "export_example", "--"])
                .arg(&dir);
            if big {
                cmd.arg("--big");
            }
            util::run_cmd(&root, &mut cmd)
        }
    }
}
