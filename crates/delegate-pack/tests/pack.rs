//! The packer as the exporter drives it: a spec and a constants file on disk, the blob read back.

use std::path::Path;
use std::process::Command;

use blob_format::model::{AliasKind, DType, Dim, Role};
use blob_format::Blob;
use ref_graph::{ElemType, Graph, GraphBuilder};
use serde_json::{json, Value};

/// A cache layer: `tokens`, `input_pos`, a caller cache (or delegate-owned state) -> `attn` (+ `k_cache_out`).
fn graph(owned: bool) -> Graph {
    let mut b = GraphBuilder::new();
    let tokens = b.input("tokens", ElemType::I64, &[1]).expect("fresh");
    let pos = b.input("input_pos", ElemType::I64, &[1]).expect("fresh");
    let cache = if owned {
        b.state("k_cache", ElemType::F32, &[1, 4, 2])
    } else {
        b.input("k_cache", ElemType::F32, &[1, 4, 2])
    };
    let cache = cache.expect("fresh");
    let emb = b.constant_f32("emb", &[3, 2], vec![0.25, -1.0, 2.0, 0.5, 3.0, -0.75]).expect("sized");
    let x = b.gather("x", emb, tokens).expect("typed");
    let k = b.kv_cache_update("k_cache_out", cache, x, pos).expect("typed");
    let attn = b.causal_attention("attn", x, k, k, pos).expect("typed");
    b.output(attn).expect("declared");
    if !owned {
        b.output(k).expect("declared");
    }
    b.finish().expect("valid")
}

/// The graph's payload split as the exporter writes it: (JSON description, constants section).
fn parts(graph: &Graph) -> (Value, Vec<u8>) {
    let payload = graph.encode();
    let json_len = u32::from_le_bytes(payload[8..12].try_into().expect("4 bytes")) as usize;
    let data_start = (16 + json_len).div_ceil(16) * 16;
    (serde_json::from_slice(&payload[16..16 + json_len]).expect("json"), payload[data_start..].to_vec())
}

fn spec(graph: &Graph, bindings: Value) -> (Value, Vec<u8>) {
    let (description, constants) = parts(graph);
    let spec = json!({
        "backend": "ReferenceBackend",
        "graph": description,
        "constants_file": "constants.bin",
        "bindings": bindings,
        "producer": {"name": "pack tests", "version": "1"},
    });
    (spec, constants)
}

fn write(dir: &Path, spec: &Value, constants: &[u8]) -> std::path::PathBuf {
    std::fs::write(dir.join("constants.bin"), constants).expect("write constants");
    let path = dir.join("spec.json");
    std::fs::write(&path, serde_json::to_vec_pretty(spec).expect("json")).expect("write spec");
    path
}

fn run_cli(spec: &Path, out: &Path) -> (bool, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_delegate-pack")).arg(spec).arg(out).output().expect("runs");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (output.status.code() == Some(0), text(&output.stdout), text(&output.stderr))
}

#[test]
fn bindings_follow_the_spec_order_and_aliases_come_from_the_graph() {
    let dir = tempfile::tempdir().expect("tempdir");
    let order = json!([
        {"name": "input_pos", "role": "input"}, {"name": "tokens", "role": "input"},
        {"name": "k_cache", "role": "input"}, {"name": "k_cache_out", "role": "output"},
        {"name": "attn", "role": "output"},
    ]);
    let (spec, constants) = spec(&graph(false), order);
    let out = dir.path().join("layer.blob");
    let (ok, stdout, stderr) = run_cli(&write(dir.path(), &spec, &constants), &out);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("5 bindings, 1 aliases"), "{stdout}");

    let bytes = std::fs::read(&out).expect("blob written");
    let blob = Blob::parse(&bytes).expect("a valid native blob");
    blob.verify_payload().expect("checksummed payload");
    let header = &blob.header;
    let names: Vec<&str> = header.bindings.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, ["input_pos", "tokens", "k_cache", "k_cache_out", "attn"]);
    let cache = &header.bindings[2];
    assert_eq!((cache.role, cache.dtype), (Role::Input, Some(DType::F32)));
    assert_eq!(cache.shape.as_deref(), Some(&[Dim::Static(1), Dim::Static(4), Dim::Static(2)][..]));
    assert_eq!(header.aliases.len(), 1);
    let alias = &header.aliases[0];
    assert_eq!(
        (alias.output.as_str(), alias.input.as_str(), &alias.kind),
        ("k_cache_out", "k_cache", &AliasKind::KvCacheUpdate)
    );
    assert_eq!(header.backend_id, "ReferenceBackend");
    assert_eq!(Graph::decode(blob.engine).expect("the payload is the graph"), graph(false));
}

