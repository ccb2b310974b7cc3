//! Helpers shared by tasks.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{bail, Context};

/// The workspace root.
pub fn project_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives one level below the root").to_owned()
}

/// Where cargo puts build output for this workspace: `cargo metadata`'s `target_directory`, which honours
/// `CARGO_TARGET_DIR`, `build.target-dir` in any config file and `--target-dir` defaults alike. Asked once.
pub fn target_dir(root: &Path) -> anyhow::Result<PathBuf> {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    if let Some(dir) = DIR.get() {
        return Ok(dir.clone());
    }
    let out = cargo()
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .current_dir(root)
        .output()
        .context("running cargo metadata")?;
    if !out.status.success() {
        bail!("cargo metadata failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    let dir = parse_target_dir(&out.stdout)?;
    Ok(DIR.get_or_init(|| dir).clone())
}

fn parse_target_dir(metadata: &[u8]) -> anyhow::Result<PathBuf> {
    let value: serde_json::Value =
        serde_json::from_slice(metadata).context("cargo metadata printed no JSON")?;
    match value.get("target_directory").and_then(|v| v.as_str()) {
        Some(dir) => Ok(PathBuf::from(dir)),
        None => bail!("cargo metadata has no target_directory"),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_target_dir_follows_cargo_target_dir() {
        let root = project_root();
        let elsewhere = tempfile::tempdir().expect("temp dir");
        let out = cargo()
            .args(["metadata", "--format-version", "1", "--no-deps"])
            .current_dir(&root)
            .env("CARGO_TARGET_DIR", elsewhere.path())
            .output()
            .expect("cargo metadata runs");
        assert!(out.status.success());
        assert_eq!(parse_target_dir(&out.stdout).expect("target_directory"), elsewhere.path());
    }
}
