//! The decoder network's shape and its refusals, from kv-example's own config and weights; no TensorRT needed.

use et_error::{ErrorCode, HasErrorCode};
use kv_example::{Config, Weights};
use kv_example_trt::{arg_order, decoder_network};
use trt_build::Op;

#[test]
fn the_network_binds_kv_examples_arguments_and_updates_every_cache_in_place() {
    let cfg = Config { layers: 2, ..Config::tiny() };
    let net = decoder_network(&cfg, &Weights::generate(&cfg), 1).expect("well-formed");
    assert_eq!(
        arg_order(&cfg),
        [
            "tokens",
            "input_pos",
            "k_cache_0",
            "v_cache_0",
            "k_cache_1",
            "v_cache_1",
            "k_cache_out_0",
            "v_cache_out_0",
            "k_cache_out_1",
            "v_cache_out_1",
            "logits"
        ]
    );
    assert_eq!(net.outputs[0], "logits");
    let updates: Vec<(&str, &str)> = net
        .nodes
        .iter()
        .filter_map(|n| match &n.op {
            Op::KvCacheUpdate { cache, .. } => Some((n.name.as_str(), cache.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(
        updates,
        [
            ("k_cache_out_0", "k_cache_0"),
            ("v_cache_out_0", "v_cache_0"),
            ("k_cache_out_1", "k_cache_1"),
            ("v_cache_out_1", "v_cache_1")
        ]
    );
    let cache = net.nodes.iter().find(|n| n.name == "k_cache_1").expect("cache input");
    assert!(matches!(&cache.op, Op::Input { shape, .. } if shape == &[1, 2, 16, 16]), "{:?}", cache.op);
}

#[test]
fn bad_rows_and_weights_are_refused_naming_the_node() {
    let cfg = Config::tiny();
    let weights = Weights::generate(&cfg);
    for rows in [0, cfg.max_len + 1] {
        let err = decoder_network(&cfg, &weights, rows).expect_err("rows out of range");
        assert_eq!(
            err.to_string(),
            format!("network description, node 'tokens': rows {rows} outside 1..=16")
        );
        assert_eq!(err.error_code(), ErrorCode::InvalidArgument);
    }
    let mut short = weights.clone();
    short.final_norm.pop();
    let err = decoder_network(&cfg, &short, 1).expect_err("wrong length");
    assert_eq!(err.to_string(), "network description, node 'final_norm': has 31 values, the config needs 32");
    let err = decoder_network(&Config { layers: 0, ..cfg.clone() }, &weights, 1).expect_err("degenerate");
    assert!(err.to_string().starts_with("network description, node 'config': every size must be at least 1"));
}
