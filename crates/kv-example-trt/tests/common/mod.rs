//! Shared by the TensorRT tests: the networks whose introspection is captured as `trt-exec`'s binding-plan
//! fixtures, and the gate that makes a missing TensorRT library a failure, not a silent pass.
#![allow(dead_code)]

use blob_format::model::DType;
use kv_example_trt::decoder_network;
use trt_build::{BinaryOp, NetworkDesc, Node, Op};

/// Fails the test unless the TensorRT-RTX library is configured: a test that needs it never passes without.
pub fn require_tensorrt() {
    assert!(trt_exec::library::configured_path().is_some(), "{}", trt_exec::library::NOT_CONFIGURED);
}

fn node(name: &str, op: Op) -> Node {
    Node { name: name.to_owned(), op }
}

fn f32_const(values: &[f32], shape: Vec<i64>) -> Op {
    Op::Constant { dtype: DType::F32, shape, data: values.iter().flat_map(|v| v.to_le_bytes()).collect() }
}

/// The example decoder (kv-example's tiny model and weights), decode method (one token): two KV caches,
/// aliased outputs after `logits`.
pub fn decoder_decode() -> NetworkDesc {
    let cfg = kv_example::Config::tiny();
    decoder_network(&cfg, &kv_example::Weights::generate(&cfg), 1).expect("the tiny decoder is well-formed")
}

/// A recurrent state the engine cannot see as an alias: `state_out = state + x`; the blob declares a `user`
/// alias `state_out -> state`.
pub fn user_state() -> NetworkDesc {
    NetworkDesc {
        nodes: vec![
            node("state", Op::Input { dtype: DType::F32, shape: vec![4] }),
            node("x", Op::Input { dtype: DType::F32, shape: vec![4] }),
            node("state_out", Op::ElementWise { a: "state".into(), b: "x".into(), op: BinaryOp::Add }),
        ],
        outputs: vec!["state_out".into()],
    }
}

/// Every fixture network with its file name.
pub fn fixture_networks() -> Vec<(&'static str, NetworkDesc)> {
    vec![
        ("decoder_decode", decoder_decode()),
        ("kv_single", trt_build::samples::kv_single()),
        ("user_state", user_state()),
    ]
}

/// Path of a fixture: `trt-exec`'s binding-plan tests read them (without TensorRT).
pub fn fixture_path(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../trt-exec/tests/fixtures")
        .join(format!("{name}.json"))
}
