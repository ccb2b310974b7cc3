//! Where ExecuTorch's planned memory lives (`executorch_bridge::planned`), on any machine: reference programs
//! keep host memory by default with unchanged tokens, and `--memory managed` without a CUDA GPU is one error
//! line (with one, the reference delegate runs over managed memory with the same tokens).

mod common;

use std::process::Command;

use et_error::{ErrorCode, HasErrorCode};
use executorch_bridge::runner::{self, Protocol};
use executorch_bridge::{BridgeError, PlannedMemory};

fn protocol() -> Protocol {
    Protocol { prompt: common::PROMPT.to_vec(), steps: common::STEPS, require_zero_copy: false }
}

fn et_run(args: &[&std::ffi::OsStr]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_et-run"))
        .args(args)
        .arg("--plugin-dir")
        .arg(common::reference_only_dir())
        .env_remove("DELEGATE_PLUGIN_PATH")
        .output()
        .expect("et-run runs")
}

fn gpu_present() -> bool {
    cuda_rt::Context::open(0).is_ok()
}

#[test]
fn reference_programs_keep_host_planned_memory_and_their_tokens() {
    let dir = tempfile::tempdir().expect("temp dir");
    let registry = common::dylib_registry();
    for case in common::own_cases(dir.path()) {
        let name = case.path.display().to_string();
        let report =
            runner::run(&case.path, &registry, &protocol()).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(report.planned_memory, PlannedMemory::Host, "{name}: chosen for the reference delegate");
        assert_eq!(report.tokens, case.tokens, "{name}: tokens");
        assert!(report.decode_syncs.iter().all(|s| s.bridge == 0), "{name}: no stream to wait for");
        let forced = runner::run_with_memory(&case.path, &registry, &protocol(), Some(PlannedMemory::Host))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(forced.tokens, case.tokens, "{name}: --memory host");
    }
    // et-run says so, in text and JSON.
    let path = dir.path().join("buffers_2m_planned.pte");
    let text = et_run(&[path.as_os_str()]);
    assert!(text.status.success(), "{}", String::from_utf8_lossy(&text.stderr));
    let stdout = String::from_utf8_lossy(&text.stdout);
    assert!(stdout.lines().any(|l| l == "planned memory: host"), "{stdout}");
    let json = et_run(&[path.as_os_str(), "--json".as_ref()]);
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON");
    assert_eq!(json["planned_memory"], "host");
}

#[test]
fn managed_planned_memory_without_a_gpu_is_one_error_line() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("kv.pte");
    std::fs::write(&path, common::program(&kv_example::Config::tiny(), 2, true, common::BACKEND))
        .expect("write");
    let registry = common::dylib_registry();
    let result = runner::run_with_memory(&path, &registry, &protocol(), Some(PlannedMemory::Managed));
    let out = et_run(&[path.as_os_str(), "--memory".as_ref(), "managed".as_ref()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if gpu_present() {
        // The reference delegate updates managed memory in place too: same tokens, read on the host.
        let report = result.expect("managed planned memory on a GPU machine");
        assert_eq!(report.planned_memory, PlannedMemory::Managed);
        let host = runner::run(&path, &registry, &protocol()).expect("host run");
        assert_eq!(report.tokens, host.tokens);
        assert!(out.status.success(), "{stderr}");
        return;
    }
    let err = result.expect_err("no CUDA here");
    assert!(matches!(err, BridgeError::ManagedMemory { .. }), "{err}");
    assert_eq!(err.error_code(), ErrorCode::NotSupported);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("error: cannot place the planned memory in CUDA managed memory: ")
            && stderr.contains("--memory host")
            && stderr.trim_end().ends_with("[NotSupported]"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(out.stdout.is_empty());
}

#[test]
fn an_unknown_memory_is_a_usage_error_naming_the_choices() {
    let out = et_run(&["x.pte".as_ref(), "--memory".as_ref(), "device".as_ref()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("'device' is not a planned memory: use host or managed"), "{stderr}");
}
