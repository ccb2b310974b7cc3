use serde_json::{json, Value};

use super::*;

/// A small decoder layer: embedding, projections, in-place cache update, attention, output projection.
fn sample() -> Graph {
    let mut b = GraphBuilder::new();
    let tokens = b.input("tokens", ElemType::I64, &[2]).expect("fresh name");
    let pos = b.input("input_pos", ElemType::I64, &[1]).expect("fresh name");
    let cache = b.input("k_cache", ElemType::F32, &[1, 4, 2]).expect("fresh name");
    let emb = b.constant_f32("emb", &[3, 2], vec![0.5; 6]).expect("6 values");
    let w = b.constant_f32("w", &[2, 2], vec![1.0, 0.0, 0.0, 1.0]).expect("4 values");
    let x = b.gather("x", emb, tokens).expect("typed");
    let k = b.mat_mul("k", x, w).expect("typed");
    let k_out = b.kv_cache_update("k_cache_out", cache, k, pos).expect("typed");
    let attn = b.causal_attention("attn", x, k_out, k_out, pos).expect("typed");
    b.output(attn).expect("declared");
    b.output(k_out).expect("declared");
    b.finish().expect("valid")
}

/// The same layer in `f16` (caches, activations and weights), ending in an argmax of the attention output.
fn sample_f16() -> Graph {
    let h = half::f16::from_f32;
    let mut b = GraphBuilder::new();
    let tokens = b.input("tokens", ElemType::I64, &[2]).expect("fresh name");
    let pos = b.input("input_pos", ElemType::I64, &[1]).expect("fresh name");
    let cache = b.input("k_cache", ElemType::F16, &[1, 4, 2]).expect("fresh name");
    let emb = b.constant_f16("emb", &[3, 2], vec![h(0.5), h(-1.25), h(3.0), h(65504.0), h(1e-7), h(-0.0)]);
    let emb = emb.expect("6 values");
    let w = b.constant_f16("w", &[2, 2], [1.0, 0.0, 0.0, 1.0].map(h).to_vec()).expect("4 values");
    let x = b.gather("x", emb, tokens).expect("typed");
    let k = b.mat_mul("k", x, w).expect("typed");
    let k_out = b.kv_cache_update("k_cache_out", cache, k, pos).expect("typed");
    let attn = b.causal_attention("attn", x, k_out, k_out, pos).expect("typed");
    let next = b.argmax("next", attn).expect("typed");
    b.output(attn).expect("declared");
    b.output(k_out).expect("declared");
    b.output(next).expect("declared");
    b.finish().expect("valid")
}

/// Re-packs a payload after editing its JSON description, keeping the constant section.
fn rewrite(payload: &[u8], edit: impl FnOnce(&mut Value)) -> Vec<u8> {
    let json_len = u32::from_le_bytes(payload[8..12].try_into().expect("4 bytes")) as usize;
    let data_start = (16 + json_len).div_ceil(CONSTANT_ALIGN as usize) * CONSTANT_ALIGN as usize;
    let mut description: Value = serde_json::from_slice(&payload[16..16 + json_len]).expect("valid json");
    edit(&mut description);
    let json = serde_json::to_vec(&description).expect("serializes");
    let mut out = payload[..8].to_vec();
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&json);
    out.resize((16 + json.len()).div_ceil(16) * 16, 0);
    out.extend_from_slice(&payload[data_start..]);
    out
}

fn decode_err(payload: &[u8]) -> Error {
    Graph::decode(payload).expect_err("the payload is corrupt")
}

#[test]
fn encode_then_decode_round_trips() {
    let graph = sample();
    let payload = graph.encode();
    assert_eq!(&payload[..4], b"RGRF");
    assert_eq!(Graph::decode(&payload).expect("valid payload"), graph);
}

