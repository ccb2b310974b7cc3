//! Helpers shared by tasks.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

/// The workspace root.
pub fn project_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives one level below the root").to_owned()
}

/// `cargo` as the one running us.
pub fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// Runs a command in `dir`, echoing it, failing with its exit status.
pub fn run_cmd(dir: &Path, cmd: &mut Command) -> anyhow::Result<()> {
    cmd.current_dir(dir);
    eprintln!("$ {}", display(cmd));
    let status = cmd.status().with_context(|| format!("cannot start {}", display(cmd)))?;
    if !status.success() {
        bail!("`{}` failed with {status}", display(cmd));
    }
    Ok(())
}

fn display(cmd: &Command) -> String {
    let mut text = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        text.push(' ');
        text.push_str(&arg.to_string_lossy());
    }
    text
}
