//! The committed ExecuTorch programs of `fixtures/executorch/` (written by `cargo xtask export-pte`, see its
//! README), checked without torch: every program parses; each DelegateCall's blob parses through
//! blob-format with named bindings in the call's argument order; its reference graph is kv-example's decoder
//! (same ops, bit-identical weights); `_planned` programs place every KV output on its buffer's storage and
//! have no write-back left, unplanned ones write each back from storage of its own; `owned` programs have no write-back and no buffer argument; and torch eager's tokens
//! and logits agree with kv-example's oracle.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use blob_format::model::{DType, Dim, Role};
use blob_format::Blob;
use kv_example::{model, Config, Oracle, Weights};
use pte_format::model::{Method, Tensor};
use pte_format::Program;
use ref_graph::{Graph, Op, TensorId};
use serde_json::Value as Json;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/executorch")
}

fn read(name: &str) -> Vec<u8> {
    let path = dir().join(name);
    std::fs::read(&path).unwrap_or_else(|err| panic!("reading {}: {err}", path.display()))
}

fn expected() -> Json {
    serde_json::from_slice(&read("expected.json")).expect("expected.json is JSON")
}

/// `(file, design, methods, planned)` of every program expected.json lists.
fn programs() -> Vec<(String, String, Vec<String>, bool)> {
    let expected = expected();
    let programs = expected["programs"].as_object().expect("programs is an object");
    programs
        .iter()
        .map(|(file, p)| {
            let methods = p["methods"].as_array().expect("methods").iter();
            (
                file.clone(),
                p["design"].as_str().expect("design").to_owned(),
                methods.map(|m| m.as_str().expect("method name").to_owned()).collect(),
                p["planned"].as_bool().expect("planned"),
            )
        })
        .collect()
}

fn dtype_of(t: &Tensor<'_>) -> DType {
    match t.scalar_type.name() {
        "Float" => DType::F32,
        "Long" => DType::I64,
        other => panic!("unexpected scalar type {other}"),
    }
}

fn shape_of(t: &Tensor<'_>) -> Vec<Dim> {
    t.sizes.iter().map(|&s| Dim::Static(s as u64)).collect()
}

/// Every op of `ours` matches kv-example's op at the same position (same kind, operands mapped through the
/// tensors matched so far, same attributes); constants are bit-identical. kv-example's trailing `argmax` (the
/// next-token output) has no counterpart in an ExecuTorch method, which returns the logits.
fn assert_same_graph(ours: &Graph, reference: &Graph, file: &str) {
    let reference_ops: Vec<_> = reference.ops().iter().filter(|op| op.name() != "argmax").collect();
    assert_eq!(ours.ops().len(), reference_ops.len(), "{file}: op count");
    let mut map: BTreeMap<TensorId, TensorId> = BTreeMap::new();
    let name = |g: &Graph, id: TensorId| g.tensor(id).name.clone();
    // Inputs and state by name (the caches keep kv-example's names; tokens and input_pos too).
    for &id in ours.inputs().iter().chain(ours.state()) {
        let theirs =
            reference.find(&name(ours, id)).unwrap_or_else(|| panic!("{file}: no '{}'", name(ours, id)));
        map.insert(id, theirs);
    }
    for (i, (a, b)) in ours.ops().iter().zip(&reference_ops).enumerate() {
        assert_eq!(a.name(), b.name(), "{file}: op {i}");
        if let (Op::RmsNorm { eps: x, .. }, Op::RmsNorm { eps: y, .. }) = (a, b) {
            assert_eq!(x, y, "{file}: op {i} eps");
        }
        if let (Op::Positions { count: x, .. }, Op::Positions { count: y, .. }) = (a, b) {
            assert_eq!(x, y, "{file}: op {i} count");
        }
        for ((role, x), (_, y)) in a.named_operands().into_iter().zip(b.named_operands()) {
            match (ours.constant(x), reference.constant(y)) {
                (Some(cx), Some(cy)) => {
                    assert!(cx == cy, "{file}: op {i} operand '{role}': constant differs from kv-example's");
                    map.insert(x, y);
                }
                (None, None) => assert_eq!(map.get(&x), Some(&y), "{file}: op {i} operand '{role}'"),
                _ => panic!("{file}: op {i} operand '{role}': constant on one side only"),
            }
        }
        map.insert(a.output(), b.output());
        assert_eq!(ours.tensor(a.output()).shape, reference.tensor(b.output()).shape, "{file}: op {i}");
    }
}