#[test]
fn f16_graphs_round_trip_with_little_endian_constants() {
    let graph = sample_f16();
    let payload = graph.encode();
    // A graph without state is written as 1.1, so 1.1 readers keep reading it.
    assert_eq!(u16::from_le_bytes([payload[6], payload[7]]), 1);
    assert_eq!(graph.payload_version(), (1, 1));
    let decoded = Graph::decode(&payload).expect("valid payload");
    assert_eq!(decoded, graph);
    let emb = decoded.find("emb").expect("declared");
    let Some(Data::F16(values)) = decoded.constant(emb) else { panic!("emb is an f16 constant") };
    let bits: Vec<u16> = values.iter().map(|v| v.to_bits()).collect();
    // 0.5, -1.25, 3.0, 65504 (f16::MAX), 1e-7 (a subnormal), -0.0: every bit survives.
    assert_eq!(bits, [0x3800, 0xbd00, 0x4200, 0x7bff, 0x0002, 0x8000]);
    assert_eq!(decoded.tensor(emb).dtype, ElemType::F16);
    assert_eq!(decoded.tensor(emb).nbytes(), 12);

    // The constant section holds the bits little-endian, 2 bytes each.
    let json_len = u32::from_le_bytes(payload[8..12].try_into().expect("4 bytes")) as usize;
    let description: Value = serde_json::from_slice(&payload[16..16 + json_len]).expect("json");
    assert!(description["tensors"].as_array().expect("array").iter().any(|t| t["dtype"] == "f16"));
    let data_start = (16 + json_len).div_ceil(16) * 16;
    let c = description["constants"].as_array().expect("array");
    let c = c.iter().find(|c| c["tensor"] == "emb").expect("emb");
    assert_eq!(c["nbytes"].as_u64(), Some(12));
    let offset = data_start + c["offset"].as_u64().expect("offset") as usize;
    assert_eq!(payload[offset..offset + 4], [0x00, 0x38, 0x00, 0xbd]);
}

#[test]
fn f16_constants_of_the_wrong_size_are_refused() {
    // 6 f16 values are 12 bytes; declaring the f32 size is a typed error, not a misread.
    let payload = rewrite(&sample_f16().encode(), |d| {
        let constants = d["constants"].as_array_mut().expect("array");
        let c = constants.iter_mut().find(|c| c["tensor"] == "emb").expect("emb");
        c["nbytes"] = json!(24);
    });
    let err = decode_err(&payload);
    assert!(matches!(&err, Error::BadConstant { name, .. } if name == "emb"), "{err}");
    assert!(err.to_string().contains("tensor f16 [3, 2] needs 12 bytes"), "{err}");
    let mut b = GraphBuilder::new();
    let err = b.constant_f16("c", &[2], vec![half::f16::ONE]).expect_err("1 value for 2");
    assert!(matches!(err, Error::BadConstant { .. }), "{err}");
}

#[test]
fn float_operands_of_one_op_share_one_float_type() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", ElemType::F16, &[1, 2]).expect("fresh");
    let w32 = b.constant_f32("w32", &[2, 2], vec![0.0; 4]).expect("4 values");
    let err = b.mat_mul("y", x, w32).expect_err("f16 x f32");
    assert_eq!(
        err.to_string(),
        "op 0 (mat_mul): operand 'b' ('w32') is f32, but operand 'a' ('x') is f16: the float operands of one \
         op share one float type"
    );
    let g32 = b.constant_f32("g32", &[2], vec![1.0; 2]).expect("2 values");
    let err = b.rms_norm("n", x, g32, 1e-5).expect_err("f16 input, f32 weight");
    assert!(
        err.to_string().contains("operand 'weight' ('g32') is f32, but operand 'input' ('x') is f16"),
        "{err}"
    );
    let idx = b.input("idx", ElemType::I64, &[1, 2]).expect("fresh");
    let err = b.div("s", idx, idx).expect_err("div takes floats only");
    assert!(
        err.to_string().contains("operand 'a' ('idx') is i64 [1, 2], expected f32, f16 or bf16"),
        "{err}"
    );

    // Same type throughout: the output takes it.
    let w16 = b.constant_f16("w16", &[2, 2], vec![half::f16::ZERO; 4]).expect("4 values");
    let y = b.mat_mul("y", x, w16).expect("f16 x f16");
    let s = b.add("s", y, x).expect("f16 + f16");
    b.output(s).expect("declared");
    let graph = b.finish().expect("valid");
    assert_eq!(graph.tensor(y).dtype, ElemType::F16);
    assert_eq!(graph.tensor(s).dtype, ElemType::F16);

    // A cache update whose rows are f32 into an f16 cache, and attention mixing them, are refused.
    let mut b = GraphBuilder::new();
    let pos = b.input("pos", ElemType::I64, &[1]).expect("fresh");
    let cache = b.input("cache", ElemType::F16, &[1, 2, 2]).expect("fresh");
    let update = b.input("update", ElemType::F32, &[1, 2]).expect("fresh");
    let err = b.kv_cache_update("cache_out", cache, update, pos).expect_err("f32 rows into an f16 cache");
    assert!(err.to_string().contains("operand 'update' ('update') is f32, but operand 'cache'"), "{err}");

    // Decoding checks the same rule: a declared output type that disagrees is refused.
    let payload = rewrite(&sample_f16().encode(), |d| {
        let tensors = d["tensors"].as_array_mut().expect("array");
        tensors.iter_mut().find(|t| t["name"] == "k").expect("k")["dtype"] = json!("f32");
    });
    let err = decode_err(&payload);
    assert!(
        err.to_string().contains("output 'k' is declared f32 [2, 2], but the op computes f16 [2, 2]"),
        "{err}"
    );
}

