//! Helpers shared by tasks.
//!
//! xtask's standard output carries only what a task answers (`release --json`'s plan, `executorch-setup`'s
//! `EXECUTORCH_ROOT` line, a report); what the tools it runs print is a log and goes to its standard error, so
//! `cargo xtask release --json | jq` parses on a fresh clone too. [`run_cmd`], [`apt_install`] and
//! [`pip_wheel`] send every child's stdout there; on `release`'s path, a command started another way either
//! captures its output or goes through [`stdout_to_stderr`] (`tar` in the semver baselines).

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
    let install = || {
        stdout_to_stderr(Command::new("apt-get").args(["install", "-y", "--no-install-recommends", package]))
            .status()
    };
    if install().map(|s| s.success()).unwrap_or(false) {
        return Ok(());
    }
    let update =
        stdout_to_stderr(Command::new("apt-get").arg("update")).status().context("running apt-get update")?;
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

/// Runs a command in `dir`, echoing it, failing with its exit status. What it prints goes to xtask's stderr
/// (see the module docs).
pub fn run_cmd(dir: &Path, cmd: &mut Command) -> anyhow::Result<()> {
    stdout_to_stderr(cmd.current_dir(dir));
    eprintln!("$ {}", display(cmd));
    let status = cmd.status().with_context(|| format!("cannot start {}", display(cmd)))?;
    if !status.success() {
        bail!("`{}` failed with {status}", display(cmd));
    }
    Ok(())
}

/// Sends `cmd`'s standard output to xtask's standard error: a child's log never mixes with what a task
/// prints as its answer.
pub fn stdout_to_stderr(cmd: &mut Command) -> &mut Command {
    cmd.stdout(std::io::stderr())
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
    // The tools run in `cache`: a relative path would mean another directory to them.
    let cache = &std::path::absolute(cache).with_context(|| format!("resolving {}", cache.display()))?;
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
            let mut pip = Command::new("python3");
            pip.args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--disable-pip-version-check",
                requirement,
                "-d",
            ])
            .arg(cache);
            run_cmd(cache, &mut pip)
                .with_context(|| format!("downloading {requirement} (is python3 with pip installed?)"))?;
            find()?.with_context(|| format!("pip reported success but no wheel is in {}", cache.display()))?
        }
    };
    let partial = cache.join("unpacking");
    if partial.exists() {
        std::fs::remove_dir_all(&partial).with_context(|| format!("removing {}", partial.display()))?;
    }
    let mut unzip = Command::new("python3");
    unzip.args(["-m", "zipfile", "-e"]).arg(&wheel).arg(&partial);
    run_cmd(cache, &mut unzip).with_context(|| format!("unpacking {}", wheel.display()))?;
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

    /// Set in the copy of this test binary that [`child_output_reaches_stderr_never_stdout`] starts: the
    /// scratch directory to work in.
    const PROBE: &str = "XTASK_STDOUT_PROBE_DIR";

    /// `cargo xtask release --json` on a fresh clone downloads the executorch wheel with `pip_wheel`; pip's log
    /// once came out on stdout ahead of the JSON. This test binary runs itself as a child (whose stdout is the
    /// one a child of a child would inherit) doing `run_cmd` and `pip_wheel` (with a stand-in `python3` that
    /// prints like pip), and checks that nothing they printed reached its stdout and all of it its stderr.
    #[test]
    fn child_output_reaches_stderr_never_stdout() {
        if let Some(dir) = std::env::var_os(PROBE) {
            return run_children_that_print(Path::new(&dir));
        }
        let scratch = tempfile::tempdir().expect("temp dir");
        let (stdout, stderr) = (scratch.path().join("stdout"), scratch.path().join("stderr"));
        let mut child = Command::new(std::env::current_exe().expect("the test binary"))
            .args(["--exact", "util::tests::child_output_reaches_stderr_never_stdout", "--test-threads=1"])
            .env(PROBE, scratch.path())
            .stdin(std::process::Stdio::null())
            .stdout(std::fs::File::create(&stdout).expect("stdout file"))
            .stderr(std::fs::File::create(&stderr).expect("stderr file"))
            .spawn()
            .expect("the test binary starts");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let status = loop {
            if let Some(status) = child.try_wait().expect("waiting for the child") {
                break status;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                panic!("the child test did not finish in 60 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let (stdout, stderr) = (read(&stdout), read(&stderr));
        assert!(status.success(), "the child test failed ({status}):\n{stdout}\n{stderr}");
        assert!(stdout.contains("test result: ok. 1 passed"), "the child ran no test:\n{stdout}");
        for printed in
            ["run_cmd-child-42", "python3-stand-in: -m pip download", "python3-stand-in: -m zipfile"]
        {
            assert!(!stdout.contains(printed), "{printed:?} reached xtask's stdout:\n{stdout}");
            assert!(stderr.contains(printed), "{printed:?} is missing from xtask's stderr:\n{stderr}");
        }
    }

    fn read(path: &Path) -> String {
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
    }

    /// The child's half: a command through `run_cmd`, and a wheel through `pip_wheel` with `python3` a script
    /// that prints like pip and writes what pip and zipfile would.
    fn run_children_that_print(dir: &Path) {
        // The arguments differ from what is printed, so run_cmd's echo of the command cannot be mistaken for it.
        run_cmd(dir, Command::new("sh").args(["-c", "echo run_cmd-child-$((6 * 7))"])).expect("sh runs");
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).expect("bin dir");
        let python = bin.join("python3");
        std::fs::write(
            &python,
            "#!/bin/sh\necho \"python3-stand-in: $*\"\ncase \"$2\" in\n\
             pip) for last; do :; done; : > \"$last/probe-1.0-py3-none-any.whl\" ;;\n\
             zipfile) mkdir -p \"$5/probe\" && : > \"$5/probe/lib.so\" ;;\nesac\n",
        )
        .expect("python3 stand-in");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let path = std::env::join_paths(
            std::iter::once(bin).chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())),
        )
        .expect("PATH");
        // This process is the child test alone (`--exact`, one thread): nothing else reads PATH meanwhile.
        std::env::set_var("PATH", path);
        let unpacked = dir.join("unpacked");
        pip_wheel(&dir.join("cache"), "probe==1.0", "probe-1.0", &unpacked, &unpacked.join("probe/lib.so"))
            .expect("the stand-in wheel unpacks");
    }
}
