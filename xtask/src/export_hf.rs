//! `export-hf ARGS`: a Hugging Face checkpoint folder to a program (issue 47): `python -m kv_delegate export-hf
//! ARGS` (`python/kv_delegate/kv_delegate/export_hf.py`) in `.cache/export-venv`, set up first (`export_venv`),
//! with the packer `delegate-pack` built. Paths in ARGS are the caller's: the exporter runs in xtask's working
//! directory.

use std::ffi::OsString;
use std::path::Path;
use std::process::Command;

use anyhow::Context;

use crate::{export_venv, util};

/// Sets up the venv, builds `delegate-pack` and runs the exporter with `args`.
pub fn run(root: &Path, args: &[OsString]) -> anyhow::Result<()> {
    let python = export_venv::ensure(root)?;
    eprintln!("xtask: building delegate-pack");
    util::run_cmd(root, util::cargo().args(["build", "-p", "delegate-pack"]))?;
    let packer = util::target_dir(root)?.join("debug").join("delegate-pack");
    let here = std::env::current_dir().context("reading the working directory")?;
    let mut cmd = Command::new(&python);
    cmd.args(["-m", "kv_delegate", "export-hf"])
        .args(args)
        .env("PYTHONPATH", root.join("python").join("kv_delegate"))
        .env("KV_DELEGATE_PACK", &packer);
    util::run_cmd(&here, &mut cmd)
}