/// The one argmax rule: first of equals, NaN never wins (first or anywhere), all NaN the last index, empty 0.
#[test]
fn argmax_takes_the_first_largest_and_never_a_nan() {
    let nan = f32::NAN;
    let cases: [(&[f32], usize); 9] = [
        (&[0.5, 2.0, 2.0, -1.0], 1),
        (&[nan, 1.0, 0.5], 1),
        (&[nan, -5.0], 1),
        (&[1.0, nan, 3.0, nan], 2),
        (&[f32::NEG_INFINITY, nan, f32::NEG_INFINITY], 0),
        (&[-3.0, f32::INFINITY, f32::INFINITY], 1),
        (&[nan, nan, nan], 2),
        (&[3.0], 0),
        (&[], 0),
    ];
    for (row, expected) in cases {
        assert_eq!(crate::argmax(row), expected, "{row:?}");
    }
}

#[test]
fn argmax_reads_a_float_matrix_and_gives_one_i64() {
    let graph = sample_f16();
    let next = graph.find("next").expect("declared");
    assert_eq!(graph.tensor(next).dtype, ElemType::I64);
    assert_eq!(graph.tensor(next).shape, [1]);
    let op = graph.ops().last().expect("ops");
    assert_eq!(op.name(), "argmax");
    assert_eq!(op.named_operands(), [("input", graph.find("attn").expect("declared"))]);
    assert_eq!(op.output(), next);

    let mut b = GraphBuilder::new();
    let v = b.input("v", ElemType::F32, &[4]).expect("fresh");
    let err = b.argmax("a", v).expect_err("rank 1");
    assert_eq!(
        err.to_string(),
        "op 0 (argmax): operand 'input' ('v') is f32 [4], expected f32, f16 or bf16 of rank at least 2"
    );
    let ids = b.input("ids", ElemType::I64, &[1, 4]).expect("fresh");
    assert!(b.argmax("a", ids).is_err(), "an i64 matrix has no float argmax");
    let m = b.input("m", ElemType::F32, &[3, 4]).expect("fresh");
    let a = b.argmax("a", m).expect("typed");
    b.output(a).expect("declared");
    let graph = b.finish().expect("valid");
    assert_eq!(Graph::decode(&graph.encode()).expect("round trip"), graph);

    // In the payload it is spelled "argmax" with role "input"; a declared output of another type is refused.
    let payload = sample_f16().encode();
    let json_len = u32::from_le_bytes(payload[8..12].try_into().expect("4 bytes")) as usize;
    let description: Value = serde_json::from_slice(&payload[16..16 + json_len]).expect("json");
    assert_eq!(description["ops"][4], json!({ "op": "argmax", "input": "attn", "out": "next" }));
    let payload = rewrite(&payload, |d| {
        let tensors = d["tensors"].as_array_mut().expect("array");
        tensors.iter_mut().find(|t| t["name"] == "next").expect("next")["shape"] = json!([2]);
    });
    let err = decode_err(&payload);
    assert!(
        err.to_string().contains("output 'next' is declared i64 [2], but the op computes i64 [1]"),
        "{err}"
    );
}

