//! A chunked prefill in ExecuTorch's own runtime (issue 48 item 4): `et-run` feeds the prompt as host-runtime's
//! generation protocol plans it, chunks of the prefill method's token count through `prefill`, a tail short of
//! a chunk as the prompt's last chunk again (a prompt shorter than a chunk one token a call through `decode`),
//! so a two-method program takes a prompt of any length.
//! `fixtures/executorch/prefill/llama_f32.pte` is the Hugging Face Llama of the real-model fixtures with a
//! `prefill` of 3 tokens a call; its tokens are torch eager's, and, for other prompts, those of the one-method
//! program of the same weights (`real/llama_f32.pte`, fed one token a call).

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/executorch")
}

fn et_run(program: &Path, prompt: &[i64], steps: usize) -> Output {
    let prompt: Vec<String> = prompt.iter().map(i64::to_string).collect();
    std::process::Command::new(env!("CARGO_BIN_EXE_et-run"))
        .arg(program)
        .args(["--prompt-ids", &prompt.join(","), "--steps", &steps.to_string(), "--json"])
        .env_remove("DELEGATE_PLUGIN_PATH")
        .output()
        .expect("et-run runs")
}

/// The tokens of a successful run's JSON report.
fn tokens(out: &Output) -> Vec<i64> {
    assert!(out.status.success(), "exit {:?}, stderr: {}", out.status, String::from_utf8_lossy(&out.stderr));
    let json: Value = serde_json::from_slice(&out.stdout).expect("stdout is one JSON value");
    serde_json::from_value(json["tokens"].clone()).expect("tokens")
}

#[test]
fn a_prompt_longer_than_a_chunk_gives_eager_tokens() {
    let dir = fixtures().join("prefill");
    let expected: Value =
        serde_json::from_slice(&std::fs::read(dir.join("expected.json")).expect("expected.json"))
            .expect("json");
    let prompt: Vec<i64> = serde_json::from_value(expected["prompt"].clone()).expect("prompt");
    let entry = &expected["programs"]["llama_f32.pte"];
    assert_eq!((prompt.len(), entry["prefill_chunk"].as_u64()), (4, Some(3)), "a chunk and a tail of one");
    let eager: Vec<i64> = serde_json::from_value(entry["tokens"].clone()).expect("tokens");
    let steps = expected["steps"].as_u64().expect("steps") as usize;
    assert_eq!(tokens(&et_run(&dir.join("llama_f32.pte"), &prompt, steps)), eager, "eager's tokens");
}

#[test]
fn prompts_of_any_length_give_the_tokens_of_token_by_token_prefill() {
    let chunked = fixtures().join("prefill/llama_f32.pte");
    let one_by_one = fixtures().join("real/llama_f32.pte");
    let long: Vec<i64> = (0..11).map(|i| (i * 37 + 5) % 128).collect();
    // Shorter than a chunk (decode alone), exactly one, two chunks, and chunks with a tail of two (the last
    // chunk again).
    for len in [2, 3, 6, 11] {
        let prompt = &long[..len];
        let want = tokens(&et_run(&one_by_one, prompt, 5));
        assert_eq!(tokens(&et_run(&chunked, prompt, 5)), want, "a prompt of {len}");
    }
}
