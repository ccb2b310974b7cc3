//! `export-pte DIR`: exports the example decoder as ExecuTorch `.pte` programs for `ReferenceBackend`, every
//! variant (`python/kv_delegate`), plus torch eager's tokens and logits: what `fixtures/executorch/` holds.
//!
//! Sets up `.cache/export-venv` on first use (`export_venv`: torch, executorch 1.5.1 and transformers, pinned),
//! builds the packer `delegate-pack` and runs `python -m kv_delegate.export DIR` with it, then `python -m
//! kv_delegate.export_real DIR/real` (the Hugging Face Llama and Qwen2 models and the hand-written Llama-style
//! decoder, issue 18).
//!
//! `--tensorrt` exports the `TensorRTBackend` programs instead (`tensorrt_buffers_*.pte`): it also installs the
//! TensorRT-RTX library (`trt_setup`), builds kv-example-trt's `trt_pack` (the same spec built into an engine,
//! on the CPU) and passes it as `KV_TRT_PACK`.

use std::path::Path;
use std::process::Command;

use anyhow::Context;

use crate::{export_venv, trt_setup, util};

/// Sets up the venv, builds `delegate-pack` (and `trt_pack` with `tensorrt`), and exports every variant into
/// `dir`.
pub fn run(root: &Path, dir: &Path, tensorrt: bool) -> anyhow::Result<()> {
    let python = export_venv::ensure(root)?;
    eprintln!("xtask: building delegate-pack");
    util::run_cmd(root, util::cargo().args(["build", "-p", "delegate-pack"]))?;
    let debug = util::target_dir(root)?.join("debug");
    let packer = debug.join("delegate-pack");
    let dir = std::path::absolute(dir).with_context(|| format!("resolving {}", dir.display()))?;
    eprintln!("xtask: exporting the example decoder into {}", dir.display());
    let mut cmd = Command::new(&python);
    cmd.args(["-m", "kv_delegate.export"])
        .arg(&dir)
        .env("PYTHONPATH", root.join("python").join("kv_delegate"))
        .env("KV_DELEGATE_PACK", &packer);
    if tensorrt {
        let trt = trt_setup::ensure(root)?;
        eprintln!("xtask: building kv-example-trt's trt_pack (TensorRT-RTX engines, built on the CPU)");
        let mut build = util::cargo();
        trt.apply(&mut build);
        util::run_cmd(root, build.args(["build", "-p", "kv-example-trt", "--example", "trt_pack"]))?;
        trt.apply(&mut cmd);
        cmd.args(["--backend", "tensorrt"]).env("KV_TRT_PACK", debug.join("examples").join("trt_pack"));
        return util::run_cmd(root, &mut cmd);
    }
    util::run_cmd(root, &mut cmd)?;
    let real = dir.join("real");
    eprintln!("xtask: exporting the real models into {}", real.display());
    let mut cmd = Command::new(&python);
    cmd.args(["-m", "kv_delegate.export_real"])
        .arg(&real)
        .env("PYTHONPATH", root.join("python").join("kv_delegate"))
        .env("KV_DELEGATE_PACK", &packer);
    util::run_cmd(root, &mut cmd)
}