#[test]
fn constants_are_aligned_little_endian() {
    let payload = sample().encode();
    let json_len = u32::from_le_bytes(payload[8..12].try_into().expect("4 bytes")) as usize;
    let description: Value = serde_json::from_slice(&payload[16..16 + json_len]).expect("json");
    let data_start = (16 + json_len).div_ceil(16) * 16;
    for constant in description["constants"].as_array().expect("array") {
        let offset = constant["offset"].as_u64().expect("offset") as usize;
        assert_eq!(offset % 16, 0);
        if constant["tensor"] == "w" {
            let bytes = &payload[data_start + offset..data_start + offset + 4];
            assert_eq!(f32::from_le_bytes(bytes.try_into().expect("4 bytes")), 1.0);
        }
    }
}

#[test]
fn the_graph_reports_its_in_place_alias_like_tensorrt() {
    let graph = sample();
    assert!(graph.reports_aliases());
    assert_eq!(graph.aliased_input("k_cache_out").as_deref(), Some("k_cache"));
    assert_eq!(graph.aliased_input("attn"), None);
    assert_eq!(graph.aliased_input("no such tensor"), None);
    let names: Vec<_> = EngineIntrospect::tensors(&graph).into_iter().map(|t| (t.name, t.role)).collect();
    assert_eq!(
        names,
        [
            ("tokens".to_owned(), Role::Input),
            ("input_pos".to_owned(), Role::Input),
            ("k_cache".to_owned(), Role::Input),
            ("attn".to_owned(), Role::Output),
            ("k_cache_out".to_owned(), Role::Output),
        ]
    );
}

#[test]
fn prefix_defects_are_typed() {
    let payload = sample().encode();
    assert!(matches!(decode_err(&payload[..10]), Error::TooShort { len: 10, needed: 16 }));
    let mut bad = payload.clone();
    bad[0] = b'X';
    assert!(matches!(decode_err(&bad), Error::BadMagic { .. }));
    let mut newer = payload.clone();
    newer[4] = 2;
    assert!(matches!(decode_err(&newer), Error::UnsupportedVersion { major: 2, minor: 1 }));
    // A 1.0 payload (no f16, no argmax) still reads.
    let mut older = payload.clone();
    older[6..8].copy_from_slice(&0u16.to_le_bytes());
    assert_eq!(Graph::decode(&older).expect("1.0 reads"), sample());
    let mut overrun = payload.clone();
    overrun[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(decode_err(&overrun), Error::SectionOutOfBounds { section: "json", .. }));
    let mut garbage = payload[..16].to_vec();
    garbage[8..12].copy_from_slice(&3u32.to_le_bytes());
    garbage.extend_from_slice(b"{x}");
    assert!(matches!(decode_err(&garbage), Error::Json { .. }));
}

#[test]
fn a_newer_minor_with_unknown_fields_still_reads() {
    let mut payload = rewrite(&sample().encode(), |d| d["future_field"] = json!(42));
    payload[6] = 9;
    assert_eq!(Graph::decode(&payload).expect("minor versions are compatible"), sample());
}

#[test]
fn unknown_op_is_refused_by_name() {
    let payload = rewrite(&sample().encode(), |d| d["ops"][1]["op"] = json!("flash_attention"));
    let err = decode_err(&payload);
    assert!(matches!(&err, Error::UnknownOp { index: 1, op, .. } if op == "flash_attention"), "{err}");
    assert!(err.to_string().contains("known ops: gather, positions"), "{err}");
    let payload = rewrite(&sample().encode(), |d| d["ops"][0] = json!({ "table": "emb" }));
    assert!(matches!(decode_err(&payload), Error::MissingOpName { index: 0 }));
    let payload = rewrite(&sample().encode(), |d| d["ops"][0] = json!({ "op": "gather", "table": "emb" }));
    assert!(matches!(decode_err(&payload), Error::MalformedOp { index: 0, .. }));
}

#[test]
fn dangling_tensor_names_are_refused() {
    let payload = rewrite(&sample().encode(), |d| d["ops"][1]["b"] = json!("w_missing"));
    let err = decode_err(&payload);
    assert_eq!(err.to_string(), "op 1 (mat_mul) refers to tensor 'w_missing', which is not declared");
    let payload = rewrite(&sample().encode(), |d| d["outputs"][0] = json!("nope"));
    assert!(matches!(decode_err(&payload), Error::DanglingTensor { .. }));
}

