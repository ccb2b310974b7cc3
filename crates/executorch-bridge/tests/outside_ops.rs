//! A program with an operator outside our delegate (`fixtures/executorch/outside/gelu_1m.pte`: the example
//! decoder with a GeLU MLP written with the error function, whose `aten.erf` the partitioner leaves to
//! ExecuTorch's kernel) runs inside
//! ExecuTorch 1.5.1's own runtime with the reference plugin: two delegate calls with ExecuTorch's kernel
//! between them, torch eager's tokens and logits (`outside/expected.json`, `outside/logits.npy`), no torch
//! needed.

mod common;

use executorch_bridge::runner::{self, Protocol};
use pte_format::model::Instruction;
use pte_format::Program;

#[test]
fn a_program_with_an_op_outside_the_delegate_gives_eager_tokens_in_executorch() {
    // Committed fixtures: a missing one fails, it is not skipped.
    let dir = common::workspace_root().join("fixtures/executorch/outside");
    let text =
        std::fs::read_to_string(dir.join("expected.json")).expect("outside/expected.json is committed");
    let expected: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let tokens: Vec<i64> = serde_json::from_value(expected["tokens"].clone()).expect("tokens");
    let prompt: Vec<i64> = serde_json::from_value(expected["prompt"].clone()).expect("prompt");
    let steps = expected["steps"].as_u64().expect("steps") as usize;
    let bytes = std::fs::read(dir.join(expected["logits"].as_str().expect("logits"))).expect("logits .npy");
    let file = npyz::NpyFile::new(&bytes[..]).expect("an .npy file");
    let width = file.shape()[1] as usize;
    let logits: Vec<f32> = file.into_vec::<f32>().expect("f32 logits");
    let programs = expected["programs"].as_object().expect("programs");
    assert_eq!(programs.len(), 1);
    for (name, meta) in programs {
        let path = dir.join(name);
        // What the partitioner left outside is named, and it is an ExecuTorch kernel call in the program.
        let outside = meta["outside"].as_array().expect("outside");
        let ops: Vec<&str> = outside.iter().map(|o| o["op"].as_str().expect("op")).collect();
        assert_eq!(ops, ["aten.erf.default"], "{name}");
        let data = std::fs::read(&path).expect("read the program");
        let program = Program::parse(&data).expect("a .pte");
        let method = &program.methods[0];
        let (mut delegates, mut kernels) = (0, Vec::new());
        for (_, instruction) in method.instructions() {
            match instruction {
                Instruction::Delegate(_) => delegates += 1,
                Instruction::Kernel(k) => kernels.push(k.name.to_owned()),
                _ => {}
            }
        }
        assert_eq!(delegates, 2, "{name}: the delegate runs on both sides of the error function");
        assert!(kernels.iter().any(|k| k == "aten::erf"), "{name}: kernels {kernels:?}");

        let registry = common::dylib_registry();
        let report = runner::run(
            &path,
            &registry,
            &Protocol { prompt: prompt.clone(), steps, require_zero_copy: false },
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(report.tokens, tokens, "{name}: eager's tokens");
        assert_eq!(report.logits.len(), steps + 1, "{name}");
        for (step, (got, want)) in report.logits.iter().zip(logits.chunks(width)).enumerate() {
            let worst = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(worst <= 1e-4, "{name}: logits row {step} differs by {worst}");
        }
    }
}
