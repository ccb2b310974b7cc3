//! The example decoder against the real TensorRT-RTX library (built ahead of time on CPU). They fail, naming
//! `cargo xtask test`, when `KV_TENSORRT_LIB` is unset.

mod common;

use blob_format::model::{AliasKind, Format, Role};
use blob_format::Blob;
use common::{fixture_networks, fixture_path, require_tensorrt};
use et_error::{ErrorCode, HasErrorCode};
use kv_example_trt::{arg_order, decoder_network};
use trt_build::{build_engine, BuildOptions};
use trt_exec::{AliasPair, Engine, EngineIo, IoMode, PlanKind};

fn decode_engine() -> trt_build::BuiltEngine {
    let net = common::decoder_decode();
    build_engine(&net, &BuildOptions::default()).expect("the decoder builds on CPU")
}

#[test]
fn decoder_builds_with_kv_cache_layers_and_tensorrt_reports_their_aliases() {
    require_tensorrt();
    let built = decode_engine();
    eprintln!("decoder (decode, seq 1) built in {:?}, plan {} bytes", built.build_time, built.plan.len());
    assert_eq!(trt_exec::sniff_plan(&built.plan), PlanKind::TensorRtRtx);
    assert_eq!(
        built.io.aliases,
        vec![
            AliasPair { output: "k_cache_out_0".into(), input: "k_cache_0".into() },
            AliasPair { output: "v_cache_out_0".into(), input: "v_cache_0".into() },
        ]
    );
    let outputs: Vec<&str> =
        built.io.tensors.iter().filter(|t| t.mode == IoMode::Output).map(|t| t.name.as_str()).collect();
    assert_eq!(outputs, ["logits", "k_cache_out_0", "v_cache_out_0"]);
    let k = built.io.tensor("k_cache_0").expect("k_cache is an input");
    assert_eq!((k.dtype.as_str(), k.shape.as_slice()), ("f32", &[1, 2, 16, 16][..]));
    let tokens = built.io.tensor("tokens").expect("tokens");
    assert_eq!((tokens.dtype.as_str(), tokens.shape.as_slice()), ("i64", &[1][..]));
    assert!(built.io.library.as_deref().is_some_and(|v| v.starts_with("TensorRT-RTX 1.7")));
}

#[test]
fn prefill_engine_builds_for_a_longer_prompt() {
    require_tensorrt();
    let cfg = kv_example::Config::tiny();
    let net = decoder_network(&cfg, &kv_example::Weights::generate(&cfg), 5).expect("well-formed");
    let built = build_engine(&net, &BuildOptions::default()).expect("prefill builds");
    let logits = built.io.tensor("logits").expect("logits");
    assert_eq!(logits.shape, [5, 64]);
}

#[test]
fn native_blob_records_the_aliases_tensorrt_reports_and_round_trips_the_plan() {
    require_tensorrt();
    let built = decode_engine();
    let order = arg_order(&kv_example::Config::tiny());
    let order: Vec<&str> = order.iter().map(String::as_str).collect();
    let (header, bytes) = trt_build::export::native_blob(&built, &order).expect("exports");
    let blob = Blob::parse(&bytes).expect("our own blob parses");
    assert!(matches!(blob.format, Format::Native { .. }));
    assert_eq!(blob.header, header);
    assert_eq!(blob.engine, built.plan.as_slice(), "engine bytes round-trip");
    blob.verify_payload().expect("checksum matches");
    let table: Vec<AliasPair> = blob
        .header
        .aliases
        .iter()
        .map(|a| AliasPair { output: a.output.clone(), input: a.input.clone() })
        .collect();
    assert_eq!(table, built.io.aliases, "alias table is what TensorRT reported for the network");
    assert!(blob.header.aliases.iter().all(|a| a.kind == AliasKind::KvCacheUpdate));
    let names: Vec<&str> = blob.header.bindings.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, order);
    assert_eq!(blob.header.engine_library_version, built.io.library);
    alias_validate::validate_with_engine(&blob.header, &built.io)
        .expect("validates against the engine's own io");
}

#[test]
fn tr02_blob_round_trips_the_plan() {
    require_tensorrt();
    let built = decode_engine();
    let order = arg_order(&kv_example::Config::tiny());
    let order: Vec<&str> = order.iter().map(String::as_str).collect();
    let (header, bytes) = trt_build::export::tr02_blob(&built, &order).expect("exports TR02");
    assert_eq!(&bytes[..4], b"TR02");
    let blob = Blob::parse(&bytes).expect("parses");
    assert_eq!(blob.format, Format::Tr02);
    assert_eq!(blob.engine, built.plan.as_slice());
    assert_eq!(blob.header.aliases, header.aliases);
    assert_eq!(blob.header.bindings.iter().filter(|b| b.role == Role::Output).count(), 3);
}

#[test]
fn deserializing_on_this_machine_fails_cleanly_with_tensorrts_message() {
    require_tensorrt();
    let built = decode_engine();
    match Engine::deserialize(&built.plan) {
        Ok(engine) => {
            // A supported GPU: the engine's own getAliasedInputTensor must agree with the build-time capture.
            assert_eq!(engine.io().aliases, built.io.aliases);
        }
        Err(err) => {
            eprintln!("Engine::deserialize: {err}");
            assert_eq!(err.error_code(), ErrorCode::NotSupported, "{err}");
            assert!(
                matches!(err, trt_exec::Error::EngineUnavailable { ref log, .. } if !log.is_empty()),
                "{err}"
            );
        }
    }
}

/// The JSON fixtures the binding-plan tests use are what real builds report; `KV_UPDATE_FIXTURES=1` rewrites
/// them.
#[test]
fn fixtures_match_real_builds() {
    require_tensorrt();
    for (name, net) in fixture_networks() {
        let built = build_engine(&net, &BuildOptions::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
        let path = fixture_path(name);
        if std::env::var("KV_UPDATE_FIXTURES").as_deref() == Ok("1") {
            std::fs::write(&path, built.io.to_json() + "\n").expect("writes fixture");
            continue;
        }
        let stored = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let stored = EngineIo::from_json(&stored).expect("fixture parses");
        assert_eq!(stored, built.io, "{name}: fixture is stale; rerun with KV_UPDATE_FIXTURES=1");
    }
}

/// kv-example's own tiny config and weights build into both methods' engines, with kv-example's argument
/// order.
#[test]
fn kv_examples_tiny_model_builds_as_prefill_and_decode_blobs() {
    require_tensorrt();
    let c = kv_example::Config::tiny();
    let weights = kv_example::Weights::generate(&c);
    for rows in [c.prompt_len(), 1] {
        let started = std::time::Instant::now();
        let (header, blob, built) =
            kv_example_trt::decoder_blob(&c, &weights, rows, &BuildOptions::default()).expect("builds");
        eprintln!(
            "kv-example tiny, rows {rows}: engine built in {:?} ({:?} total), blob {} bytes",
            built.build_time,
            started.elapsed(),
            blob.len()
        );
        let reference = kv_example::export::header(&c, rows);
        let ours: Vec<&str> = header.bindings.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(
            ours,
            kv_example_trt::reference_order(&c, rows),
            "same argument order as the reference blob"
        );
        assert_eq!(header.aliases, reference.aliases, "same alias table as the reference blob");
        assert_eq!(Blob::parse(&blob).expect("parses").engine, built.plan.as_slice());
    }
}
