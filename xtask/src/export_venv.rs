//! `.cache/export-venv`, the Python environment of `export-pte` and of the lowering's tests (`python_test`): a
//! venv with torch [`TORCH_VERSION`] (reused from `.cache/torch-venv` when that has this very version, same
//! Python: a `.pth` file points at its site-packages, saving a 5 GB install; installed from PyPI otherwise),
//! then `executorch==1.5.1` without its dependencies (its pinned torch would replace ours) and the few packages
//! its exporter imports. A venv whose torch is another version gets the pinned one installed: the export's
//! bytes depend on torch's version (the delegate's argument order changed between 2.13 and 2.15), so the
//! fixtures are reproducible only with it. Then [`TRANSFORMERS`] (pinned beside torch; its models' exports
//! depend on its version too).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

use crate::util;

/// The export venv, relative to the project root.
const VENV: &str = ".cache/export-venv";
/// The torch venv the export venv reuses when present (`gpu/`'s baseline uses it too).
const TORCH_VENV: &str = ".cache/torch-venv";
/// The ExecuTorch release the fixtures are made with.
const EXECUTORCH: &str = "executorch==1.5.1";
/// The torch the fixtures are exported with (`fixtures/executorch/README.md`); PyPI's wheel, run on the CPU.
/// ExecuTorch 1.5.1's Python runtime (`executorch.runtime`) is built against 2.13 and does not load with it;
/// the export does not need that runtime (`et-run` runs the programs).
const TORCH_VERSION: &str = "2.15.0";
/// [`TORCH_VERSION`] as a pip requirement.
const TORCH: &str = "torch==2.15.0";
/// Hugging Face transformers, for exporting its models with its own ExecuTorch recipe
/// (`transformers.integrations.executorch`; `docs/real-models.md`).
const TRANSFORMERS: &str = "transformers==5.24.0";
/// What `executorch.exir` and its exporter import beyond torch's own dependencies.
const EXPORT_DEPS: [&str; 6] = ["numpy", "ruamel.yaml", "pyyaml", "flatbuffers", "tabulate", "packaging"];

/// Whether `python` can import `module`.
pub(crate) fn imports(python: &Path, module: &str) -> bool {
    Command::new(python)
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|out| out.status.success())
}

/// The version of the torch `python` imports, without a local suffix (`2.15.0+cu130` -> `2.15.0`).
fn torch_version(python: &Path) -> Option<String> {
    let out = Command::new(python).args(["-c", "import torch; print(torch.__version__)"]).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let version = text.trim().split('+').next()?.to_owned();
    (out.status.success() && !version.is_empty()).then_some(version)
}

/// `python`'s site-packages directory.
fn site_packages(python: &Path) -> anyhow::Result<PathBuf> {
    let out = Command::new(python)
        .args(["-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
        .output()
        .with_context(|| format!("running {}", python.display()))?;
    if !out.status.success() {
        bail!("{} cannot name its site-packages", python.display());
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// The export venv's Python, after making sure torch, executorch and the exporter's imports are there.
pub(crate) fn ensure(root: &Path) -> anyhow::Result<PathBuf> {
    let venv = root.join(VENV);
    let python = venv.join("bin").join("python");
    if !python.exists() {
        eprintln!("xtask: creating {}", venv.display());
        util::run_cmd(root, Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
        let torch_python = root.join(TORCH_VENV).join("bin").join("python");
        if torch_version(&torch_python).as_deref() == Some(TORCH_VERSION) {
            let theirs = site_packages(&torch_python)?;
            let ours = site_packages(&python)?;
            if theirs.file_name().is_some()
                && theirs.parent().and_then(Path::file_name) == ours.parent().and_then(Path::file_name)
            {
                eprintln!("xtask: reusing torch from {}", theirs.display());
                std::fs::write(ours.join("zz-torch-venv.pth"), format!("{}\n", theirs.display()))
                    .context("writing the .pth file")?;
            }
        }
    }
    let pip = |args: &[&str]| pip_install(root, &python, args);
    match torch_version(&python) {
        Some(v) if v == TORCH_VERSION => {}
        found => {
            let was = found.map(|v| format!(" (replacing torch {v})")).unwrap_or_default();
            eprintln!(
                "xtask: installing {TORCH} from PyPI{was} (about 5 GB with its CUDA wheels; it runs on the CPU)"
            );
            pip(&[TORCH])?;
        }
    }
    if !imports(&python, "executorch.exir") {
        eprintln!("xtask: installing {EXECUTORCH} (without dependencies) and what its exporter imports");
        pip(&["--no-deps", EXECUTORCH])?;
        pip(&EXPORT_DEPS)?;
    }
    if !imports(&python, "transformers") {
        eprintln!("xtask: installing {TRANSFORMERS}");
        pip(&[TRANSFORMERS])?;
    }
    if !imports(&python, "executorch.exir") {
        bail!("{} cannot import executorch.exir after the install", python.display());
    }
    Ok(python)
}

/// `python -m pip install --quiet ARGS` in `root`.
pub(crate) fn pip_install(root: &Path, python: &Path, args: &[&str]) -> anyhow::Result<()> {
    let mut cmd = Command::new(python);
    cmd.args(["-m", "pip", "install", "--disable-pip-version-check", "--quiet"]).args(args);
    util::run_cmd(root, &mut cmd)
}