#[test]
fn shape_mismatches_are_refused() {
    // The weight becomes [3, 2]: the mat_mul's inner extents no longer agree (and its bytes no longer fit).
    let payload = rewrite(&sample().encode(), |d| {
        let tensors = d["tensors"].as_array_mut().expect("array");
        let w = tensors.iter_mut().find(|t| t["name"] == "w").expect("w");
        w["shape"] = json!([1, 2]);
        let constants = d["constants"].as_array_mut().expect("array");
        let c = constants.iter_mut().find(|c| c["tensor"] == "w").expect("w");
        c["nbytes"] = json!(8);
    });
    let err = decode_err(&payload);
    assert!(matches!(err, Error::OpMismatch { index: 1, op: "mat_mul", .. }), "{err}");
    // A declared output that disagrees with what the op computes.
    let payload = rewrite(&sample().encode(), |d| {
        let tensors = d["tensors"].as_array_mut().expect("array");
        let attn = tensors.iter_mut().find(|t| t["name"] == "attn").expect("attn");
        attn["shape"] = json!([2, 3]);
    });
    let err = decode_err(&payload);
    assert!(
        err.to_string().contains("output 'attn' is declared f32 [2, 3], but the op computes f32 [2, 2]"),
        "{err}"
    );
    let payload = rewrite(&sample().encode(), |d| d["tensors"][0]["shape"] = json!([0]));
    assert!(matches!(decode_err(&payload), Error::BadShape { .. }));
    let payload = rewrite(&sample().encode(), |d| d["tensors"][0]["shape"] = json!([u64::MAX, 4]));
    assert!(matches!(decode_err(&payload), Error::BadShape { .. }));
}

#[test]
fn out_of_bounds_or_misaligned_constants_are_refused() {
    let edit_w = |field: &'static str, value: Value| {
        rewrite(&sample().encode(), move |d| {
            let constants = d["constants"].as_array_mut().expect("array");
            let c = constants.iter_mut().find(|c| c["tensor"] == "w").expect("w");
            c[field] = value;
        })
    };
    let err = decode_err(&edit_w("offset", json!(1 << 20)));
    assert!(matches!(&err, Error::BadConstant { name, .. } if name == "w"), "{err}");
    assert!(err.to_string().contains("the constant section holds only"), "{err}");
    assert!(matches!(decode_err(&edit_w("offset", json!(u64::MAX - 7))), Error::BadConstant { .. }));
    assert!(matches!(decode_err(&edit_w("offset", json!(4))), Error::BadConstant { .. }));
    assert!(matches!(decode_err(&edit_w("nbytes", json!(12))), Error::BadConstant { .. }));
    let payload = rewrite(&sample().encode(), |d| {
        let constants = d["constants"].as_array_mut().expect("array");
        constants.retain(|c| c["tensor"] != "w");
    });
    assert!(matches!(decode_err(&payload), Error::UseBeforeDefinition { .. }));
}

#[test]
fn definition_rules_are_enforced() {
    // An op reading a tensor defined only later.
    let payload = rewrite(&sample().encode(), |d| {
        let ops = d["ops"].as_array_mut().expect("array");
        ops.swap(0, 1);
    });
    assert!(matches!(decode_err(&payload), Error::UseBeforeDefinition { index: 0, op: "mat_mul", .. }));
    // A tensor both an input and an op output.
    let payload =
        rewrite(&sample().encode(), |d| d["inputs"].as_array_mut().expect("array").push(json!("x")));
    assert!(matches!(decode_err(&payload), Error::DefinedTwice { .. }));
    // A tensor nothing defines.
    let payload = rewrite(&sample().encode(), |d| {
        d["tensors"]
            .as_array_mut()
            .expect("array")
            .push(json!({"name": "orphan", "dtype": "f32", "shape": [1]}))
    });
    assert!(matches!(decode_err(&payload), Error::Undefined { .. }));
    let payload = rewrite(&sample().encode(), |d| d["tensors"][1]["name"] = json!("tokens"));
    assert!(matches!(decode_err(&payload), Error::BadTensorName { problem: "declared twice", .. }));
}

