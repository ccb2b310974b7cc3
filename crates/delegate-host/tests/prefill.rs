//! Prefill in chunks (issue 45 item 4): `fixtures/executorch/prefill/llama_f32.pte` is the Hugging Face Llama of
//! the real-model fixtures (same seed, same weights) exported with a second method, `prefill`, taking 3 tokens
//! a call over the same caches as `decode` (`python -m kv_delegate.export_real fixtures/executorch/prefill --only
//! llama_f32 --prefill-chunk 3`). `run --prompt` takes the prompt in chunks of 3 through `prefill`, and the tokens
//! short of a chunk in one more `prefill` call over the prompt's last 3 (a prompt shorter than a chunk through
//! `decode`, a token a call), on the reference delegate (the oracle), and gives the tokens of token-by-token
//! prefill: torch eager's, and those of the one-method program of the same weights.

mod common;
use common::{run, stdout_json};

use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/executorch")
}

/// `run PROGRAM --prompt PROMPT --steps STEPS --json`'s report.
fn generate(program: &Path, prompt: &[i64], steps: usize) -> serde_json::Value {
    let prompt: Vec<String> = prompt.iter().map(i64::to_string).collect();
    let mut cmd = common::host();
    cmd.env_remove("DELEGATE_PLUGIN_PATH").arg("run").arg(program).args([
        "--prompt",
        &prompt.join(","),
        "--steps",
        &steps.to_string(),
        "--json",
    ]);
    stdout_json(&run(&mut cmd))
}

fn tokens(json: &serde_json::Value) -> Vec<i64> {
    json["tokens"].as_array().expect("tokens").iter().map(|t| t.as_i64().expect("i64")).collect()
}

#[test]
fn a_chunked_prefill_gives_eager_tokens_copying_nothing_per_step() {
    let dir = fixtures().join("prefill");
    let expected: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("expected.json")).expect("expected.json"))
            .expect("json");
    let prompt: Vec<i64> = serde_json::from_value(expected["prompt"].clone()).expect("prompt");
    let entry = &expected["programs"]["llama_f32.pte"];
    assert_eq!(entry["prefill_chunk"], 3);
    let eager: Vec<i64> = serde_json::from_value(entry["tokens"].clone()).expect("tokens");
    let steps = expected["steps"].as_u64().expect("steps") as usize;

    let json = generate(&dir.join("llama_f32.pte"), &prompt, steps);
    assert_eq!(tokens(&json), eager, "eager's tokens");
    let stats = &json["stats"];
    // The prompt of 4: one chunk of 3 through `prefill`, then its last 3 tokens again (positions 1 to 3).
    assert_eq!(stats["prefill_calls"], 2, "{stats}");
    assert!(stats["time_to_first_token_ms"].as_f64().expect("a time") > 0.0, "{stats}");
    assert_eq!(stats["mean_decode_bytes_copied_total"], 0, "{stats}");
}

#[test]
fn chunks_and_a_tail_of_any_length_give_the_tokens_of_token_by_token_prefill() {
    let chunked = fixtures().join("prefill/llama_f32.pte");
    let one_by_one = fixtures().join("real/llama_f32.pte");
    let long: Vec<i64> = (0..11).map(|i| (i * 37 + 5) % 128).collect();
    let mut failures = Vec::new();
    for len in [1, 2, 3, 5, 6, 7, 11] {
        let prompt = &long[..len];
        let json = generate(&chunked, prompt, 6);
        let reference = generate(&one_by_one, prompt, 6);
        let want = tokens(&reference);
        if reference["stats"]["prefill_calls"] != len {
            failures.push(format!("prompt of {len}: the one-method program ran {}", reference["stats"]));
        }
        if tokens(&json) != want {
            failures.push(format!("prompt of {len}: {:?}, token by token {want:?}", tokens(&json)));
        }
        // Whole chunks and the last chunk again for a tail; a prompt shorter than a chunk a token a call.
        let want_calls = if len < 3 { len } else { len.div_ceil(3) };
        let calls = json["stats"]["prefill_calls"].as_u64().expect("calls") as usize;
        if calls != want_calls {
            failures.push(format!("prompt of {len}: {calls} calls, not {want_calls}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_rest_of_a_prompt_after_a_cached_prefix_is_fed_in_chunks_as_a_fresh_run_feeds_it() {
    let program = fixtures().join("prefill/llama_f32.pte");
    let dir = tempfile::tempdir().expect("temp dir");
    let cache = dir.path().join("prompt.safetensors");
    let long: Vec<i64> = (0..12).map(|i| (i * 37 + 5) % 128).collect();
    let cached = |prompt: &[i64]| {
        let prompt: Vec<String> = prompt.iter().map(i64::to_string).collect();
        let mut cmd = common::host();
        cmd.env_remove("DELEGATE_PLUGIN_PATH").arg("run").arg(&program).args(["--prompt", &prompt.join(",")]);
        cmd.args(["--steps", "4", "--json", "--prompt-cache"]).arg(&cache);
        stdout_json(&run(&mut cmd))
    };
    cached(&long[..4]);
    // 4 positions reused, the 8 tokens after them fed from position 4: two chunks of 3, then the last 3 again.
    let json = cached(&long);
    assert_eq!(json["prompt_cache"]["reused_positions"], 4, "{json}");
    assert_eq!(tokens(&json), tokens(&generate(&program, &long, 4)), "a fresh run's tokens");
}

/// The same program for `CudaBackend` on a GPU (`cargo test -p delegate-host --test prefill -- --ignored` on an
/// NVIDIA machine): the prompt's chunks and tail, then the device loop, with and without a CUDA graph, give the
/// reference delegate's tokens with nothing copied and no host synchronisation per decode step.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_chunked_prefill_on_the_cuda_delegate_gives_the_reference_tokens() {
    let dir = fixtures().join("prefill");
    let long: Vec<i64> = (0..11).map(|i| (i * 37 + 5) % 128).collect();
    let mut failures = Vec::new();
    for len in [2, 4, 9, 11] {
        let prompt: Vec<String> = long[..len].iter().map(i64::to_string).collect();
        let want = tokens(&generate(&dir.join("llama_f32.pte"), &long[..len], 16));
        for graph in [false, true] {
            let mut cmd = common::host();
            cmd.env_remove("DELEGATE_PLUGIN_PATH").arg("run").arg(dir.join("llama_f32.cuda.pte")).args([
                "--prompt",
                &prompt.join(","),
                "--steps",
                "16",
                "--json",
            ]);
            if graph {
                cmd.arg("--cuda-graph");
            }
            let json = stdout_json(&run(&mut cmd));
            let stats = &json["stats"];
            if tokens(&json) != want {
                failures.push(format!(
                    "prompt of {len} (graph {graph}): {:?}, reference {want:?}",
                    tokens(&json)
                ));
            }
            if stats["mean_decode_bytes_copied_total"] != 0 || stats["host_syncs_per_decode_step"] != 0.0 {
                failures.push(format!("prompt of {len} (graph {graph}): copies or syncs per step: {stats}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
