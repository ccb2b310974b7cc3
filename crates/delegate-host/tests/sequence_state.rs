//! `run --prompt-cache` and `run --branch` of a program whose delegate keeps its caches itself
//! (`fixtures/executorch/owned_1m.pte`: ref-graph payload 1.2 `state`): the cache file cannot hold those
//! caches and a fork cannot copy them, so each is refused in one line (`NotSupported`) instead of decoding
//! other tokens than a plain run with exit 0; a plain run still runs, and gives the same tokens every time.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

mod common;
use common::{one_line_error, run, stdout_json};

const PROMPT: &str = "1,2,3";

/// The binary without `DELEGATE_PLUGIN_PATH`, so the embedded reference delegate serves.
fn host() -> Command {
    let mut cmd = common::host();
    cmd.env_remove("DELEGATE_PLUGIN_PATH");
    cmd
}

fn owned() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/executorch/owned_1m.pte")
}

fn tokens(report: &Value) -> Vec<i64> {
    report["tokens"].as_array().expect("tokens").iter().map(|t| t.as_i64().expect("i64")).collect()
}

/// A plain run's tokens.
fn plain_tokens() -> Vec<i64> {
    tokens(&stdout_json(&run(host().arg("run").arg(owned()).args(["--prompt", PROMPT, "--json"]))))
}

/// What the delegate's instance is refused for, after the action.
const OWNER: &str =
    "method 'forward', call 0 (ReferenceBackend) is served by plugin 'reference-delegate', whose \
                     instance says it keeps sequence state of its own (keeps_sequence_state), which";

#[test]
fn a_prompt_cache_is_refused_rather_than_decoding_other_tokens() {
    let plain = plain_tokens();
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("cache.safetensors");
    // Neither run prints tokens: the first has no file to reuse but cannot save one that would hold the
    // delegate's caches, and a run that would reuse a file is refused before it decodes anything.
    let mut refusals = Vec::new();
    for _ in 0..2 {
        let mut cmd = host();
        cmd.arg("run").arg(owned()).args(["--prompt", PROMPT, "--json", "--prompt-cache"]).arg(&file);
        let out = run(&mut cmd);
        if out.status.success() {
            assert_eq!(
                tokens(&stdout_json(&out)),
                plain,
                "a prompt-cache run that runs decodes as a plain run"
            );
        } else {
            assert!(out.stdout.is_empty(), "nothing decoded: {}", String::from_utf8_lossy(&out.stdout));
            refusals.push(one_line_error(&out));
        }
    }
    let save = format!(
        "error: cannot save cache file {}: {OWNER} a saved cache file does not carry [NotSupported]",
        file.display()
    );
    assert_eq!(refusals, [save.clone(), save], "both runs refused, in one line");
    assert!(!file.exists(), "no file that claims a position the caches do not hold");
    // A plain run still runs, as before.
    assert_eq!(plain_tokens(), plain);
}

#[test]
fn a_branch_is_refused_before_anything_is_decoded() {
    let out = run(host().arg("run").arg(owned()).args(["--prompt", PROMPT, "--branch", "1,2,5", "--json"]));
    assert!(out.stdout.is_empty(), "nothing decoded: {}", String::from_utf8_lossy(&out.stdout));
    assert_eq!(
        one_line_error(&out),
        format!(
            "error: --branch: the program cannot fork its caches: {OWNER} a forked sequence does not carry \
             [NotSupported]"
        )
    );
}