fn check_method(file: &str, design: &str, planned: bool, method: &Method<'_>, weights: &Weights) {
    let cfg = Config::tiny();
    let rows = if method.name == "prefill" { cfg.prompt_len() } else { 1 };
    let at = format!("{file} {}", method.name);
    assert_eq!(method.inputs.len(), 2, "{at}: tokens, input_pos");
    assert_eq!(method.outputs.len(), 1, "{at}: logits");
    let tokens = method.tensor(method.inputs[0]).expect("tokens is a tensor");
    assert_eq!((dtype_of(tokens), tokens.sizes.clone()), (DType::I64, vec![rows as i32]), "{at}");

    let calls: Vec<_> = method.delegate_calls().collect();
    assert_eq!(calls.len(), 1, "{at}: one DelegateCall");
    let call = calls[0].1;
    let delegate = &method.delegates[call.delegate];
    assert_eq!(delegate.id, "ReferenceBackend", "{at}");
    let blob = Blob::parse(delegate.processed.data).unwrap_or_else(|e| panic!("{at}: blob: {e}"));
    assert_eq!(blob.header.backend_id, "ReferenceBackend", "{at}");
    let bindings: Vec<_> = blob.header.bindings.iter().filter(|b| b.threaded).collect();
    assert_eq!(bindings.len(), call.args.len(), "{at}: one binding per delegate argument");

    // Bindings are named, in the call's order: each binding's dtype and shape is its argument's, method
    // inputs and outputs bind by their names, buffer arguments by their fully qualified names.
    let buffers = method.mutable_buffers();
    for (b, &arg) in bindings.iter().zip(&call.args) {
        let t = method.tensor(arg).unwrap_or_else(|| panic!("{at}: argument {arg} is not a tensor"));
        assert!(!b.name.is_empty(), "{at}: an unnamed binding");
        assert_eq!(b.dtype, Some(dtype_of(t)), "{at}: binding '{}'", b.name);
        assert_eq!(b.shape.as_deref(), Some(shape_of(t).as_slice()), "{at}: binding '{}'", b.name);
        let expected_name = if arg == method.inputs[0] {
            Some("tokens".to_owned())
        } else if arg == method.inputs[1] {
            Some("input_pos".to_owned())
        } else if arg == method.outputs[0] {
            Some("logits".to_owned())
        } else {
            buffers.iter().find(|buf| buf.value == arg).and_then(|buf| buf.name.map(str::to_owned))
        };
        if let Some(expected_name) = expected_name {
            assert_eq!(b.name, expected_name, "{at}: argument {arg}");
        }
    }
    let inputs = bindings.iter().take_while(|b| b.role == Role::Input).count();
    assert!(bindings[inputs..].iter().all(|b| b.role == Role::Output), "{at}: inputs, then outputs");

    let graph = Graph::decode(blob.engine).unwrap_or_else(|e| panic!("{at}: payload: {e}"));
    let reference = model::build_graph(&cfg, weights, rows).expect("kv-example builds");
    assert_same_graph(&graph, &reference, &at);

    let kernels: Vec<_> = method.kernel_calls().map(|(_, k)| k.name).collect();
    match design {
        "owned" => {
            assert!(kernels.is_empty(), "{at}: no operator outside the delegate, found {kernels:?}");
            assert!(buffers.is_empty(), "{at}: no mutable buffer");
            let names: Vec<_> = bindings.iter().map(|b| b.name.as_str()).collect();
            assert_eq!(names, ["tokens", "input_pos", "logits"], "{at}");
            let state: Vec<_> = graph.state().iter().map(|&id| graph.tensor(id).name.as_str()).collect();
            assert_eq!(state, ["k_cache_0", "v_cache_0"], "{at}");
        }
        "buffers" => {
            assert!(kernels.iter().all(|k| *k == "aten::copy_"), "{at}: only write-backs, found {kernels:?}");
            let mut names: Vec<_> = buffers.iter().filter_map(|b| b.name).collect();
            names.sort_unstable();
            assert_eq!(names, ["k_cache_0", "v_cache_0"], "{at}");
            for buffer in &buffers {
                let name = buffer.name.expect("named");
                let out_name = name.replacen("_cache_", "_cache_out_", 1);
                // Planned: the KV output is on the buffer and the planning pass removed the self-copy.
                let src = if planned {
                    assert!(buffer.write_backs.is_empty(), "{at}: {name} has a write-back left");
                    let position = bindings.iter().position(|b| b.name == out_name).expect("a KV output");
                    call.args[position]
                } else {
                    assert_eq!(buffer.write_backs.len(), 1, "{at}: {name} written back once");
                    buffer.write_backs[0].src.expect("copy_ has a source")
                };
                let position =
                    call.args.iter().position(|&a| a == src).expect("the source is a delegate output");
                assert_eq!(bindings[position].name, out_name, "{at}");
                let placed = method.tensor(src).and_then(|t| t.allocation);
                assert_eq!(
                    placed == Some(buffer.allocation),
                    planned,
                    "{at}: {name}'s KV output at {placed:?}, the buffer at {:?} (planned: {planned})",
                    buffer.allocation
                );
            }
        }
        other => panic!("{at}: unknown design {other}"),
    }
}

