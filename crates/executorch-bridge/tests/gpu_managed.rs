//! GPU tests (`#[ignore]`d: they need an NVIDIA GPU and driver; run with `--ignored`): a CUDA-delegated
//! program runs inside ExecuTorch's runtime with its planned memory (the caches' mutable buffers included) in
//! CUDA managed memory, chosen by default, with the reference delegate's tokens, 0 bytes copied per decode
//! step and no host synchronisation inside the delegate.

mod common;

use std::path::Path;
use std::process::Command;

use common::Layout;
use delegate_abi::host::HostConfig;
use executorch_bridge::runner::{self, Protocol, Report};
use executorch_bridge::PlannedMemory;
use host_runtime::plugins::{Discovery, Registry};

const CUDA: &str = kv_example::export::CUDA_BACKEND;

fn protocol() -> Protocol {
    Protocol { prompt: common::PROMPT.to_vec(), steps: common::STEPS, require_zero_copy: false }
}

/// The embedded reference and CUDA delegates, nothing from the environment.
fn registry() -> Registry {
    let config = HostConfig::default();
    Registry::discover(Discovery::new().use_env(false))
        .with_embedded(reference_delegate::delegate_root(), &config)
        .with_embedded(cuda_delegate::delegate_root(), &config)
}

/// The same program (`methods` methods, caches planned on their buffers) for `backend`, written into `dir`.
fn write(dir: &Path, methods: usize, backend: &str) -> std::path::PathBuf {
    let path = dir.join(format!("kv_{methods}m_{backend}.pte"));
    let bytes = common::program_with(&kv_example::Config::tiny(), methods, Layout::InPlace, backend);
    std::fs::write(&path, bytes).expect("write the program");
    path
}

fn run(path: &Path, memory: Option<PlannedMemory>) -> Report {
    runner::run_with_memory(path, &registry(), &protocol(), memory)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_cuda_program_runs_over_managed_planned_memory_in_place_with_the_references_tokens() {
    let dir = tempfile::tempdir().expect("temp dir");
    for methods in [1, 2] {
        let reference = run(&write(dir.path(), methods, common::BACKEND), None);
        assert_eq!(reference.planned_memory, PlannedMemory::Host);
        let path = write(dir.path(), methods, CUDA);
        let name = path.display().to_string();
        let cuda = run(&path, None);
        assert_eq!(cuda.planned_memory, PlannedMemory::Managed, "{name}: the default for a CUDA program");
        assert_eq!(cuda.tokens, reference.tokens, "{name}: the reference delegate's tokens");
        for (step, (got, want)) in cuda.logits.iter().zip(&reference.logits).enumerate() {
            let worst = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(worst <= 1e-3, "{name}: logits row {step} differs by {worst}");
        }
        assert_eq!(cuda.decode.len(), common::STEPS);
        for (step, (stats, syncs)) in cuda.decode.iter().zip(&cuda.decode_syncs).enumerate() {
            assert_eq!(stats.executes, 1, "{name}: step {step} ran the delegate");
            assert_eq!(stats.total(), 0, "{name}: bytes copied at decode step {step}: {stats:?}");
            assert_eq!(syncs.delegate, 0, "{name}: host syncs inside the delegate at step {step}");
            assert_eq!(syncs.bridge, 1, "{name}: the bridge waits once for the delegate's stream");
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn et_run_reports_managed_planned_memory_and_zero_copies_for_a_cuda_program() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = write(dir.path(), 2, CUDA);
    let et_run = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_et-run"))
            .arg(&path)
            .args(extra)
            .env_remove("DELEGATE_PLUGIN_PATH")
            .output()
            .expect("et-run runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).expect("UTF-8")
    };
    let text = et_run(&[]);
    assert!(text.lines().any(|l| l.starts_with("planned memory: managed")), "{text}");
    let json: serde_json::Value = serde_json::from_str(&et_run(&["--json"])).expect("JSON");
    assert_eq!(json["planned_memory"], "managed");
    assert_eq!(json["bytes_copied_per_decode_step"], serde_json::json!(vec![0; common::STEPS]));
    let reference = run(&write(dir.path(), 2, common::BACKEND), None);
    assert_eq!(json["tokens"], serde_json::json!(reference.tokens));
    // Forced host memory: the CUDA delegate refuses host caches, as one error line, never a crash.
    let out = Command::new(env!("CARGO_BIN_EXE_et-run"))
        .arg(&path)
        .args(["--memory", "host"])
        .env_remove("DELEGATE_PLUGIN_PATH")
        .output()
        .expect("et-run runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.code() == Some(0) || out.status.code() == Some(2), "{stderr}");
    if !out.status.success() {
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn the_real_cuda_fixtures_run_over_managed_memory_with_eagers_tokens() {
    let dir = common::workspace_root().join("fixtures/executorch/real");
    let text =
        std::fs::read_to_string(dir.join("expected.json")).expect("fixtures/executorch/real/expected.json");
    let expected: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let protocol = Protocol {
        prompt: serde_json::from_value(expected["prompt"].clone()).expect("prompt"),
        steps: serde_json::from_value(expected["steps"].clone()).expect("steps"),
        require_zero_copy: false,
    };
    let mut ran = 0;
    let mut failures = Vec::new();
    for (name, meta) in expected["programs"].as_object().expect("programs") {
        let Some(cuda) = meta["cuda"].as_str() else { continue };
        let report = match runner::run(&dir.join(cuda), &registry(), &protocol) {
            Ok(report) => report,
            Err(e) => {
                failures.push(format!("{cuda}: {e}"));
                continue;
            }
        };
        ran += 1;
        if report.planned_memory != PlannedMemory::Managed {
            failures.push(format!("{cuda}: planned memory {}", report.planned_memory));
        }
        let copied: Vec<u64> = report.decode.iter().map(|s| s.total()).collect();
        if copied.iter().any(|&b| b != 0) {
            failures.push(format!("{cuda}: bytes copied per decode step {copied:?}"));
        }
        let delegate_syncs: Vec<u64> = report.decode_syncs.iter().map(|s| s.delegate).collect();
        if delegate_syncs.iter().any(|&n| n != 0) {
            failures.push(format!("{cuda}: host syncs inside the delegate per step {delegate_syncs:?}"));
        }
        // f32 gives eager's tokens exactly; the half types are checked against the oracle by real_models.rs.
        if meta["dtype"] == "f32" && serde_json::json!(report.tokens) != meta["tokens"] {
            failures.push(format!("{name} on CUDA: tokens {:?}, eager {}", report.tokens, meta["tokens"]));
        }
    }
    assert!(ran > 0, "no *.cuda.pte fixture ran");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
