//! Real models in delegate-host (issue 18): every committed real-model fixture (Hugging Face Llama and Qwen2
//! exported with transformers' recipe, `input_ids [1, 1]` and `cache_position [1]`; the hand-written
//! Llama-style decoder) runs on the embedded reference delegate with torch eager's greedy tokens for 32 decode
//! steps, copying no byte of any cache per decode step in zero-copy mode. (Logits are held to eager's and to
//! the f32 oracle in executorch-bridge's `real_models` test, which reads every row.)

#[path = "../../executorch-bridge/tests/common/real_models.rs"]
mod real_models;

mod common;
use common::{run, stdout_json};

#[test]
fn real_models_give_eager_tokens_in_delegate_host_copying_nothing_per_step() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let fixtures = real_models::load(&root);
    let prompt: Vec<String> = fixtures.prompt.iter().map(i64::to_string).collect();
    let mut failures = Vec::new();
    for program in &fixtures.programs {
        let mut cmd = common::host();
        cmd.env_remove("DELEGATE_PLUGIN_PATH").arg("run").arg(&program.path).args([
            "--prompt",
            &prompt.join(","),
            "--steps",
            &fixtures.steps.to_string(),
            "--mode",
            "zero-copy",
            "--json",
        ]);
        let json = stdout_json(&run(&mut cmd));
        let tokens: Vec<i64> =
            json["tokens"].as_array().expect("tokens").iter().map(|t| t.as_i64().expect("i64")).collect();
        if tokens != program.tokens {
            failures.push(format!("{}: tokens {tokens:?}, eager's {:?}", program.name, program.tokens));
        }
        let copied = &json["stats"]["mean_decode_bytes_copied_total"];
        if copied != 0 {
            failures.push(format!("{}: {copied} bytes copied per decode step", program.name));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The same programs for `CudaBackend` on a GPU (`cargo test -p delegate-host --test real_models --
/// --ignored` on an NVIDIA machine): caches and inputs in device memory (the CUDA delegate updates device
/// memory in place), the prompt fed one token per `forward` call, then the device loop, with and without a
/// CUDA graph: eager's tokens, no byte copied and no host synchronisation per decode step.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn real_models_on_the_cuda_delegate_give_eager_tokens_with_no_copy_and_no_sync_per_step() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let fixtures = real_models::load(&root);
    let prompt: Vec<String> = fixtures.prompt.iter().map(i64::to_string).collect();
    let mut failures = Vec::new();
    for program in &fixtures.programs {
        let cuda = program.path.with_file_name(program.name.replace(".pte", ".cuda.pte"));
        for graph in [false, true] {
            let mut cmd = common::host();
            cmd.env_remove("DELEGATE_PLUGIN_PATH").arg("run").arg(&cuda).args([
                "--prompt",
                &prompt.join(","),
                "--steps",
                &fixtures.steps.to_string(),
                "--json",
            ]);
            if graph {
                cmd.arg("--cuda-graph");
            }
            let json = stdout_json(&run(&mut cmd));
            let tokens: Vec<i64> =
                json["tokens"].as_array().expect("tokens").iter().map(|t| t.as_i64().expect("i64")).collect();
            let stats = &json["stats"];
            let what = format!("{} (graph {graph})", program.name);
            if tokens != program.tokens {
                failures.push(format!("{what}: tokens {tokens:?}, eager's {:?}", program.tokens));
            }
            if stats["mean_decode_bytes_copied_total"] != 0 || stats["host_syncs_per_decode_step"] != 0.0 {
                failures.push(format!("{what}: copies or syncs per step: {stats}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The cache lifecycle on device caches, through the CLI (`--ignored` on an NVIDIA machine): on the Hugging
/// Face Llama program for `CudaBackend` (caches in device memory), a prompt that reuses a saved prefix
/// (`--prompt-cache`: restore) and a branch forked at the prompts' common prefix (`--branch`: fork on the
/// device) give the tokens of fresh runs.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn restore_and_fork_of_device_caches_give_the_fresh_runs_tokens() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let program = root.join("fixtures/executorch/real/llama_f32.cuda.pte");
    let dir = tempfile::tempdir().expect("temp dir");
    let a: Vec<String> = (0..40).map(|i: i64| ((i * 7 + 3) % 128).to_string()).collect();
    let mut b = a[..36].to_vec();
    b.extend((0..4).map(|i: i64| ((i * 11 + 5) % 128).to_string()));
    let (a, b) = (a.join(","), b.join(","));
    let run = |args: &[&str]| {
        let mut cmd = common::host();
        cmd.env_remove("DELEGATE_PLUGIN_PATH").arg("run").arg(&program).args(args).arg("--json");
        stdout_json(&common::run(&mut cmd))
    };
    let tokens = |json: &serde_json::Value| json["tokens"].clone();
    let fresh_b = run(&["--prompt", &b, "--steps", "8"]);
    let cache = dir.path().join("a.safetensors");
    let cache = cache.to_str().expect("utf-8 path");
    run(&["--prompt", &a, "--steps", "1", "--prompt-cache", cache]);
    let restored = run(&["--prompt", &b, "--steps", "8", "--prompt-cache", cache]);
    assert_eq!(restored["prompt_cache"]["reused_positions"], 36, "{restored}");
    assert_eq!(tokens(&restored), tokens(&fresh_b), "restored device caches decode as a fresh run");
    let branched = run(&["--prompt", &a, "--branch", &b, "--steps", "8"]);
    assert_eq!(branched["branch"]["fork_position"], 36, "{branched}");
    assert_eq!(
        branched["branch"]["tokens"],
        tokens(&fresh_b),
        "a fork of device caches decodes as a fresh run"
    );
}
