//! What every CLI test does: run the built binary and read its stdout or its one error line.
// Each test binary uses a subset of these helpers.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use pte_format::testing::ProgramSpec;
use serde_json::Value;

/// `delegate-host` as built for these tests.
pub fn host() -> Command {
    Command::new(env!("CARGO_BIN_EXE_delegate-host"))
}

/// Runs `cmd` to the end.
pub fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("delegate-host starts")
}

/// Asserts success and one JSON value on stdout; returns it.
pub fn stdout_json(out: &Output) -> Value {
    assert!(out.status.success(), "exit {:?}, stderr: {}", out.status, String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON value")
}

/// Asserts exit code 2 and exactly one `error: ...` line on stderr (no panic text); returns it.
pub fn one_line_error(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(2), "stdout: {}", String::from_utf8_lossy(&out.stdout));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "stderr: {stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    assert!(!stderr.contains("panicked") && !stderr.contains("RUST_BACKTRACE"), "{stderr}");
    lines[0].to_owned()
}

/// The directory holding the built test plugins: `cargo xtask test` builds them and says where; a plain
/// `cargo test` builds them here into a separate target dir (the outer cargo holds the main one's lock).
pub fn test_plugin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("DELEGATE_TEST_PLUGIN_DIR") {
        let dir = PathBuf::from(dir);
        return if dir.is_absolute() {
            dir
        } else {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(dir)
        };
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let target = root.join("target").join("plugin-tests");
    let status = Command::new(env!("CARGO"))
        .args([
            "build",
            "-q",
            "-p",
            "abi-test",
            "-p",
            "abi-test-future",
            "-p",
            "crash-on-load",
            "-p",
            "misbehave-delegate",
            "-p",
            "reference-delegate-dylib",
            "--target-dir",
        ])
        .arg(&target)
        .current_dir(&root)
        .status()
        .expect("cargo starts");
    assert!(status.success(), "building the test plugins failed");
    target.join("debug")
}

/// `libstem.so` (the platform's library file name).
pub fn dylib(stem: &str) -> String {
    format!("{}{stem}{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX)
}

/// `spec` with every delegate's compile specs cleared (a .pte without `max_seq_len`, so the host falls back
/// on its caches' rows), written to `path`; returns `path`.
pub fn without_compile_specs(mut spec: ProgramSpec, path: &Path) -> PathBuf {
    for method in &mut spec.methods {
        for delegate in &mut method.delegates {
            delegate.compile_specs.clear();
        }
    }
    std::fs::write(path, spec.to_bytes()).expect("write the .pte");
    path.to_owned()
}