#[test]
fn every_fixture_program_is_the_example_decoder_with_named_bindings() {
    let weights = Weights::generate(&Config::tiny());
    let listed = programs();
    let mut on_disk: Vec<_> = std::fs::read_dir(dir())
        .expect("fixtures/executorch exists")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".pte"))
        .collect();
    on_disk.sort_unstable();
    assert_eq!(
        listed.iter().map(|p| p.0.clone()).collect::<Vec<_>>(),
        on_disk,
        "expected.json lists every .pte"
    );
    for (file, design, methods, planned) in listed {
        let bytes = read(&file);
        let program = Program::parse(&bytes).unwrap_or_else(|e| panic!("{file}: {e}"));
        let names: Vec<_> = program.methods.iter().map(|m| m.name.to_owned()).collect();
        let mut sorted = methods.clone();
        sorted.sort_unstable();
        assert_eq!(names, sorted, "{file}: methods");
        for method in &program.methods {
            check_method(&file, &design, planned, method, &weights);
        }
        if methods.len() == 2 && design == "buffers" {
            // Both methods place each cache at one (mem_id, offset): shared across methods.
            let placed = |m: &Method<'_>| {
                let mut v: Vec<_> =
                    m.mutable_buffers().iter().map(|b| (b.name.map(str::to_owned), b.allocation)).collect();
                v.sort_unstable_by(|a, b| a.0.cmp(&b.0));
                v
            };
            assert_eq!(placed(&program.methods[0]), placed(&program.methods[1]), "{file}: shared caches");
        }
    }
}

/// `logits.npy`: f32 `[13, vocab]`, little-endian, C order (numpy's format 1.0 header).
fn logits() -> (Vec<usize>, Vec<f32>) {
    let bytes = read("logits.npy");
    assert_eq!(&bytes[..6], b"\x93NUMPY");
    let header_len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let header = std::str::from_utf8(&bytes[10..10 + header_len]).expect("ASCII header");
    assert!(header.contains("'descr': '<f4'") && header.contains("'fortran_order': False"), "{header}");
    let shape = header.split("'shape': (").nth(1).and_then(|s| s.split(')').next()).expect("shape");
    let shape: Vec<usize> = shape.split(',').filter_map(|d| d.trim().parse().ok()).collect();
    let data = bytes[10 + header_len..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    (shape, data)
}

#[test]
fn torch_tokens_and_logits_match_kv_example_oracle() {
    let cfg = Config::tiny();
    let expected = expected();
    assert_eq!(expected["executorch"], "1.5.1");
    let prompt: Vec<i64> =
        expected["prompt"].as_array().expect("prompt").iter().filter_map(Json::as_i64).collect();
    assert_eq!(prompt, cfg.prompt);
    let steps = expected["steps"].as_u64().expect("steps") as usize;
    let tokens: Vec<i64> =
        expected["tokens"].as_array().expect("tokens").iter().filter_map(Json::as_i64).collect();
    assert_eq!(tokens.len(), steps + 1);

    let argmax = |row: &[f64]| {
        row.iter().enumerate().fold(0, |best, (i, &v)| if v > row[best] { i } else { best }) as i64
    };
    let mut oracle = Oracle::new(&cfg);
    let mut rows = vec![oracle.prefill(&cfg.prompt).expect("prefill").pop().expect("a row")];
    let mut ours = vec![argmax(&rows[0])];
    for step in 0..steps {
        let row = oracle.decode(ours[step], cfg.prompt_len() + step).expect("decode");
        ours.push(argmax(&row));
        rows.push(row);
    }
    assert_eq!(tokens, ours, "torch eager's tokens are kv-example's oracle's");

    let (shape, data) = logits();
    assert_eq!(shape, [steps + 1, cfg.vocab]);
    for (i, (got, want)) in data.iter().zip(rows.iter().flatten()).enumerate() {
        assert!((f64::from(*got) - want).abs() < 1e-4, "logit {i}: torch {got}, oracle {want}");
    }
}
