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