#[test]
fn in_place_caches_are_kept_out_of_other_ops() {
    let mut b = GraphBuilder::new();
    let pos = b.input("pos", ElemType::I64, &[1]).expect("fresh");
    let cache = b.input("cache", ElemType::F32, &[1, 2, 2]).expect("fresh");
    let update = b.input("update", ElemType::F32, &[1, 2]).expect("fresh");
    let out = b.kv_cache_update("cache_out", cache, update, pos).expect("typed");
    // Reading the cache input besides its update would observe in-place semantics.
    let _ = b.add("sum", cache, cache).expect("typed");
    b.output(out).expect("declared");
    let err = b.finish().expect_err("cache read by add");
    assert!(matches!(&err, Error::CacheMisuse { name, .. } if name == "cache"), "{err}");

    // Attention must read caches in place, i.e. kv_cache_update outputs.
    let mut b = GraphBuilder::new();
    let pos = b.input("pos", ElemType::I64, &[1]).expect("fresh");
    let q = b.input("q", ElemType::F32, &[1, 2]).expect("fresh");
    let k = b.input("k", ElemType::F32, &[1, 2, 2]).expect("fresh");
    let attn = b.causal_attention("attn", q, k, k, pos).expect("typed");
    b.output(attn).expect("declared");
    assert!(matches!(b.finish(), Err(Error::CacheMisuse { .. })));
}

#[test]
fn builder_infers_and_checks_shapes() {
    let mut b = GraphBuilder::new();
    let a = b.input("a", ElemType::F32, &[2, 3]).expect("fresh");
    let w = b.constant_f32("w", &[4, 5], vec![0.0; 20]).expect("20 values");
    let err = b.mat_mul("y", a, w).expect_err("3 != 4");
    assert_eq!(err.to_string(), "op 0 (mat_mul): inner extents differ: 'a' is [2, 3] and 'w' is [4, 5]");
    assert!(matches!(b.constant_f32("c", &[2], vec![1.0]), Err(Error::BadConstant { .. })));
    assert!(matches!(b.input("a", ElemType::F32, &[1]), Err(Error::BadTensorName { .. })));
    let pos = b.input("p", ElemType::I64, &[1]).expect("fresh");
    let positions = b.positions("ps", pos, 7).expect("typed");
    let g = b.gather("g", w, positions).expect("typed");
    b.output(g).expect("declared");
    let graph = b.finish().expect("valid");
    assert_eq!(graph.tensor(positions).shape, [7]);
    assert_eq!(graph.tensor(g).shape, [7, 5]);
}

mod fuzz {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Corrupting any bytes of a valid payload (f32; f16 constants and an argmax; or every op of 1.3 and
        /// bf16 constants) gives a graph or a typed error, never a panic.
        #[test]
        fn corrupt_payloads_never_panic(
            edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
            which in 0u8..3,
        ) {
            let sample = [sample, sample_f16, v1_3::sample_1_3][usize::from(which)];
            let mut payload = sample().encode();
            let len = payload.len();
            for (at, byte) in edits {
                payload[at % len] = byte;
            }
            if let Ok(graph) = Graph::decode(&payload) {
                prop_assert!(graph.validate().is_ok());
            }
        }

        /// Truncating a valid payload anywhere is a typed error.
        #[test]
        fn truncated_payloads_are_errors(cut in 0usize..1000) {
            let payload = sample().encode();
            let cut = cut % payload.len();
            prop_assert!(Graph::decode(&payload[..cut]).is_err());
        }
    }
}

/// The sample layer with its cache owned by the delegate (payload 1.2).
fn sample_with_state() -> Graph {
    let mut b = GraphBuilder::new();
    let tokens = b.input("tokens", ElemType::I64, &[2]).expect("fresh name");
    let pos = b.input("input_pos", ElemType::I64, &[1]).expect("fresh name");
    let cache = b.state("k_cache", ElemType::F32, &[1, 4, 2]).expect("fresh name");
    let emb = b.constant_f32("emb", &[3, 2], vec![0.5; 6]).expect("6 values");
    let x = b.gather("x", emb, tokens).expect("typed");
    let k_out = b.kv_cache_update("k_cache_out", cache, x, pos).expect("typed");
    let attn = b.causal_attention("attn", x, k_out, k_out, pos).expect("typed");
    b.output(attn).expect("declared");
    b.finish().expect("valid")
}