#[test]
fn delegate_owned_state_gives_a_blob_without_cache_arguments() {
    let (spec, constants) = spec(
        &graph(true),
        json!([{"name": "tokens", "role": "input"}, {"name": "input_pos", "role": "input"}, {"name": "attn", "role": "output"}]),
    );
    let spec: delegate_pack::Spec = serde_json::from_value(spec).expect("a spec");
    let bytes = delegate_pack::pack(&spec, &constants).expect("packs");
    let blob = Blob::parse(&bytes).expect("valid");
    assert_eq!(blob.header.bindings.len(), 3);
    assert!(blob.header.aliases.is_empty());
    assert_eq!(blob.header.engine_library_version.as_deref(), Some("ref-graph payload 1.2"));
}

#[test]
fn every_bad_spec_is_one_error_line_naming_what_is_wrong() {
    let full = json!([
        {"name": "tokens", "role": "input"}, {"name": "input_pos", "role": "input"},
        {"name": "k_cache", "role": "input"}, {"name": "attn", "role": "output"},
        {"name": "k_cache_out", "role": "output"},
    ]);
    let with_bindings = |bindings: Value| spec(&graph(false), bindings);
    let mut cases: Vec<(&str, Value, Vec<u8>, &str)> = Vec::new();
    let (mut s, c) = with_bindings(full.clone());
    s["backend"] = json!("TensorRTBackend");
    cases.push(("backend", s, c, "backend 'TensorRTBackend' does not run reference-graph payloads"));
    let mut b = full.clone();
    b[4] = json!({"name": "logits", "role": "output"});
    let (s, c) = with_bindings(b);
    cases.push(("unknown tensor", s, c, "binding 4 ('logits'): is not a tensor of the graph"));
    let mut b = full.clone();
    b[2] = json!({"name": "k_cache", "role": "output"});
    let (s, c) = with_bindings(b);
    cases.push((
        "wrong role",
        s,
        c,
        "binding 2 ('k_cache'): is a tensor of the graph but not a graph output",
    ));
    let mut b = full.clone();
    b[1] = json!({"name": "tokens", "role": "input"});
    let (s, c) = with_bindings(b);
    cases.push(("twice", s, c, "binding 1 ('tokens'): is bound twice"));
    let mut b = full.clone();
    b.as_array_mut().expect("array").pop();
    let (s, c) = with_bindings(b);
    cases.push((
        "unbound",
        s,
        c,
        "binding 4 ('k_cache_out'): is a graph input or output that no binding names",
    ));
    let (s, _) = with_bindings(full.clone());
    cases.push(("constants", s, Vec::new(), "the graph: constant 'emb'"));
    let (mut s, c) = with_bindings(full.clone());
    s["graph"]["ops"][0]["op"] = json!("softmax");
    cases.push(("op", s, c, "op 0 is 'softmax'"));
    let (mut s, c) = with_bindings(full);
    s["bindings"][0]["role"] = json!("both");
    cases.push(("json", s, c, "spec "));

    for (what, spec, constants, expected) in cases {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("out.blob");
        let (ok, _, stderr) = run_cli(&write(dir.path(), &spec, &constants), &out);
        assert!(!ok, "{what}: refused");
        assert_eq!(stderr.lines().count(), 1, "{what}: one line: {stderr}");
        assert!(stderr.starts_with("error: ") && stderr.contains(expected), "{what}: {stderr}");
        assert!(stderr.trim_end().ends_with(']'), "{what}: ends with the ExecuTorch code: {stderr}");
        assert!(!out.exists(), "{what}: nothing written");
    }
}

#[test]
fn the_state_list_cannot_be_bound() {
    let (spec, constants) = spec(
        &graph(true),
        json!([
            {"name": "tokens", "role": "input"}, {"name": "input_pos", "role": "input"},
            {"name": "k_cache", "role": "input"}, {"name": "attn", "role": "output"},
        ]),
    );
    let spec: delegate_pack::Spec = serde_json::from_value(spec).expect("a spec");
    let err = delegate_pack::pack(&spec, &constants).expect_err("state is no argument");
    assert_eq!(
        err.to_string(),
        "binding 2 ('k_cache'): is delegate-owned state, which is never a delegate argument"
    );
}

