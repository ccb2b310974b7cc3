//! Upstream TR01/TR02: the real fixtures read as their README says, re-write byte-identically, and the JSON
//! semantics upstream's hand-written scanner got wrong are right here.

mod common;

use blob_format::model::{
    Alias, AliasKind, Binding, DType, Dim, Format, Header, PayloadKind, Producer, Role,
};
use blob_format::{upstream, Blob, WriteError};
use common::{minimal_header, read, tr02_fixture_header};

struct Expect {
    format: Format,
    inputs: &'static [&'static str],
    outputs: &'static [&'static str],
    aliases: &'static [(&'static str, &'static str, &'static str)],
    engine_offset: u64,
    engine_size: usize,
}

fn check_fixture(file: &str, expect: Expect) {
    let bytes = read(&format!("fixtures/upstream/{file}"));
    let blob = Blob::parse(&bytes).unwrap_or_else(|err| panic!("{file}: {err}"));
    assert_eq!(blob.format, expect.format, "{file}");
    let names = |role| blob.header.threaded(role).map(|b| b.name.as_str()).collect::<Vec<_>>();
    assert_eq!(names(Role::Input), expect.inputs, "{file}");
    assert_eq!(names(Role::Output), expect.outputs, "{file}");
    let aliases: Vec<_> =
        blob.header.aliases.iter().map(|a| (a.output.as_str(), a.input.as_str(), a.kind.as_str())).collect();
    assert_eq!(aliases, expect.aliases, "{file}");
    assert_eq!(blob.header.backend_id, "TensorRTBackend");
    assert_eq!(blob.header.payload_kind, PayloadKind::TensorRtPlan);
    assert_eq!(blob.header.device_id, 0);
    assert!(blob.header.bindings.iter().all(|b| b.dtype.is_none() && b.shape.is_none() && b.threaded));
    assert_eq!(blob.engine_offset(), expect.engine_offset, "{file}");
    assert_eq!(blob.engine.len(), expect.engine_size, "{file}");
    // The engine is the tail of the file, borrowed in place.
    assert_eq!(blob.engine_offset() as usize + blob.engine.len(), bytes.len());
    assert_eq!(blob.engine.as_ptr(), bytes[blob.engine_offset() as usize..].as_ptr());
    blob.verify_payload().expect("upstream blobs record no checksum");

    // Strong round trip: parse, then write with our TR02 writer, byte-identical to upstream's serializer.
    let rewritten =
        upstream::write_tr02(&blob.header, blob.engine).expect("an upstream header is representable");
    assert!(rewritten == bytes, "{file}: re-written blob differs from upstream's bytes");
}

#[test]
fn tr01_relu_fixture() {
    check_fixture(
        "tr01_relu.blob",
        Expect {
            format: Format::Tr01,
            inputs: &["input"],
            outputs: &["output"],
            aliases: &[],
            engine_offset: 272,
            engine_size: 134028,
        },
    );
}

#[test]
fn tr02_kv_cache_fixture() {
    check_fixture(
        "tr02_kv_cache.blob",
        Expect {
            format: Format::Tr02,
            inputs: &["k_cache", "update", "write_idx"],
            outputs: &["k_cache_out", "logits"],
            aliases: &[("k_cache_out", "k_cache", "kv_cache_update")],
            engine_offset: 512,
            engine_size: 273876,
        },
    );
    let bytes = read("fixtures/upstream/tr02_kv_cache.blob");
    let blob = Blob::parse(&bytes).expect("fixture parses");
    assert_eq!(blob.header, tr02_fixture_header());
    // The decoded structure as `delegate-host inspect` sees it; Debug shows the engine's extent, not its bytes.
    insta::assert_debug_snapshot!(blob);
}

/// A TR blob around `json`, laid out as upstream's writer does.
fn tr_blob(magic: &[u8; 4], json: &str, engine: &[u8]) -> Vec<u8> {
    let metadata_end = 32 + json.len();
    let engine_offset = metadata_end.div_ceil(16) * 16;
    let mut out = Vec::new();
    out.extend_from_slice(magic);
    out.extend_from_slice(&32u32.to_le_bytes());
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    out.extend_from_slice(&(engine_offset as u32).to_le_bytes());
    out.extend_from_slice(&(engine.len() as u64).to_le_bytes());
    out.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0]);
    out.extend_from_slice(json.as_bytes());
    out.resize(engine_offset, 0);
    out.extend_from_slice(engine);
    out
}

