//! Real models in ExecuTorch 1.5.1's own runtime (issue 18): Hugging Face `LlamaForCausalLM` and
//! `Qwen2ForCausalLM` exported with transformers' ExecuTorch recipe, and a hand-written Llama-style decoder,
//! each delegated whole to `ReferenceBackend` (nothing left outside), give torch eager's greedy tokens for 32
//! decode steps: f32 with eager's logits, f16 and bf16 within the stated tolerance of the f32 oracle
//! (`common/real_models.rs`). No torch needed: the fixtures are committed.

mod common;

#[path = "common/real_models.rs"]
mod real_models;

use executorch_bridge::runner::{self, Protocol};

#[test]
fn real_models_give_eager_tokens_in_executorch_on_the_reference_delegate() {
    let fixtures = real_models::load(&common::workspace_root());
    assert!(
        fixtures.programs.len() >= 15,
        "llama and qwen2 in f32/f16/bf16, the LayerNorm families and the hand-written model"
    );
    let registry = common::dylib_registry();
    let mut failures = Vec::new();
    for program in &fixtures.programs {
        assert_eq!(program.outside, 0, "{}: the whole decoder is delegated", program.name);
        let protocol =
            Protocol { prompt: fixtures.prompt.clone(), steps: fixtures.steps, require_zero_copy: false };
        match runner::run(&program.path, &registry, &protocol) {
            Ok(report) => {
                if let Err(e) = real_models::check(program, &report.tokens, &report.logits) {
                    failures.push(e);
                }
            }
            Err(e) => failures.push(format!("{}: {e}", program.name)),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
