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

/// Installs a Debian package with apt-get (needs root), retrying once after `apt-get update`.
pub fn apt_install(package: &str) -> anyhow::Result<()> {
    let install =
        || Command::new("apt-get").args(["install", "-y", "--no-install-recommends", package]).status();
    if install().map(|s| s.success()).unwrap_or(false) {
        return Ok(());
    }
    let update = Command::new("apt-get").arg("update").status().context("running apt-get update")?;
    if !update.success() {
        bail!("apt-get update failed ({update}); install {package} by hand (needs root)");
    }
    let status = install().with_context(|| format!("running apt-get install {package}"))?;
    if !status.success() {
        bail!("apt-get install {package} failed ({status}); install it by hand (needs root)");
    }
    Ok(())
}

/// The file name of the plugin library of crate `stem` (`reference_delegate_dylib` -> `libreference_delegate_dylib.so`).
pub fn dylib_name(stem: &str) -> String {
    format!("{}{stem}{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX)
}

/// Writes the manifest of each plugin library in `dir` (by crate-name stem) with `delegate-host plugin-manifest`:
/// read from the built library, never typed by hand, so discovery can list and choose it without loading it.
pub fn write_plugin_manifests(
    dir: &Path,
    host: &Path,
    stems: &[&str],
    env: impl Fn(&mut Command),
) -> anyhow::Result<()> {
    let mut cmd = Command::new(host);
    cmd.arg("plugin-manifest");
    for stem in stems {
        cmd.arg(dir.join(dylib_name(stem)));
    }
    env(&mut cmd);
    run_cmd(dir, &mut cmd)
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

/// Makes sure `wanted` exists: else downloads the wheel `requirement` (`python3 -m pip download --no-deps`,
/// nothing installed) into `cache`, unless a file starting with `wheel_prefix` is already there, and unpacks
/// it into `unpacked` with Python's own `zipfile`. Idempotent: no network I/O once `wanted` exists.
pub fn pip_wheel(
    cache: &Path,
    requirement: &str,
    wheel_prefix: &str,
    unpacked: &Path,
    wanted: &Path,
) -> anyhow::Result<()> {
    if wanted.is_file() {
        return Ok(());
    }
    std::fs::create_dir_all(cache).with_context(|| format!("creating {}", cache.display()))?;
    let find = || -> anyhow::Result<Option<PathBuf>> {
        let entries = std::fs::read_dir(cache).with_context(|| format!("reading {}", cache.display()))?;
        Ok(entries.filter_map(Result::ok).map(|e| e.path()).find(|p| {
            p.file_name().is_some_and(|n| {
                let n = n.to_string_lossy();
                n.starts_with(wheel_prefix) && n.ends_with(".whl")
            })
        }))
    };
    let wheel = match find()? {
        Some(wheel) => wheel,
        None => {
            eprintln!("xtask: downloading {requirement} into {}", cache.display());
            let status = Command::new("python3")
                .args([
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "--disable-pip-version-check",
                    requirement,
                    "-d",
                ])
                .arg(cache)
                .status()
                .context("running python3 -m pip download (is python3 with pip installed?)")?;
            if !status.success() {
                bail!("python3 -m pip download {requirement} failed ({status})");
            }
            find()?.with_context(|| format!("pip reported success but no wheel is in {}", cache.display()))?
        }
    };
    let partial = cache.join("unpacking");
    if partial.exists() {
        std::fs::remove_dir_all(&partial).with_context(|| format!("removing {}", partial.display()))?;
    }
    let status = Command::new("python3")
        .args(["-m", "zipfile", "-e"])
        .arg(&wheel)
        .arg(&partial)
        .status()
        .context("running python3 -m zipfile")?;
    if !status.success() {
        bail!("unpacking {} failed ({status})", wheel.display());
    }
    if unpacked.exists() {
        std::fs::remove_dir_all(unpacked).with_context(|| format!("removing {}", unpacked.display()))?;
    }
    std::fs::rename(&partial, unpacked)
        .with_context(|| format!("moving the unpacked wheel to {}", unpacked.display()))?;
    if !wanted.is_file() {
        bail!("the wheel {} has no {}", wheel.display(), wanted.display());
    }
    Ok(())
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
