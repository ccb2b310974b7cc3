//! Shared test data: the headers behind the golden blobs, and helpers.
#![allow(dead_code)]

use std::path::PathBuf;

use blob_format::model::{
    Alias, AliasKind, Binding, DType, Dim, Header, PayloadKind, Producer, Role, TENSORRT_BACKEND,
};

/// `tests/<rel>` inside this crate.
pub fn test_path(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests").join(rel)
}

/// Reads `tests/<rel>`.
pub fn read(rel: &str) -> Vec<u8> {
    let path = test_path(rel);
    std::fs::read(&path).unwrap_or_else(|err| panic!("reading {}: {err}", path.display()))
}

/// A deterministic engine payload of `len` bytes.
pub fn engine_bytes(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i.wrapping_mul(31) ^ (i >> 8)) as u8).collect()
}

/// Every field set: producer, typed bindings with dynamic dims, an unthreaded output, all alias kinds.
pub fn full_header() -> Header {
    Header {
        producer: Some(Producer { name: "kv-delegate xtask".into(), version: "0.1.0".into() }),
        backend_id: "ReferenceBackend".into(),
        payload_kind: PayloadKind::ReferenceGraph,
        bindings: vec![
            Binding {
                name: "k_cache".into(),
                role: Role::Input,
                dtype: Some(DType::F32),
                shape: Some(vec![Dim::Static(1), Dim::Static(2), Dim::Static(16), Dim::Static(8)]),
                threaded: true,
            },
            Binding {
                name: "tokens".into(),
                role: Role::Input,
                dtype: Some(DType::I64),
                shape: Some(vec![Dim::Static(1), Dim::Dynamic]),
                threaded: true,
            },
            Binding {
                name: "scale".into(),
                role: Role::Input,
                dtype: Some(DType::BF16),
                shape: Some(vec![]),
                threaded: true,
            },
            Binding {
                name: "k_cache_out".into(),
                role: Role::Output,
                dtype: Some(DType::F32),
                shape: Some(vec![Dim::Static(1), Dim::Static(2), Dim::Static(16), Dim::Static(8)]),
                threaded: false,
            },
            Binding {
                name: "logits \u{e9}\u{1f600}".into(),
                role: Role::Output,
                dtype: None,
                shape: None,
                threaded: true,
            },
        ],
        aliases: vec![
            Alias { output: "k_cache_out".into(), input: "k_cache".into(), kind: AliasKind::KvCacheUpdate },
            Alias { output: "logits \u{e9}\u{1f600}".into(), input: "scale".into(), kind: AliasKind::User },
            Alias {
                output: "x".into(),
                input: "y".into(),
                kind: AliasKind::Unknown("from_the_future".into()),
            },
        ],
        device_id: 1,
        hardware_compatible: true,
        hardware_target: Some("sm_89".into()),
        engine_library_version: Some("TensorRT-RTX 1.7.1".into()),
        engine_metadata: Some("{\"opaque\": true}".into()),
    }
}

/// The least a blob can say: no producer, no bindings, nothing optional.
pub fn minimal_header() -> Header {
    Header::new(TENSORRT_BACKEND, PayloadKind::TensorRtPlan, vec![], vec![])
}

/// The header of `tr02_kv_cache.blob`, as its README describes it.
pub fn tr02_fixture_header() -> Header {
    Header {
        bindings: vec![
            Binding::untyped("k_cache", Role::Input),
            Binding::untyped("update", Role::Input),
            Binding::untyped("write_idx", Role::Input),
            Binding::untyped("k_cache_out", Role::Output),
            Binding::untyped("logits", Role::Output),
        ],
        aliases: vec![Alias {
            output: "k_cache_out".into(),
            input: "k_cache".into(),
            kind: AliasKind::KvCacheUpdate,
        }],
        ..minimal_header()
    }
}

/// The golden blobs: file name under `tests/golden/`, header, engine length. Every native version this
/// crate has ever written keeps its files here forever.
pub fn golden_cases() -> Vec<(&'static str, Header, usize)> {
    vec![
        ("native_1_0_full.blob", full_header(), 300),
        ("native_1_0_minimal.blob", minimal_header(), 0),
        ("native_1_0_tr02_kv_cache.blob", tr02_fixture_header(), 64),
    ]
}
