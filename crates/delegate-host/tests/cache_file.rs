//! `delegate-host run --prompt-cache FILE`: a second run reuses the saved prefix its prompt shares, feeds
//! only the rest, and decodes as a fresh run does; a file from another program is one error line.

use std::path::{Path, PathBuf};

use serde_json::Value;

mod common;
use common::{host, one_line_error, run, stdout_json};

/// The tiny example with heads of 8, so its caches (`[2, 16, 8]`) have one sequence axis.
fn export(dir: &Path, seed_offset: u64) -> PathBuf {
    let tiny = kv_example::Config::tiny();
    let cfg = kv_example::Config { head_dim: 8, seed: tiny.seed + seed_offset, ..tiny };
    kv_example::export::reference(&cfg, dir).expect("export");
    dir.join("program.toml")
}

fn cached_run(program: &Path, cache: &Path, prompt: &[i64], steps: usize) -> std::process::Output {
    let prompt: Vec<String> = prompt.iter().map(i64::to_string).collect();
    run(host()
        .arg("run")
        .arg(program)
        .args(["--json", "--steps", &steps.to_string(), "--prompt", &prompt.join(",")])
        .arg("--prompt-cache")
        .arg(cache)
        .env_remove("DELEGATE_PLUGIN_PATH"))
}

fn tokens(value: &Value) -> Vec<i64> {
    value["tokens"].as_array().expect("tokens").iter().map(|t| t.as_i64().expect("i64")).collect()
}

#[test]
fn a_second_run_reuses_the_shared_prefix_and_decodes_as_the_fresh_run() {
    let dir = tempfile::tempdir().expect("temp dir");
    let program = export(dir.path(), 0);
    let cache = dir.path().join("prompt.safetensors");
    let prompt = kv_example::Config::tiny().prompt;

    let first = stdout_json(&cached_run(&program, &cache, &prompt, 4));
    assert_eq!(first["prompt_cache"]["reused_positions"], 0, "no file yet: {first}");
    let fresh = tokens(&first);
    assert_eq!(fresh.len(), 5);
    assert!(cache.is_file(), "the state is saved at the end");

    // The prompt and the first two generated tokens: six positions, five of them (all but the last fed
    // token) taken from the file; the tokens are the fresh run's from there.
    let longer: Vec<i64> = prompt.iter().chain(&fresh[..2]).copied().collect();
    let second = stdout_json(&cached_run(&program, &cache, &longer, 2));
    assert_eq!(second["prompt_cache"]["reused_positions"], 5, "{second}");
    assert_eq!(second["prompt_cache"]["fed_prompt_tokens"], 1, "{second}");
    assert_eq!(tokens(&second), fresh[2..5]);

    // The same prompt again: everything but its last token reused, the same tokens.
    let third = stdout_json(&cached_run(&program, &cache, &prompt, 4));
    assert_eq!(third["prompt_cache"]["reused_positions"], 3, "{third}");
    assert_eq!(tokens(&third), fresh);
}

#[test]
fn a_cache_from_another_program_is_one_error_line() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::create_dir_all(&a).and_then(|()| std::fs::create_dir_all(&b)).expect("dirs");
    let cache = dir.path().join("prompt.safetensors");
    let prompt = kv_example::Config::tiny().prompt;
    stdout_json(&cached_run(&export(&a, 0), &cache, &prompt, 2));
    let line = one_line_error(&cached_run(&export(&b, 1), &cache, &prompt, 2));
    assert!(line.contains("was saved from another program: the blob of method '"), "{line}");
    assert!(line.ends_with("[InvalidArgument]"), "{line}");
}

#[test]
fn a_prompt_cache_with_a_fixed_position_or_a_graph_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let program = export(dir.path(), 0);
    for extra in [&["--position", "5"][..], &["--cuda-graph"][..]] {
        let out = run(host()
            .arg("run")
            .arg(&program)
            .arg("--prompt-cache")
            .arg(dir.path().join("c.safetensors"))
            .args(extra)
            .env_remove("DELEGATE_PLUGIN_PATH"));
        let line = one_line_error(&out);
        assert!(
            line.contains("--prompt-cache decodes from the prompt") && line.ends_with("[InvalidArgument]")
        );
    }
    assert!(!dir.path().join("c.safetensors").exists(), "nothing ran, nothing saved");
}