/// Data-driven: a metadata JSON and the header it must read as.
fn check_json(json: &str, expect: Header) {
    let bytes = tr_blob(b"TR02", json, b"plan");
    let blob = Blob::parse(&bytes).unwrap_or_else(|err| panic!("{json}: {err}"));
    assert_eq!(blob.header, expect, "{json}");
    assert_eq!(blob.engine, b"plan");
}

fn io(bindings: &[(&str, bool)]) -> Vec<Binding> {
    bindings
        .iter()
        .map(|(name, is_input)| Binding::untyped(*name, if *is_input { Role::Input } else { Role::Output }))
        .collect()
}

#[test]
fn json_semantics() {
    // Missing aliased_io: no aliases. Missing or null kind: kv_cache_update. Optional keys default.
    check_json(
        r#"{"io_bindings":[{"name":"a","is_input":true},{"name":"b","dtype":"","shape":[],"is_input":false}]}"#,
        Header { bindings: io(&[("a", true), ("b", false)]), ..minimal_header() },
    );
    check_json(
        r#"{"io_bindings":[{"name":"a","is_input":true},{"name":"b","is_input":false},{"name":"c","is_input":false}],
            "aliased_io":[{"output":"b","input":"a"},{"output":"c","input":"a","kind":null}]}"#,
        Header {
            bindings: io(&[("a", true), ("b", false), ("c", false)]),
            aliases: vec![
                Alias { output: "b".into(), input: "a".into(), kind: AliasKind::KvCacheUpdate },
                Alias { output: "c".into(), input: "a".into(), kind: AliasKind::KvCacheUpdate },
            ],
            ..minimal_header()
        },
    );
    // Unknown kinds survive (refusing them is validation's job); user kind.
    check_json(
        r#"{"io_bindings":[],"aliased_io":[{"output":"o","input":"i","kind":"user"},{"output":"p","input":"i","kind":"kv_cache_append"}]}"#,
        Header {
            aliases: vec![
                Alias { output: "o".into(), input: "i".into(), kind: AliasKind::User },
                Alias {
                    output: "p".into(),
                    input: "i".into(),
                    kind: AliasKind::Unknown("kv_cache_append".into()),
                },
            ],
            ..minimal_header()
        },
    );
    // Bindings literally named like keys, \uXXXX escapes (including a surrogate pair), key order irrelevant,
    // unknown keys ignored.
    check_json(
        r#"{"device_id":3,"future_key":{"x":[1,2]},"io_bindings":[{"is_input":true,"name":"aliased_io"},
            {"name":"device_id","is_input":false},{"name":"caf\u00e9 \ud83d\ude00 \"q\"","is_input":false}],
            "aliased_io":[{"kind":"kv_cache_update","input":"aliased_io","output":"device_id"}],
            "hardware_compatible":true,"serialized_metadata":"m","target_platform":"x86_64-linux"}"#,
        Header {
            bindings: io(&[("aliased_io", true), ("device_id", false), ("caf\u{e9} \u{1f600} \"q\"", false)]),
            aliases: vec![Alias {
                output: "device_id".into(),
                input: "aliased_io".into(),
                kind: AliasKind::KvCacheUpdate,
            }],
            device_id: 3,
            hardware_compatible: true,
            hardware_target: Some("x86_64-linux".into()),
            engine_metadata: Some("m".into()),
            ..minimal_header()
        },
    );
    // Recorded dtypes and shapes read (-1 is dynamic).
    check_json(
        r#"{"io_bindings":[{"name":"t","dtype":"i64","shape":[1,-1,0],"is_input":true}]}"#,
        Header {
            bindings: vec![Binding {
                name: "t".into(),
                role: Role::Input,
                dtype: Some(DType::I64),
                shape: Some(vec![Dim::Static(1), Dim::Dynamic, Dim::Static(0)]),
                threaded: true,
            }],
            ..minimal_header()
        },
    );
}

