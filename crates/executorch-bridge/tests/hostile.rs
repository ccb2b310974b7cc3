//! Hostile programs: a DelegateCall output that is not planned memory (a constant of the program) is refused
//! before ExecuTorch loads the program, in one line naming the method, the call, the argument and why; the
//! committed fixture `fixtures/executorch/hostile/kv_out_in_constant.pte` is that program.
//!
//! The fixture is what [`common::kv_output_in_constant_data`] writes; `UPDATE_GOLDEN=1 cargo test -p
//! executorch-bridge --test hostile` rewrites it when that program changes.

mod common;

use std::path::PathBuf;
use std::process::Command;

use et_error::{ErrorCode, HasErrorCode};
use executorch_bridge::runner::{self, Protocol};
use executorch_bridge::BridgeError;

/// The committed hostile fixture, checked to be the program the test support writes (rewritten with
/// `UPDATE_GOLDEN=1`).
fn committed_fixture() -> PathBuf {
    let path = common::workspace_root().join("fixtures/executorch/hostile/kv_out_in_constant.pte");
    let built = common::kv_output_in_constant_data(&kv_example::Config::tiny());
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().expect("a directory")).expect("mkdir");
        std::fs::write(&path, &built).expect("write the fixture");
    }
    let stored = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(stored == built, "{} is stale: rerun with UPDATE_GOLDEN=1", path.display());
    path
}

/// What the refusal must say: the method, the call, the argument (position, binding name, value) and why.
fn assert_names_the_constant_output(line: &str) {
    for part in [
        "method 'forward'",
        "chains[0].instructions[0] (DelegateCall to ReferenceBackend)",
        "argument 4 ('k_cache_out_0', value 4)",
        "constant data of the program",
        "not planned memory",
    ] {
        assert!(line.contains(part), "{part:?} missing from: {line}");
    }
}

#[test]
fn et_run_refuses_a_delegate_output_in_the_programs_constant_data_in_one_line() {
    let fixture = committed_fixture();
    // Before the check, ExecuTorch mapped the constant read-only and the delegate's write killed et-run
    // (SIGSEGV); a heap-loaded program would have had its constants overwritten.
    let out = Command::new(env!("CARGO_BIN_EXE_et-run"))
        .arg(&fixture)
        .args(["--plugin-dir".as_ref(), common::reference_only_dir().as_os_str()])
        .env_remove("DELEGATE_PLUGIN_PATH")
        .output()
        .expect("et-run runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{:?}: {stderr}", out.status);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    let line = stderr.trim();
    assert!(line.starts_with("error: ") && line.ends_with("[InvalidProgram]"), "{line}");
    assert_names_the_constant_output(line);
    assert!(out.stdout.is_empty());
}

#[test]
fn the_runner_and_every_module_refuse_it_before_executorch_loads_the_program() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("hostile.pte");
    std::fs::write(&path, common::kv_output_in_constant_data(&kv_example::Config::tiny())).expect("write");
    let registry = common::dylib_registry();
    let protocol = Protocol { prompt: common::PROMPT.to_vec(), steps: 2, require_zero_copy: false };
    let err = runner::run(&path, &registry, &protocol).expect_err("refused");
    assert!(matches!(err, BridgeError::UnplannedWrite { .. }), "{err:?}");
    assert_eq!(err.error_code(), ErrorCode::InvalidProgram);
    assert_names_the_constant_output(&err.to_string());
    // A Module opened directly (no pre-flight by the caller) makes the same check before ExecuTorch loads.
    executorch_bridge::register(&registry).expect("registered");
    let err = runner::Module::open(&path).expect_err("refused");
    assert_names_the_constant_output(&err.to_string());
}

#[test]
fn the_same_program_with_its_output_planned_runs() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cases = common::own_cases(dir.path());
    let unplanned = &cases[0];
    assert!(unplanned.path.ends_with("buffers_1m.pte"));
    let protocol =
        Protocol { prompt: common::PROMPT.to_vec(), steps: common::STEPS, require_zero_copy: false };
    let report = runner::run(&unplanned.path, &common::dylib_registry(), &protocol).expect("runs");
    assert_eq!(report.tokens, unplanned.tokens);
}
