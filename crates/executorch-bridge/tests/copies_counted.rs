//! Copies counted, not inferred: the bytes `et-run` reports per decode step are what the copies that ran
//! wrote. ExecuTorch's `aten::copy_` kernel (the buffer write-back) is wrapped by a counting kernel that runs
//! it, so a self-copy write-back (KV output planned on its buffer, `copy_` kept) counts its bytes, and a
//! program exported by `KvAliasMemoryPlanningPass` (write-backs removed) copies nothing. Text and `--json`
//! report the same totals.

mod common;

use std::path::Path;
use std::process::Command;

use common::Layout;
use executorch_bridge::runner::{self, Protocol, Report};
use executorch_bridge::{BridgeError, CopyStats};

fn protocol(require_zero_copy: bool) -> Protocol {
    Protocol { prompt: common::PROMPT.to_vec(), steps: common::STEPS, require_zero_copy }
}

fn run(path: &Path) -> Report {
    runner::run(path, &common::dylib_registry(), &protocol(false))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn fixture(name: &str) -> std::path::PathBuf {
    common::workspace_root().join("fixtures/executorch").join(name)
}

/// Every cache of the tiny decoder together (k and v, one layer), what one write-back of each moves.
fn cache_bytes() -> u64 {
    let cfg = kv_example::Config::tiny();
    (2 * cfg.layers * cfg.cache_len() * 4) as u64
}

/// `et-run PATH` (reference dylib) as text and as JSON: (bytes copied per decode step from the text's
/// line, the JSON report).
fn et_run(path: &Path) -> (Vec<u64>, serde_json::Value) {
    let run = |json: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_et-run"));
        cmd.arg(path)
            .arg("--plugin-dir")
            .arg(common::reference_only_dir())
            .env_remove("DELEGATE_PLUGIN_PATH");
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().expect("et-run runs");
        assert!(out.status.success(), "{}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).expect("UTF-8")
    };
    let text = run(false);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("bytes copied per decode step: "))
        .unwrap_or_else(|| panic!("no bytes-copied line in {text}"));
    let per_step = line.split(' ').map(|n| n.parse().expect("a byte count")).collect();
    (per_step, serde_json::from_str(&run(true)).expect("JSON"))
}

/// The runner's counts, et-run's text and its JSON agree, step by step.
fn assert_reports_agree(path: &Path, report: &Report) {
    let totals: Vec<u64> = report.decode.iter().map(CopyStats::total).collect();
    let (text, json) = et_run(path);
    assert_eq!(text, totals, "{}: the text report", path.display());
    assert_eq!(json["bytes_copied_per_decode_step"], serde_json::json!(totals), "{}", path.display());
    let kernels: Vec<u64> = report.decode.iter().map(|s| s.write_back_bytes).collect();
    assert_eq!(json["write_back_bytes_per_decode_step"], serde_json::json!(kernels), "{}", path.display());
}

#[test]
fn the_counting_registry_wraps_executorchs_write_back_kernel() {
    let (wrapped, write_backs) = executorch_bridge::counted_copy_kernels();
    assert!(write_backs >= 1, "no aten::copy_ kernel wrapped ({wrapped} copy kernels)");
    assert!(wrapped >= write_backs);
}

#[test]
fn the_planned_fixtures_copy_nothing_per_decode_step() {
    for name in ["buffers_1m_planned.pte", "buffers_2m_planned.pte", "outside/gelu_1m.pte"] {
        let path = fixture(name);
        let report = run(&path);
        for (step, stats) in report.decode.iter().enumerate() {
            assert_eq!(stats.write_back_calls, 0, "{name}: step {step} ran a write-back kernel");
            assert_eq!(stats.total(), 0, "{name}: step {step} copied {stats:?}");
        }
        assert_reports_agree(&path, &report);
    }
}

#[test]
fn an_unplanned_fixtures_write_backs_are_counted_by_the_kernels_that_run() {
    let path = fixture("buffers_1m.pte");
    let report = run(&path);
    for stats in &report.decode {
        // Two copy_ kernels (k and v), each moving its 2048-byte cache; the plugin filled the separate
        // outputs first (its reflect).
        assert_eq!((stats.write_back_calls, stats.write_back_bytes), (2, cache_bytes()), "{stats:?}");
        assert_eq!(stats.reflect_bytes, cache_bytes(), "{stats:?}");
        assert_eq!((stats.bridge_write_back_bytes, stats.op_bytes), (0, 0), "{stats:?}");
        assert_eq!(stats.total(), 2 * cache_bytes());
    }
    assert_reports_agree(&path, &report);
}

#[test]
fn a_self_copy_write_back_is_counted_and_refused_by_strict_mode() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cfg = kv_example::Config::tiny();
    for methods in [1, 2] {
        let path = dir.path().join(format!("self_copy_{methods}m.pte"));
        std::fs::write(&path, common::program_with(&cfg, methods, Layout::SelfCopy, common::BACKEND))
            .expect("write");
        let report = run(&path);
        for stats in &report.decode {
            // One pointer for the cache and its KV output (the plugin reflects nothing), yet ExecuTorch's
            // copy_ kernel copies each cache onto itself.
            assert_eq!((stats.write_back_calls, stats.write_back_bytes), (2, cache_bytes()), "{stats:?}");
            assert_eq!(stats.total(), cache_bytes(), "{stats:?}");
        }
        assert_reports_agree(&path, &report);

        let err = runner::run(&path, &common::dylib_registry(), &protocol(true)).expect_err("refused");
        let BridgeError::NotZeroCopy { instruction, reason, .. } = &err else {
            panic!("not a strict refusal: {err:?}")
        };
        assert!(instruction.ends_with("(aten::copy_)"), "{instruction}");
        assert!(reason.contains("self-copy") && reason.contains("2048 bytes"), "{reason}");
    }
}