#[test]
fn delegate_owned_state_round_trips_as_1_2_and_is_no_engine_tensor() {
    let graph = sample_with_state();
    let cache = graph.find("k_cache").expect("declared");
    assert_eq!(graph.state(), [cache]);
    assert!(graph.is_state(cache) && !graph.inputs().contains(&cache));
    let payload = graph.encode();
    assert_eq!(u16::from_le_bytes([payload[6], payload[7]]), 2, "state needs payload 1.2");
    assert_eq!(graph.payload_version(), (1, 2));
    let decoded = Graph::decode(&payload).expect("valid payload");
    assert_eq!(decoded, graph);
    // Bindings are for engine tensors: the state is neither an input nor an output of the engine.
    let names: Vec<String> = EngineIntrospect::tensors(&decoded).into_iter().map(|t| t.name).collect();
    assert_eq!(names, ["tokens", "input_pos", "attn"]);
}

#[test]
fn state_misuse_is_refused_by_name() {
    // State that no kv_cache_update writes.
    let payload = sample_with_state().encode();
    let unused = rewrite(&payload, |d| {
        d["tensors"]
            .as_array_mut()
            .expect("array")
            .push(json!({"name": "spare", "dtype": "f32", "shape": [2]}));
        d["state"].as_array_mut().expect("array").push(json!("spare"));
    });
    let err = Graph::decode(&unused).expect_err("unused state");
    assert!(matches!(&err, Error::CacheMisuse { name, .. } if name == "spare"), "{err}");

    // The update of a state cache as a graph output: no caller storage backs it.
    let exposed =
        rewrite(&payload, |d| d["outputs"].as_array_mut().expect("array").push(json!("k_cache_out")));
    let err = Graph::decode(&exposed).expect_err("state exposed");
    assert!(matches!(&err, Error::CacheMisuse { name, .. } if name == "k_cache_out"), "{err}");
    assert!(err.to_string().contains("delegate-owned state 'k_cache'"), "{err}");

    // A state name that nothing declares, and a state tensor that is also an input.
    let dangling = rewrite(&payload, |d| d["state"] = json!(["nope"]));
    let err = Graph::decode(&dangling).expect_err("dangling");
    assert!(
        matches!(&err, Error::DanglingTensor { context, name } if context == "the state list" && name == "nope")
    );
    let twice = rewrite(&payload, |d| d["inputs"].as_array_mut().expect("array").push(json!("k_cache")));
    let err = Graph::decode(&twice).expect_err("defined twice");
    assert!(matches!(&err, Error::DefinedTwice { name, .. } if name == "k_cache"), "{err}");

    // A 1.1 reader's view: without the state list the cache is read before anything defines it.
    let old = rewrite(&payload, |d| {
        d.as_object_mut().expect("object").remove("state");
    });
    let err = Graph::decode(&old).expect_err("undefined");
    assert!(matches!(&err, Error::UseBeforeDefinition { name, .. } if name == "k_cache"), "{err}");
}

#[test]
fn a_graph_given_as_description_and_constants_is_the_decoded_graph() {
    let payload = sample().encode();
    let json_len = u32::from_le_bytes(payload[8..12].try_into().expect("4 bytes")) as usize;
    let data_start = (16 + json_len).div_ceil(CONSTANT_ALIGN as usize) * CONSTANT_ALIGN as usize;
    let graph =
        Graph::from_description(&payload[16..16 + json_len], &payload[data_start..]).expect("valid parts");
    assert_eq!(graph, sample());
    let err = Graph::from_description(b"{\"tensors\": 3}", &[]).expect_err("malformed");
    assert!(matches!(err, Error::Json { .. }), "{err}");
    let err = Graph::from_description(&payload[16..16 + json_len], &[]).expect_err("constants missing");
    assert!(matches!(err, Error::BadConstant { .. }), "{err}");
}

mod assign;
mod stream;
mod typing;
mod v1_3;
mod v1_4;
