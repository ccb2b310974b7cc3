//! Building against the real TensorRT-RTX library (ahead of time, on CPU). The tests fail, naming
//! `cargo xtask test`, when `KV_TENSORRT_LIB` is unset.

use blob_format::model::{AliasKind, Format, Role};
use blob_format::Blob;
use et_error::{ErrorCode, HasErrorCode};
use trt_build::samples::KV_SINGLE_ORDER as ORDER;
use trt_build::{build_engine, BuildOptions};
use trt_exec::{AliasPair, PlanKind};

/// Fails the test unless the TensorRT-RTX library is configured: a test that needs it never passes without.
fn require_tensorrt() {
    assert!(trt_exec::library::configured_path().is_some(), "{}", trt_exec::library::NOT_CONFIGURED);
}

#[test]
fn network_errors_name_the_node() {
    require_tensorrt();
    let mut net = trt_build::samples::kv_single();
    net.nodes.retain(|n| n.name != "write_idx");
    let err = build_engine(&net, &BuildOptions::default()).expect_err("unknown tensor");
    assert_eq!(err.to_string(), "network description, node 'k_cache_out': uses unknown tensor 'write_idx'");
    assert_eq!(err.error_code(), ErrorCode::InvalidArgument);
}

#[test]
fn a_kv_cache_layer_builds_on_cpu_and_its_alias_is_tensorrts() {
    require_tensorrt();
    let built =
        build_engine(&trt_build::samples::kv_single(), &BuildOptions::default()).expect("builds on CPU");
    assert_eq!(trt_exec::sniff_plan(&built.plan), PlanKind::TensorRtRtx);
    assert_eq!(built.io.aliases, [AliasPair { output: "k_cache_out".into(), input: "k_cache".into() }]);
    assert!(built.io.library.as_deref().is_some_and(|v| v.starts_with("TensorRT-RTX 1.7")));

    let (header, bytes) = trt_build::export::native_blob(&built, &ORDER).expect("exports");
    let blob = Blob::parse(&bytes).expect("our own blob parses");
    assert!(matches!(blob.format, Format::Native { .. }));
    assert_eq!(blob.header, header);
    assert_eq!(blob.engine, built.plan.as_slice(), "engine bytes round-trip");
    assert_eq!(header.producer.as_ref().map(|p| p.name.as_str()), Some("kv-delegate trt-build"));
    assert!(header.aliases.iter().all(|a| a.kind == AliasKind::KvCacheUpdate));
    alias_validate::validate_with_engine(&header, &built.io).expect("validates against the engine's own io");

    let (up, bytes) = trt_build::export::tr02_blob(&built, &ORDER).expect("exports TR02");
    assert_eq!(&bytes[..4], b"TR02");
    let blob = Blob::parse(&bytes).expect("parses");
    assert_eq!((blob.format, blob.header.aliases), (Format::Tr02, up.aliases));
    assert_eq!(blob.header.bindings.iter().filter(|b| b.role == Role::Output).count(), 2);

    let err = trt_build::export::native_blob(&built, &["k_cache", "k_cache"]).expect_err("listed twice");
    assert_eq!(err.error_code(), ErrorCode::InvalidArgument);
    // TR02 lists inputs before outputs: an output first is refused, naming why.
    let err =
        trt_build::export::tr02_blob(&built, &["logits", "k_cache", "update", "write_idx", "k_cache_out"])
            .expect_err("TR02 cannot express it");
    assert_eq!(err.error_code(), ErrorCode::NotSupported, "{err}");
}