/// A mutable buffer overwritten in place by an `assign` (Hugging Face StaticCache's `cumulative_length`)
/// is declared as an alias of the engine's own in-place kind, exactly as a cache update, so hosts bind the
/// output to the buffer's memory.
#[test]
fn an_assigned_buffer_is_declared_as_an_in_place_alias() {
    let mut b = GraphBuilder::new();
    let pos = b.input("cache_position", ElemType::I64, &[1]).expect("fresh");
    let length = b.input("cumulative_length_0", ElemType::I64, &[]).expect("fresh");
    let first = b.reshape("first", pos, &[]).expect("one element");
    let written = b.assign("cumulative_length_out_0", length, first).expect("typed");
    b.output(written).expect("declared");
    let graph = b.finish().expect("valid");
    let (spec, constants) = spec(
        &graph,
        json!([
            {"name": "cumulative_length_0", "role": "input"}, {"name": "cache_position", "role": "input"},
            {"name": "cumulative_length_out_0", "role": "output"},
        ]),
    );
    let spec: delegate_pack::Spec = serde_json::from_value(spec).expect("a spec");
    let bytes = delegate_pack::pack(&spec, &constants).expect("packs");
    let blob = Blob::parse(&bytes).expect("valid");
    let alias = blob.header.aliases.first().expect("one alias");
    assert_eq!(
        (alias.output.as_str(), alias.input.as_str(), &alias.kind),
        ("cumulative_length_out_0", "cumulative_length_0", &AliasKind::KvCacheUpdate)
    );
    assert_eq!(blob.header.engine_library_version.as_deref(), Some("ref-graph payload 1.3"));
}

/// Constants of every element type, most needing padding to the constant alignment, one larger than the
/// 1 MiB the packer copies at a time.
fn every_dtype() -> Graph {
    let mut b = GraphBuilder::new();
    let tokens = b.input("tokens", ElemType::I64, &[1]).expect("fresh");
    let big: Vec<f32> = (0..300_001).map(|i| i as f32 * 0.25 - 3.0).collect();
    let emb = b.constant_f32("emb", &[300_001, 1], big).expect("sized");
    let h = b.constant_f16("h", &[3], vec![ref_graph::half::f16::from_f32(1.5); 3]).expect("sized");
    let bf = b.constant_bf16("bf", &[1], vec![ref_graph::half::bf16::from_f32(-2.25)]).expect("sized");
    let ids = b.constant_i64("ids", &[1], vec![-3]).expect("sized");
    let row = b.gather("row", emb, tokens).expect("typed");
    let h32 = b.cast("h32", h, ElemType::F32).expect("typed");
    let bf32 = b.cast("bf32", bf, ElemType::F32).expect("typed");
    let sum = b.add("sum", h32, bf32).expect("typed");
    let mixed = b.add("mixed", row, sum).expect("broadcasts");
    let next = b.add("next", tokens, ids).expect("typed");
    b.output(mixed).expect("declared");
    b.output(next).expect("declared");
    b.finish().expect("valid")
}

/// `delegate-pack` streams the constants from their file into the blob without holding them; the blob is
/// the very bytes of the one built in memory from the same spec and constants.
#[test]
fn the_packed_file_is_the_blob_built_in_memory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let order = json!([
        {"name": "next", "role": "output"}, {"name": "tokens", "role": "input"},
        {"name": "mixed", "role": "output"},
    ]);
    let (spec, constants) = spec(&every_dtype(), order);
    let out = dir.path().join("packed.blob");
    let (ok, _, stderr) = run_cli(&write(dir.path(), &spec, &constants), &out);
    assert!(ok, "{stderr}");
    let packed = std::fs::read(&out).expect("blob written");
    let spec: delegate_pack::Spec = serde_json::from_value(spec).expect("a spec");
    let in_memory = delegate_pack::pack(&spec, &constants).expect("packs");
    assert_eq!(packed.len(), in_memory.len());
    assert!(packed == in_memory, "the packed file differs from the blob built in memory");
    let blob = Blob::parse(&packed).expect("valid");
    blob.verify_payload().expect("checksummed payload");
    assert!(Graph::decode(blob.engine).expect("decodes") == every_dtype(), "the payload is another graph");
}
