//! `delegate-host run X.pte --prompt ...` without `--steps`: the default number of decode steps is what the
//! caches hold after the prompt (as a TOML program's `[generate] max_positions` gives), on every committed
//! ExecuTorch fixture and on a `.pte` that carries no `max_seq_len` compile spec (the caches' row axis says).

#[path = "../../host-runtime/tests/support/kv_pte.rs"]
mod kv_pte;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

mod common;
use common::stdout_json;

const PROMPT: &str = "1,7,3,12";

/// The binary without `DELEGATE_PLUGIN_PATH`, so the embedded reference delegate serves.
fn host() -> Command {
    let mut cmd = common::host();
    cmd.env_remove("DELEGATE_PLUGIN_PATH");
    cmd
}

/// Runs `cmd`, killed after a minute (a run that cannot end fails the test instead of hanging it).
fn run_bounded(cmd: &mut Command) -> std::process::Output {
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("delegate-host starts");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while child.try_wait().expect("wait").is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().expect("kill");
            panic!("delegate-host ran for more than 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/executorch")
}

fn tokens(report: &Value) -> Vec<i64> {
    report["tokens"].as_array().expect("tokens").iter().map(|t| t.as_i64().expect("i64")).collect()
}

/// The default run of `path` with the fixtures' prompt: its JSON report.
fn run_default(path: &Path) -> Value {
    stdout_json(&run_bounded(host().arg("run").arg(path).args(["--prompt", PROMPT, "--json"])))
}

#[test]
fn every_committed_fixture_runs_with_a_prompt_and_no_steps_until_its_caches_are_full() {
    let text = std::fs::read_to_string(fixtures().join("expected.json")).expect("expected.json is committed");
    let expected: Value = serde_json::from_str(&text).expect("JSON");
    let want: Vec<i64> = serde_json::from_value(expected["tokens"].clone()).expect("tokens");
    let programs = expected["programs"].as_object().expect("programs");
    assert_eq!(programs.len(), 5, "every committed variant");
    for name in programs.keys() {
        let report = run_default(&fixtures().join(name));
        // 16 positions, a prompt of 4: 12 decode steps, 13 tokens (the fixtures' whole run).
        assert_eq!(tokens(&report), want, "{name}");
        let steps = report["steps"].as_array().expect("steps");
        assert_eq!(steps.len(), 13, "{name}: prefill + 12 decode steps");
    }
}

#[test]
fn a_pte_without_max_seq_len_takes_the_default_from_its_caches_rows() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = common::without_compile_specs(kv_pte::spec(false), &dir.path().join("no_max_seq_len.pte"));
    let report = run_default(&path);
    let cfg = kv_pte::config();
    let steps = cfg.max_len - cfg.prompt_len();
    assert_eq!(report["steps"].as_array().expect("steps").len(), steps + 1);
    assert_eq!(tokens(&report), kv_pte::oracle_tokens(steps));
}