#[test]
fn writer_escapes_like_python_json_dumps() {
    let header = Header {
        bindings: vec![
            Binding::untyped("caf\u{e9} \u{1f600}\n\t\"\\\u{7f}\u{1}", Role::Input),
            Binding::untyped("out", Role::Output),
        ],
        device_id: 3,
        engine_metadata: Some("meta".into()),
        ..minimal_header()
    };
    let bytes = upstream::write_tr02(&header, b"engine").expect("representable");
    assert_eq!(&bytes[..4], b"TR01", "no aliases: upstream writes TR01");
    let json_len = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes")) as usize;
    let json = std::str::from_utf8(&bytes[32..32 + json_len]).expect("ASCII");
    insta::assert_snapshot!(json, @r#"{"io_bindings":[{"name":"caf\u00e9 \ud83d\ude00\n\t\"\\\u007f\u0001","dtype":"","shape":[],"is_input":true},{"name":"out","dtype":"","shape":[],"is_input":false}],"aliased_io":[],"hardware_compatible":false,"device_id":3,"serialized_metadata":"meta","target_platform":""}"#);
    assert_eq!(Blob::parse(&bytes).expect("reads back").header, header);
    assert_eq!(bytes[24..32], [1, 0, 0, 0, 0, 0, 0, 0]);
    let engine_offset = u32::from_le_bytes(bytes[12..16].try_into().expect("4 bytes")) as usize;
    assert_eq!(engine_offset % 16, 0);
    assert!(bytes[32 + json_len..engine_offset].iter().all(|&b| b == 0), "zero padding");
}

#[test]
fn write_tr02_refuses_what_tr02_cannot_express() {
    let header = Header {
        producer: Some(Producer { name: "kv-delegate xtask".into(), version: "0.1.0".into() }),
        backend_id: "ReferenceBackend".into(),
        payload_kind: PayloadKind::ReferenceGraph,
        bindings: vec![
            Binding { dtype: Some(DType::F16), ..Binding::untyped("out", Role::Output) },
            Binding {
                shape: Some(vec![Dim::Dynamic, Dim::Static(4)]),
                ..Binding::untyped("in", Role::Input)
            },
            Binding { threaded: false, ..Binding::untyped("cache_out", Role::Output) },
        ],
        engine_library_version: Some("TensorRT-RTX 1.7.1".into()),
        ..minimal_header()
    };
    let losses = upstream::unrepresentable(&header);
    insta::assert_debug_snapshot!(losses, @r#"
    [
        "producer: TR02 does not record the producing tool (kv-delegate xtask 0.1.0)",
        "backend_id: TR02 implies backend TensorRTBackend, this blob is for \"ReferenceBackend\"",
        "payload_kind: TR02 carries a TensorRT plan, this payload is \"reference-graph\"",
        "engine_library_version: TR02 does not record it (\"TensorRT-RTX 1.7.1\")",
        "bindings[0] 'out'.dtype: TR02 writes dtypes empty (f16)",
        "bindings[1] 'in'.shape: TR02 writes shapes empty ([?, 4])",
        "bindings[2] 'cache_out'.threaded: TR02 threads every binding as a delegate argument",
        "bindings: TR02 lists all inputs before all outputs, input 'in' follows output 'out'",
    ]
    "#);
    let err = upstream::write_tr02(&header, b"").expect_err("lossy");
    assert!(matches!(&err, WriteError::Unrepresentable { format: "TR02", losses: l } if *l == losses));
    assert_eq!(et_error::HasErrorCode::error_code(&err), et_error::ErrorCode::NotSupported);
    assert!(err.to_string().starts_with("TR02 cannot express this blob: producer: "), "{err}");
    assert!(upstream::unrepresentable(&tr02_fixture_header()).is_empty());
}

#[test]
fn tr_engine_is_borrowed_not_copied() {
    let bytes = tr_blob(b"TR01", r#"{"io_bindings":[]}"#, &[7; 100]);
    let blob = upstream::parse(&bytes).expect("parses");
    let range = bytes.as_ptr_range();
    assert!(range.contains(&blob.engine.as_ptr()));
    assert_eq!(blob.engine.as_ptr(), bytes[blob.engine_offset() as usize..].as_ptr());
}
