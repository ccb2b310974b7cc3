//! `cargo xtask`: the project's maintainer tasks, one module per task.
//!
//! Run `cargo xtask --help`. Every task works from a fresh clone: it installs or builds what it needs.

mod acceptance;
mod codegen;
mod compat;
mod demo;
mod dist;
mod executorch_setup;
mod export_hf;
mod export_pte;
mod export_venv;
mod gpu;
mod leak_check;
mod nvrtc_setup;
mod plot;
mod python_test;
mod release;
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
    /// The Python tests alone (`python/kv_delegate/tests`, part of `test`): sets up `.cache/export-venv`, builds
    /// delegate-pack, et-run and delegate-host, and runs pytest with every skip a failure.
    PythonTest,
    /// Install the executorch 1.5.1 wheel (runtime, kernels, headers; no torch) under .cache/executorch/ and
    /// print the EXECUTORCH_ROOT that `executorch-bridge` builds against.
    ExecutorchSetup,
    /// 1 000 init/execute/destroy cycles of the reference plugin library under valgrind, against a few: the
    /// leak summary must not grow (part of `test`).
    LeakCheck,
    /// Reproducible release bundles: each plugin library with its manifest, README and SHA256SUMS, and the
    /// `delegate-host` binary with the docs a plugin author needs, as `.tar.gz` plus `dist-manifest.json`.
    Dist {
        /// Output directory (default: `<target>/dist/bundles`).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Leave out the TensorRT plugin (it needs libclang and the TensorRT-RTX wheel to build).
        #[arg(long)]
        no_tensorrt: bool,
        /// Instead of bundling: build a second time in another target directory and compare the binaries
        /// byte for byte (slow: a second full release build).
        #[arg(long, conflicts_with = "out")]
        rebuild_check: bool,
    },
    /// The compatibility gate: golden blobs of every wire-format version read to the same model; the previous
    /// release's plugins (`fixtures/releases/<version>/`) load in the new host and the new plugins in its host;
    /// one entry symbol per plugin, the root interface unchanged, ABI/wire-format changes in the changelog.
    Compat {
        /// This tree's bundles, as `dist --out` wrote them (default: run `dist` first).
        #[arg(long)]
        dist: Option<PathBuf>,
        /// Leave out the TensorRT plugin when building the bundles.
        #[arg(long)]
        no_tensorrt: bool,
    },
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
    /// Draw the GPU benchmark's `summary.json` (from `run.sh bench`) as an SVG bar chart.
    PlotBench {
        /// The summary written by `gpu/summarize.py`.
        summary: PathBuf,
        /// The SVG to write.
        out: PathBuf,
    },
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
    /// The release plan of every publishable crate (writes nothing): last release, commits since, semver check,
    /// STABILITY.md tier, proposed version and why, dependents bumped. `--execute` applies it (versions,
    /// `[workspace.dependencies]` requirements, changelogs); `--execute --registry NAME`, on the committed
    /// applied plan, publishes every publishable crate at the version its Cargo.toml carries, in dependency
    /// order, skipping versions the registry has (a failed run resumes), recording each in releases.toml and
    /// tagging it `<crate>-v<version>`. Never crates.io. What the tools it runs print goes to stderr, so
    /// stdout holds the plan (`--json`: as JSON) and the publish report.
    Release {
        #[command(flatten)]
        plan: release::command::PlanArgs,
        #[command(flatten)]
        publish: release::publish::PublishArgs,
    },
    /// Check what `cargo publish` would upload, for every publishable crate: metadata, packaged files, tests
    /// that read outside their package, dev-dependency cycles (part of `test`).
    PackageCheck,
    /// Write the example decoder's blobs and program manifest into DIR.
    ExportExample {
        /// Which delegate the blobs are for.
        #[arg(long, value_enum, default_value_t = Backend::Reference)]
        backend: Backend,
        /// Output directory.
        dir: PathBuf,
        /// The bigger configuration (8 layers, 8 heads x 64, max length 1024, f32).
        #[arg(long, conflicts_with = "config")]
        big: bool,
        /// A benchmark configuration of the GPU path: a = upstream's model (1 layer, 2 x 16, max 16, f32),
        /// b = 8 layers, 8 x 64, max 1024, f16; c = 32 layers, 8 x 128, max 8192, f16. Default: the tiny
        /// model (= a), or --big.
        #[arg(long, value_enum)]
        config: Option<BenchArg>,
        /// Where buffers and method inputs and outputs live (reference and cuda backends).
        #[arg(long, value_enum, default_value_t = Memory::Host)]
        memory: Memory,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Backend {
    /// The reference delegate (CPU op graph; f32 only).
    Reference,
    /// The CUDA delegate: the same reference-graph payload, run on an NVIDIA GPU.
    Cuda,
    /// The TensorRT delegate: engines built on this machine with TensorRT-RTX (installed when missing).
    Tensorrt,
}

#[derive(Clone, Copy, ValueEnum)]
enum BenchArg {
    A,
    B,
    C,
}

impl From<BenchArg> for kv_example::BenchConfig {
    fn from(arg: BenchArg) -> kv_example::BenchConfig {
        match arg {
            BenchArg::A => kv_example::BenchConfig::A,
            BenchArg::B => kv_example::BenchConfig::B,
            BenchArg::C => kv_example::BenchConfig::C,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Memory {
    /// Host memory (the default).
    Host,
    /// CUDA device memory.
    Device,
    /// CUDA managed memory.
    Managed,
}

impl From<Memory> for host_runtime::manifest::MemoryKind {
    fn from(memory: Memory) -> host_runtime::manifest::MemoryKind {
        use host_runtime::manifest::MemoryKind;
        match memory {
            Memory::Host => MemoryKind::Host,
            Memory::Device => MemoryKind::Device,
            Memory::Managed => MemoryKind::Managed,
        }
    }
}

/// `export-example` for the reference-graph backends (reference, cuda).
fn export_reference_graph(
    backend: kv_example::Backend,
    dir: &std::path::Path,
    big: bool,
    config: Option<BenchArg>,
    memory: Memory,
) -> anyhow::Result<()> {
    let cfg = match (config, big) {
        (Some(which), _) => kv_example::Config::bench(which.into()),
        (None, true) => kv_example::Config::big(),
        (None, false) => kv_example::Config::tiny(),
    };
    let target = kv_example::Target { backend, memory: memory.into() };
    kv_example::export::program(&cfg, dir, &target)?;
    let cache_bytes = 2 * cfg.layers * cfg.cache_len() * cfg.dtype.size_bytes();
    println!(
        "wrote the example program to {} (backend {}, {} memory; {} layers, {} heads x {}, max length {}, \
         vocab {}, {}, {} MiB of cache)",
        dir.display(),
        backend.id(),
        target.memory.name(),
        cfg.layers,
        cfg.heads,
        cfg.head_dim,
        cfg.max_len,
        cfg.vocab,
        cfg.dtype,
        cache_bytes >> 20
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let root = util::project_root();
    match cli.task {
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
        Task::Dist { rebuild_check: true, no_tensorrt, .. } => dist::check_rebuild(&root, !no_tensorrt),
        Task::Dist { out, no_tensorrt, rebuild_check: false } => {
            let out = match out {
                Some(out) => std::path::absolute(out)?,
                None => dist::dist_target_dir(&root)?.join("bundles"),
            };
            dist::run(&root, &dist::Options { out, tensorrt: !no_tensorrt }).map(drop)
        }
        Task::Compat { dist, no_tensorrt } => {
            let dist = dist.map(std::path::absolute).transpose()?;
            compat::run(&root, dist.as_deref(), !no_tensorrt)
        }
        Task::ExecutorchSetup => executorch_setup::run(&root),
        Task::GpuTest => gpu::bundle(&root, "test"),
        Task::BenchGpu => gpu::bundle(&root, "bench"),
        Task::PlotBench { summary, out } => plot::run(&summary, &out),
        Task::ExportPte { dir, tensorrt } => export_pte::run(&root, &dir, tensorrt),
        Task::ExportHf { args } => export_hf::run(&root, &args),
        Task::PackageCheck => release::package::run(&root),
        Task::Release { plan, publish } => {
            let step = |root: &std::path::Path| {
                if publish.record_only {
                    release::publish::record_only(root, publish.allow_dirty).map(drop)
                } else {
                    release::publish::run(root, &publish.options_for(root)?).map(drop)
                }
            };
            let step: Option<release::command::Publish> =
                (publish.registry.is_some() || publish.record_only).then_some(&step as _);
            release::command::run(&root, &plan, publish.execute, step)
        }
        Task::ExportExample { backend: Backend::Reference, dir, big, config, memory } => {
            export_reference_graph(kv_example::Backend::Reference, &dir, big, config, memory)
        }
        Task::ExportExample { backend: Backend::Cuda, dir, big, config, memory } => {
            export_reference_graph(kv_example::Backend::Cuda, &dir, big, config, memory)
        }
        Task::ExportExample { backend: Backend::Tensorrt, dir, big, config, memory } => {
            // The TensorRT example is the tiny or the big f32 model, with device caches.
            anyhow::ensure!(
                config.is_none() && memory == Memory::Host,
                "--config and --memory apply to the reference and cuda backends; the TensorRT example takes \
                 --big only"
            );
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
