//! `cargo xtask test`: everything CI checks, in the order that fails fastest.

use std::path::Path;
use std::process::Command;

use crate::on_demand::{self, Tool};
use crate::util::{cargo, run_cmd, target_dir, write_plugin_manifests};
use crate::{executorch_setup, nvrtc_setup, trt_setup};

/// Installs what the tests need (libclang for `trtx`'s bindings, the TensorRT-RTX library, NVRTC, `flatc`, the
/// executorch wheel for `executorch-bridge`), then runs fmt, codegen --check, clippy and the whole test suite
/// with the real plugin dylibs built first, then the Python tests (`python_test`: torch, executorch and
/// transformers installed into `.cache/export-venv` on first use).
pub fn run(root: &Path) -> anyhow::Result<()> {
    let progress = Progress::new(root);
    run_cmd(root, cargo().args(["fmt", "--all", "--check"]))?;
    crate::codegen::run(root, true)?;
    let trt = trt_setup::ensure(root)?;
    let nvrtc = nvrtc_setup::ensure(root)?;
    // `executorch-bridge` is a workspace member (not a default one): `--workspace` builds it, against the wheel.
    // So is `executorch-capi`, whose tests build the C++ example (`c++`) against its libraries and run it.
    let executorch = executorch_setup::ensure(root)?;
    let with_trt = |mut cmd: Command| {
        trt.apply(&mut cmd);
        nvrtc.apply(&mut cmd);
        executorch.apply(&mut cmd);
        cmd
    };
    // Plugin dylibs are loaded from disk by the tests; build them first so the tests do not build them again
    // under a second cargo lock.
    run_cmd(
        root,
        with_trt(cargo()).args([
            "build",
            "-p",
            "reference-delegate-dylib",
            "-p",
            "abi-test",
            "-p",
            "abi-test-future",
            "-p",
            "crash-on-load",
            "-p",
            "misbehave-delegate",
            "-p",
            "panic-on-info",
            "-p",
            "tensorrt-delegate-dylib",
            "-p",
            "delegate-host",
        ]),
    )?;
    let plugin_dir = target_dir(root)?.join("debug");
    // Manifests for the plugins that load (abi-test-future speaks an ABI this host does not, crash-on-load
    // aborts and panic-on-info panics when opened: those stay without one, so no default discovery of this
    // directory ever opens them), written from the libraries just built.
    let host = plugin_dir.join(format!("delegate-host{}", std::env::consts::EXE_SUFFIX));
    let stems = ["reference_delegate_dylib", "abi_test", "tensorrt_delegate_dylib"];
    write_plugin_manifests(&plugin_dir, &host, &stems, |cmd| {
        trt.apply(cmd);
    })?;
    run_cmd(
        root,
        with_trt(cargo()).args(["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"]),
    )?;
    progress.done("clippy");
    run_cmd(
        root,
        with_trt(cargo())
            .args(["test", "--workspace", "--no-fail-fast"])
            .env("DELEGATE_TEST_PLUGIN_DIR", &plugin_dir)
            // The panic-containment tests panic inside plugins on purpose; symbolising a backtrace for each
            // costs minutes on a loaded machine and says nothing a failing assertion does not.
            .env("RUST_BACKTRACE", "0"),
    )?;
    progress.done("the workspace's tests");
    // The ExecuTorch side's tests (torch, executorch and transformers in .cache/export-venv; the packer and
    // et-run just built): the lowering checked against torch eager's tokens in ExecuTorch's runtime.
    crate::python_test::run(root, &with_trt)?;
    tensorrt_smoke(root, &with_trt)?;
    progress.done("the Python tests and the TensorRT smoke test");
    // Release bundles built once, assembled twice and compared byte for byte; then the compatibility gate on
    // them (golden blobs, the previous release's plugins and host, symbols, changelog rule): `xtask-release`.
    on_demand::run_step(root, Tool::Release, &["compat", "--reproducible"])?;
    progress.done("the release bundles and the compatibility gate");
    crate::leak_check::run(root)?;
    demo_in_another_target_dir(root)?;
    progress.done("the leak check and the demo in another target directory");
    eprintln!("xtask test: all checks passed");
    Ok(())
}

