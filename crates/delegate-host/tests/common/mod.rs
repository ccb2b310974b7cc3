//! What every CLI test does: run the built binary and read its stdout or its one error line.

use std::process::{Command, Output};

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
