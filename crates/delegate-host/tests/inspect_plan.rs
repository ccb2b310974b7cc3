//! `inspect --plan` on the committed real programs: each CUDA call's launches, fused or on their own with a
//! reason, text and JSON telling the same; a program without CUDA calls says so; a bad payload is one line.

use std::path::{Path, PathBuf};

use serde_json::Value;

mod common;
use common::{host, one_line_error, run, stdout_json};

/// Every real fixture is a 2-layer model (docs/real-models.md).
const LAYERS: u64 = 2;

fn real(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/executorch/real").join(name)
}

fn plan_json(path: &Path) -> Value {
    stdout_json(&run(host().args(["inspect", "--plan", "--json"]).arg(path)))
}

fn plan_text(path: &Path) -> String {
    let out = run(host().args(["inspect", "--plan"]).arg(path));
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8")
}

fn count(value: &Value) -> u64 {
    value.as_u64().expect("a count")
}

/// The one CUDA call's plan, with its structure checked: every launch fused or with a reason, the summary's
/// counts those of the launches, the layers covering them.
fn checked_plan(json: &Value) -> &Value {
    let calls = json["calls"].as_array().expect("calls");
    assert_eq!(calls.len(), 1, "{json}");
    assert_eq!(calls[0]["backend"], "CudaBackend");
    assert_eq!(calls[0]["method"], "forward");
    assert!(json["note"].is_null(), "{json}");
    let plan = &calls[0]["plan"];
    let launches = plan["launches"].as_array().expect("launches");
    assert!(!launches.is_empty());
    for (i, launch) in launches.iter().enumerate() {
        assert_eq!(launch["index"], i as u64);
        let fused = launch["fused"].as_bool().expect("fused");
        assert!(!launch["writes"].as_array().expect("writes").is_empty(), "{launch}");
        match launch["reason"].as_str() {
            Some(reason) => {
                assert!(!fused, "a fused launch has no reason: {launch}");
                assert!(reason.contains('\''), "names the op's tensors: {launch}");
            }
            None => assert!(fused && launch["reason"].is_null(), "a launch on its own says why: {launch}"),
        }
    }
    let summary = &plan["summary"];
    let fused = launches.iter().filter(|l| l["fused"] == true).count() as u64;
    assert_eq!(count(&summary["launches"]), launches.len() as u64);
    assert_eq!(
        (count(&summary["fused"]), count(&summary["general"])),
        (fused, launches.len() as u64 - fused)
    );
    let layers = &summary["layers"];
    assert_eq!(layers["rule"], "names", "{layers}");
    assert_eq!(count(&layers["count"]), LAYERS, "{layers}");
    let per_layer: u64 = layers["launches"].as_array().expect("per layer").iter().map(count).sum();
    assert_eq!(count(&layers["before"]) + per_layer + count(&layers["after"]), launches.len() as u64);
    let attention = launches.iter().filter(|l| l["kind"] == "attention").count() as u64;
    assert_eq!(attention, LAYERS, "one attention a layer");
    for layer in 0..LAYERS {
        let in_layer = launches.iter().filter(|l| l["layer"] == layer).count() as u64;
        assert_eq!(in_layer, count(&layers["launches"][layer as usize]), "layer {layer}");
    }
    plan
}

#[test]
fn the_plan_lists_each_launch_and_why_an_op_runs_alone_in_text_and_json_alike() {
    for name in ["llama_f32.cuda.pte", "qwen2_bf16.cuda.pte", "gpt2_f32.cuda.pte"] {
        let path = real(name);
        let json = plan_json(&path);
        let plan = checked_plan(&json);
        let launches = plan["launches"].as_array().expect("launches");
        let text = plan_text(&path);
        // One line per launch (index first), one `why:` line per launch on its own, in the same order.
        let rows: Vec<&str> = text
            .lines()
            .filter(|l| l.split_whitespace().next().is_some_and(|w| w.parse::<usize>().is_ok()))
            .collect();
        assert_eq!(rows.len(), launches.len(), "{name}: {text}");
        for (row, launch) in rows.iter().zip(launches) {
            let kind = launch["kind"].as_str().expect("kind");
            assert!(row.split_whitespace().any(|w| w == kind), "{name}: {row} is a {kind}");
            let first = launch["writes"][0].as_str().expect("a name");
            assert!(row.contains(first), "{name}: {row} writes {first}");
        }
        let whys: Vec<&str> = text.lines().filter_map(|l| l.trim_start().strip_prefix("why: ")).collect();
        let reasons: Vec<&str> = launches.iter().filter_map(|l| l["reason"].as_str()).collect();
        assert_eq!(whys, reasons, "{name}");
        let summary = &plan["summary"];
        let line = format!(
            "{} launches a call, {} fused, {} on their own; {LAYERS} layers (by names)",
            summary["launches"], summary["fused"], summary["general"]
        );
        assert!(text.contains(&line), "{name}: {line} in {text}");
    }
}

#[test]
fn a_program_without_cuda_calls_says_so_in_one_line() {
    let path = real("llama_f32.pte");
    let text = plan_text(&path);
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.starts_with("no call runs on the CUDA delegate (CudaBackend)"), "{text}");
    assert!(text.contains("ReferenceBackend"), "names where its calls run: {text}");
    let json = plan_json(&path);
    assert_eq!(json["note"].as_str(), text.lines().next());
    assert_eq!(json["calls"][0]["backend"], "ReferenceBackend");
    assert!(json["calls"][0]["plan"].is_null());
}

/// The CUDA call's payload: offset and size in the file, as `inspect --json` reports them.
fn payload_extent(path: &Path) -> (usize, usize) {
    let json = stdout_json(&run(host().args(["inspect", "--json"]).arg(path)));
    let payload = &json["methods"][0]["delegate_calls"][0]["payload"];
    (count(&payload["offset"]) as usize, count(&payload["size"]) as usize)
}

#[test]
fn a_corrupt_or_cut_cuda_payload_is_one_error_line_naming_the_call() {
    let original = real("llama_f32.cuda.pte");
    let bytes = std::fs::read(&original).expect("fixture");
    let (offset, size) = payload_extent(&original);
    let dir = tempfile::tempdir().expect("tempdir");
    let flipped = dir.path().join("flipped.pte");
    let mut corrupt = bytes.clone();
    for b in &mut corrupt[offset + size / 2..offset + size / 2 + 16] {
        *b ^= 0x5a;
    }
    std::fs::write(&flipped, &corrupt).expect("write");
    for json in [false, true] {
        let mut cmd = host();
        cmd.args(["inspect", "--plan"]).arg(&flipped);
        if json {
            cmd.arg("--json");
        }
        let line = one_line_error(&run(&mut cmd));
        assert!(line.contains("method 'forward', call at") && line.contains("CudaBackend"), "{line}");
        assert!(line.ends_with(']'), "an ExecuTorch code: {line}");
    }
    let cut = dir.path().join("cut.pte");
    std::fs::write(&cut, &bytes[..offset + size / 2]).expect("write");
    let line = one_line_error(&run(host().args(["inspect", "--plan"]).arg(&cut)));
    assert!(line.contains("cut.pte"), "{line}");
}