/// The TensorRT example as a user exports it, read back by the CLI a user runs: the blobs validate, the plugin
/// is listed from its manifest, and running the program on a machine without a usable GPU fails cleanly (exit 2, one
/// line, `NotSupported`) instead of crashing.
fn tensorrt_smoke(root: &Path, with_trt: &dyn Fn(Command) -> Command) -> anyhow::Result<()> {
    let target = target_dir(root)?;
    let debug = target.join("debug");
    let dir = target.join("xtask-test").join("tensorrt-example");
    run_cmd(
        root,
        with_trt(cargo())
            .args(["run", "-q", "-p", "kv-example-trt", "--example", "export_example", "--"])
            .arg(&dir),
    )?;
    let host = debug.join(format!("delegate-host{}", std::env::consts::EXE_SUFFIX));
    for blob in ["prefill.blob", "decode.blob"] {
        run_cmd(root, Command::new(&host).arg("validate").arg(dir.join(blob)))?;
    }
    // Listed from the manifest `test` wrote (the build directory is never probed: it also holds a fixture
    // that aborts when loaded); the runs below load it, checked against that manifest, and reach its `init`.
    let plugins = with_trt(Command::new(&host)).args(["plugins", "--plugin-dir"]).arg(&debug).output()?;
    let listing = String::from_utf8_lossy(&plugins.stdout);
    let listed = listing.lines().any(|l| {
        l.contains("libtensorrt_delegate_dylib")
            && l.contains("tensorrt-delegate")
            && l.contains("TensorRTBackend")
            && l.contains("listed")
    });
    anyhow::ensure!(
        plugins.status.success() && listed,
        "the TensorRT plugin is not listed from its manifest:\n{listing}"
    );

    // The program as exported keeps its caches in device memory, which a machine without a driver refuses
    // before any plugin runs; the same program with host caches reaches the plugin's `init`, where TensorRT
    // itself must refuse cleanly. Both are one `NotSupported` line.
    let manifest = std::fs::read_to_string(dir.join("program.toml"))?;
    let host_caches = dir.join("program-host-caches.toml");
    std::fs::write(&host_caches, manifest.replace("memory = \"device\"", "memory = \"host\""))?;
    for (program, must_contain) in [
        (dir.join("program.toml"), "[NotSupported]"),
        (host_caches, "(TensorRTBackend): init failed: NotSupported"),
    ] {
        let run = with_trt(Command::new(&host))
            .arg("run")
            .arg(&program)
            .arg("--plugin-dir")
            .arg(&debug)
            .output()?;
        let stderr = String::from_utf8_lossy(&run.stderr);
        eprintln!("$ delegate-host run {}: {}", program.display(), stderr.trim());
        anyhow::ensure!(
            run.status.code() == Some(2)
                && stderr.trim().lines().count() == 1
                && stderr.contains(must_contain)
                && stderr.trim_end().ends_with("[NotSupported]"),
            "without a GPU that TensorRT-RTX supports, `delegate-host run` must fail with one NotSupported line \
             containing {must_contain:?}; got {:?}: {stderr}",
            run.status.code()
        );
    }
    Ok(())
}

/// `cargo xtask demo` as a user with a shared target directory runs it: `CARGO_TARGET_DIR` points elsewhere,
/// and the demo must find what cargo built there (it asks `cargo metadata`, never assumes `target/`). Run
/// through cargo, as the alias does, never as this process's own file: the workspace builds before this
/// step may have replaced it (features unified across the workspace rebuild the thin xtask).
fn demo_in_another_target_dir(root: &Path) -> anyhow::Result<()> {
    let elsewhere = target_dir(root)?.join("xtask-test").join("shared-target");
    run_cmd(
        root,
        cargo().args(["run", "-q", "-p", "xtask", "--", "demo"]).env("CARGO_TARGET_DIR", &elsewhere),
    )?;
    anyhow::ensure!(
        elsewhere.join("release").join(format!("delegate-host{}", std::env::consts::EXE_SUFFIX)).is_file(),
        "the demo did not build into CARGO_TARGET_DIR ({})",
        elsewhere.display()
    );
    Ok(())
}

/// What a long run prints between its steps: the time so far and the space left on the target directory's
/// disk (a clean run writes several target directories, and CI's disk is finite: a full disk shows here
/// first, not as a linker's error in the middle of a step).
struct Progress {
    started: std::time::Instant,
    target: Option<std::path::PathBuf>,
}

impl Progress {
    fn new(root: &Path) -> Progress {
        Progress { started: std::time::Instant::now(), target: target_dir(root).ok() }
    }

    fn done(&self, step: &str) {
        let free = self.target.as_deref().and_then(free_gib);
        let free = free.map_or_else(|| "unknown".to_owned(), |gib| format!("{gib:.1} GiB"));
        eprintln!(
            "xtask test: {step} passed ({:.0?} in all; free disk beside the target directory: {free})",
            self.started.elapsed()
        );
    }
}

/// Free space on the file system holding `path`, from `df -Pk` (POSIX output, 1 KiB blocks); `None` where
/// `df` is missing or prints something else.
fn free_gib(path: &Path) -> Option<f64> {
    let out = Command::new("df").arg("-Pk").arg(path).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let available: f64 = text.lines().nth(1)?.split_whitespace().nth(3)?.parse().ok()?;
    Some(available / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_space_is_read_from_df() {
        let free = free_gib(Path::new(".")).expect("df -Pk prints the free space of the current directory");
        assert!(free > 0.0, "{free} GiB free");
        assert_eq!(free_gib(Path::new("/no/such/dir/anywhere")), None);
    }
}
