//! `cargo xtask export-example`: the example decoder's blobs and program manifest, for any delegate.

use std::path::{Path, PathBuf};

use clap::ValueEnum;
use xtask::util::{cargo, run_cmd};

/// `export-example`'s arguments.
#[derive(clap::Args)]
pub struct Args {
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

/// Writes the example for `args.backend` into `args.dir`.
pub fn run(root: &Path, args: Args) -> anyhow::Result<()> {
    match args.backend {
        Backend::Reference => reference_graph(kv_example::Backend::Reference, &args),
        Backend::Cuda => reference_graph(kv_example::Backend::Cuda, &args),
        Backend::Tensorrt => tensorrt(root, &args),
    }
}

/// The reference-graph backends (reference, cuda).
fn reference_graph(backend: kv_example::Backend, args: &Args) -> anyhow::Result<()> {
    let cfg = match (args.config, args.big) {
        (Some(which), _) => kv_example::Config::bench(which.into()),
        (None, true) => kv_example::Config::big(),
        (None, false) => kv_example::Config::tiny(),
    };
    let target = kv_example::Target { backend, memory: args.memory.into() };
    kv_example::export::program(&cfg, &args.dir, &target)?;
    let cache_bytes = 2 * cfg.layers * cfg.cache_len() * cfg.dtype.size_bytes();
    println!(
        "wrote the example program to {} (backend {}, {} memory; {} layers, {} heads x {}, max length {}, \
         vocab {}, {}, {} MiB of cache)",
        args.dir.display(),
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

/// The TensorRT example: the tiny or the big f32 model, with device caches.
fn tensorrt(root: &Path, args: &Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.config.is_none() && args.memory == Memory::Host,
        "--config and --memory apply to the reference and cuda backends; the TensorRT example takes --big only"
    );
    // Building engines needs `trt-build`, whose bindings need libclang at build time, so it runs as its own
    // program after the set-up rather than inside xtask.
    let trt = xtask::trt_setup::ensure(root)?;
    let dir = std::path::absolute(&args.dir)?;
    let mut cmd = cargo();
    trt.apply(&mut cmd);
    cmd.args(["run", "--release", "-p", "kv-example-trt", "--example", "export_example", "--"]).arg(&dir);
    if args.big {
        cmd.arg("--big");
    }
    run_cmd(root, &mut cmd)
}
