//! `delegate-host run PROGRAM --prompt A --branch B`: branch B, run on a fork of A's caches, gives the tokens
//! of a fresh run of B; A, swapped back, decodes one more step as a fresh run of A with one more step does;
//! the fork copies the shared prefix's rows only (position x heads x head_dim x element size x caches); the
//! options that contradict a fork, and a plugin in a worker process, are one error line each.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::{dylib, one_line_error, stdout_json, test_plugin_dir};

const STEPS: usize = 4;

/// The binary without `DELEGATE_PLUGIN_PATH`, so the embedded reference delegate serves.
fn host() -> Command {
    let mut cmd = common::host();
    cmd.env_remove("DELEGATE_PLUGIN_PATH");
    cmd
}

/// Runs `cmd`, killed after a minute (a run that cannot end fails the test instead of hanging it).
fn run_bounded(cmd: &mut Command) -> Output {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("delegate-host starts");
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            child.kill().expect("kill");
            panic!("delegate-host ran for more than 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

fn list(tokens: &[i64]) -> String {
    tokens.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
}

fn tokens(value: &Value) -> Vec<i64> {
    value.as_array().expect("tokens").iter().map(|t| t.as_i64().expect("i64")).collect()
}

/// `run PROGRAM --prompt PROMPT --steps STEPS --json`: its JSON report.
fn run_json(program: &Path, prompt: &[i64], steps: usize) -> Value {
    let out = run_bounded(host().arg("run").arg(program).args([
        "--json",
        "--prompt",
        &list(prompt),
        "--steps",
        &steps.to_string(),
    ]));
    stdout_json(&out)
}

/// `run PROGRAM --prompt A --branch B --steps STEPS --json`: its JSON report.
fn branch_json(program: &Path, a: &[i64], b: &[i64]) -> Value {
    let steps = STEPS.to_string();
    let args = ["--json", "--prompt", &list(a), "--branch", &list(b), "--steps", &steps];
    stdout_json(&run_bounded(host().arg("run").arg(program).args(args)))
}

/// The tiny example with heads of 8: caches `[2, 16, 8]` f32, a prompt of 4 tokens (its prefill's length).
fn example(dir: &Path) -> PathBuf {
    let cfg = kv_example::Config { head_dim: 8, ..kv_example::Config::tiny() };
    kv_example::export::reference(&cfg, dir).expect("export");
    dir.join("program.toml")
}

/// The bytes a fork of `position` positions copies: the position's rows of every head of every cache, from
/// the caches' shapes (`[heads, positions, head_dim]`) and element size.
fn fork_bytes(caches: &[(Vec<u64>, u64)], position: u64) -> u64 {
    caches
        .iter()
        .map(|(shape, element)| {
            let [heads, _, head_dim] = shape[..] else { panic!("caches are [H, L, Dh]: {shape:?}") };
            position * heads * head_dim * element
        })
        .sum()
}

/// Checks one branch run against fresh runs of both prompts; returns the fork position.
fn check_branches(program: &Path, a: &[i64], b: &[i64], caches: &[(Vec<u64>, u64)]) -> u64 {
    let report = branch_json(program, a, b);
    let branch = &report["branch"];
    let fresh_a = tokens(&run_json(program, a, STEPS + 1)["tokens"]);
    let fresh_b = tokens(&run_json(program, b, STEPS)["tokens"]);
    assert_eq!(tokens(&branch["tokens"]), fresh_b, "branch B is a fresh run of B: {report}");
    let mut a_tokens = tokens(&report["tokens"]);
    assert_eq!(a_tokens.len(), STEPS + 1, "{report}");
    a_tokens.push(branch["a_next_token"].as_i64().expect("a_next_token"));
    assert_eq!(a_tokens, fresh_a, "A, swapped back, goes on as a fresh run of A: {report}");
    let position = branch["fork_position"].as_u64().expect("fork_position");
    assert_eq!(branch["bytes_copied"].as_u64(), Some(fork_bytes(caches, position)), "{report}");
    position
}

/// The caches of a TOML program: each buffer's shape and element size.
fn toml_caches(program: &Path) -> Vec<(Vec<u64>, u64)> {
    let manifest = program_manifest::Manifest::load(program).expect("manifest");
    manifest.buffers.values().map(|b| (b.shape.clone(), b.dtype.size_bytes() as u64)).collect()
}

#[test]
fn a_branch_of_a_toml_program_runs_as_fresh_runs_of_both_prompts() {
    let dir = tempfile::tempdir().expect("temp dir");
    let program = example(dir.path());
    let caches = toml_caches(&program);
    assert_eq!(caches.len(), 2, "k and v");
    let a = kv_example::Config::tiny().prompt;
    assert_eq!(a.len(), 4);
    let b = [a[0], a[1], a[2] + 1, a[3]];
    assert_eq!(check_branches(&program, &a, &b, &caches), 2, "the prompts share two tokens");
    assert_eq!(check_branches(&program, &a, &a, &caches), 3, "the same prompt: all but its last token");
    let other = [a[0] + 1, a[1], a[2], a[3]];
    assert_eq!(check_branches(&program, &a, &other, &caches), 0, "nothing shared: B runs fresh");
}

#[test]
fn a_branch_of_a_committed_pte_runs_as_fresh_runs_of_both_prompts() {
    let pte = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/executorch/buffers_1m_planned.pte");
    // The fixture's caches: k and v, [2 heads, 16 positions, 16] f32 (`inspect --json` says so).
    let out = run_bounded(host().arg("inspect").arg(&pte).arg("--json"));
    let inspected = stdout_json(&out);
    let caches: Vec<(Vec<u64>, u64)> = inspected["methods"][0]["mutable_buffers"]
        .as_array()
        .expect("mutable buffers")
        .iter()
        .map(|b| {
            let tensor = &b["tensor"];
            assert_eq!(tensor["scalar_type"], "Float", "{b}");
            (serde_json::from_value(tensor["sizes"].clone()).expect("sizes"), 4)
        })
        .collect();
    assert_eq!(caches.len(), 2, "{inspected}");
    // A .pte is fed token by token: prompts of any length.
    assert_eq!(check_branches(&pte, &[1, 7, 3, 12], &[1, 7, 3, 5, 6], &caches), 3);
    assert_eq!(check_branches(&pte, &[1, 7, 3, 12], &[1, 7], &caches), 1);
    assert_eq!(check_branches(&pte, &[1, 7, 3, 12], &[9, 9, 9], &caches), 0);
    // Without --steps, as many as both branches fit: 16 positions, B's 6 tokens leave 10 decode steps (and A's
    // 4 + 10 + 1 fit too); B's tokens are then a fresh run of B to the end of its caches.
    let b = [1, 7, 3, 5, 6, 2];
    let args = ["--json", "--prompt", "1,7,3,12", "--branch", &list(&b)];
    let report = stdout_json(&run_bounded(host().arg("run").arg(&pte).args(args)));
    assert_eq!(tokens(&report["tokens"]).len(), 11, "{report}");
    assert_eq!(tokens(&report["branch"]["tokens"]), tokens(&run_json(&pte, &b, 10)["tokens"]), "{report}");
}

#[test]
fn the_text_report_names_the_fork_and_both_branches() {
    let dir = tempfile::tempdir().expect("temp dir");
    let program = example(dir.path());
    let a = kv_example::Config::tiny().prompt;
    let b = [a[0], a[1], a[2] + 1, a[3]];
    let out = run_bounded(host().arg("run").arg(&program).args(["--branch", &list(&b), "--steps", "2"]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("branch: forked at position 2 (the prompts' shared prefix), 256 bytes copied"),
        "{text}"
    );
    assert!(text.contains("branch tokens: [") && text.contains("branch A's next token: "), "{text}");
    let other = [a[0] + 1, a[1], a[2], a[3]];
    let out = run_bounded(host().arg("run").arg(&program).args(["--branch", &list(&other), "--steps", "2"]));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("branch: the prompts share no prefix: branch B ran from position 0"), "{text}");
}

#[test]
fn options_that_contradict_a_fork_are_one_error_line_each() {
    let dir = tempfile::tempdir().expect("temp dir");
    let program = example(dir.path());
    let npy = dir.path().join("t.npy");
    let input = format!("tokens={}", npy.display());
    let cache = dir.path().join("c.safetensors");
    let out_dir = dir.path().join("out");
    let cases: [(&[&str], &str); 7] = [
        (&["--method", "decode"], "--method"),
        (&["--input", &input], "--input"),
        (&["--prompt-cache", cache.to_str().expect("utf-8")], "--prompt-cache"),
        (&["--output-dir", out_dir.to_str().expect("utf-8")], "--output-dir"),
        (&["--position", "5"], "--position"),
        (&["--position", "5", "--hold-position"], "--position"),
        (&["--cuda-graph"], "--cuda-graph"),
    ];
    for (extra, option) in cases {
        let line = one_line_error(&run_bounded(
            host().arg("run").arg(&program).args(["--branch", "1,2"]).args(extra),
        ));
        let want = format!("error: --branch cannot be combined with {option}: ");
        assert!(line.starts_with(&want) && line.ends_with("[InvalidArgument]"), "{extra:?}: {line}");
    }
    assert!(!cache.exists() && !out_dir.exists(), "nothing ran");
    let pte = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/executorch/buffers_1m_planned.pte");
    let line = one_line_error(&run_bounded(host().arg("run").arg(&pte).args(["--branch", "1,2"])));
    assert!(
        line.contains("--branch forks a generation, but ") && line.contains("until given --prompt"),
        "{line}"
    );
}

#[test]
fn a_plugin_in_a_worker_process_cannot_fork_and_says_so_before_generating() {
    let plugins = tempfile::tempdir().expect("temp dir");
    let library = plugins.path().join(dylib("reference_delegate_dylib"));
    std::fs::copy(test_plugin_dir().join(dylib("reference_delegate_dylib")), &library)
        .expect("copy the plugin");
    let out = run_bounded(host().arg("plugin-manifest").arg(&library));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let dir = tempfile::tempdir().expect("temp dir");
    let program = example(dir.path());
    let mut cmd = host();
    cmd.arg("--isolate").arg("run").arg(&program).arg("--plugin-dir").arg(plugins.path());
    let out = run_bounded(cmd.args(["--branch", "1,2", "--steps", "2"]));
    let line = one_line_error(&out);
    assert!(out.stdout.is_empty(), "refused before prompt A ran");
    assert!(line.starts_with("error: --branch: the program cannot fork its caches: "), "{line}");
    assert!(line.contains("in a worker process") && line.contains("run without --isolate"), "{line}");
    assert!(line.ends_with("[NotSupported]"), "{line}");
}
