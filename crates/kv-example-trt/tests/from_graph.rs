//! `network_from_graph`: a reference graph as a TensorRT network (its shape and its refusals); no TensorRT
//! needed.

use ref_graph::{ElemType, Graph, GraphBuilder};
use trt_build::Op;

/// A one-layer decoder over `rows` tokens as the ExecuTorch exporter lowers it (no argmax), caches
/// `[heads, max_len, head_dim]` as graph inputs, or as delegate-owned state when `owned`.
fn decoder(rows: u64, owned: bool) -> Result<Graph, ref_graph::Error> {
    let (heads, len, hd, vocab) = (2, 8, 4, 16);
    let dim = heads * hd;
    let mut b = GraphBuilder::new();
    let tokens = b.input("tokens", ElemType::I64, &[rows])?;
    let pos = b.input("input_pos", ElemType::I64, &[1])?;
    let cache = |b: &mut GraphBuilder, name: &str| {
        if owned {
            b.state(name, ElemType::F32, &[heads, len, hd])
        } else {
            b.input(name, ElemType::F32, &[heads, len, hd])
        }
    };
    let (k_in, v_in) = (cache(&mut b, "k_cache_0")?, cache(&mut b, "v_cache_0")?);
    let w = |n: usize| (0..n).map(|i| (i % 7) as f32 * 0.1).collect::<Vec<f32>>();
    let tok_emb = b.constant_f32("tok_emb", &[vocab, dim], w((vocab * dim) as usize))?;
    let pos_emb = b.constant_f32("pos_emb", &[len, dim], w((len * dim) as usize))?;
    let norm = b.constant_f32("norm", &[dim], w(dim as usize))?;
    let wq = b.constant_f32("wq", &[dim, dim], w((dim * dim) as usize))?;
    let w_out = b.constant_f32("w_out", &[dim, vocab], w((dim * vocab) as usize))?;
    let x_tok = b.gather("x_tok", tok_emb, tokens)?;
    let positions = b.positions("positions", pos, rows)?;
    let x_pos = b.gather("x_pos", pos_emb, positions)?;
    let x = b.add("x", x_tok, x_pos)?;
    let h = b.rms_norm("h", x, norm, 1e-5)?;
    let q = b.mat_mul("q", h, wq)?;
    let k_out = b.kv_cache_update("k_cache_out_0", k_in, q, pos)?;
    let v_out = b.kv_cache_update("v_cache_out_0", v_in, q, pos)?;
    let attn = b.causal_attention("attn", q, k_out, v_out, pos)?;
    let logits = b.mat_mul("logits", attn, w_out)?;
    if !owned {
        b.output(k_out)?;
        b.output(v_out)?;
    }
    b.output(logits)?;
    b.finish()
}

#[test]
fn caches_become_batched_engine_io_updated_in_place() {
    let graph = decoder(3, false).expect("a valid graph");
    let net = kv_example_trt::network_from_graph(&graph).expect("translates");
    assert_eq!(net.outputs, ["k_cache_out_0", "v_cache_out_0", "logits"]);
    let input =
        |name: &str| net.nodes.iter().find(|n| n.name == name).map(|n| n.op.clone()).expect("declared");
    assert!(matches!(input("k_cache_0"), Op::Input { shape, .. } if shape == [1, 2, 8, 4]));
    assert!(matches!(input("tokens"), Op::Input { shape, .. } if shape == [3]));
    let updates: Vec<_> = net
        .nodes
        .iter()
        .filter_map(|n| match &n.op {
            Op::KvCacheUpdate { cache, write_indices, .. } => {
                Some((n.name.as_str(), cache.as_str(), write_indices.as_str()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        updates,
        [("k_cache_out_0", "k_cache_0", "input_pos.i32"), ("v_cache_out_0", "v_cache_0", "input_pos.i32")]
    );
    assert!(net.nodes.iter().any(|n| n.name == "attn.probs" && matches!(n.op, Op::Softmax { axis: 3, .. })));
    // Every operand is defined before it is used.
    let mut defined = std::collections::HashSet::new();
    for node in &net.nodes {
        let operands: Vec<&String> = match &node.op {
            Op::MatMul { a, b, .. } | Op::ElementWise { a, b, .. } => vec![a, b],
            Op::Gather { data, indices, .. } => vec![data, indices],
            Op::KvCacheUpdate { cache, update, write_indices } => vec![cache, update, write_indices],
            Op::ReduceMean { input, .. }
            | Op::Unary { input, .. }
            | Op::Softmax { input, .. }
            | Op::Shuffle { input, .. }
            | Op::Cast { input, .. } => vec![input],
            _ => vec![],
        };
        for operand in operands {
            assert!(defined.contains(operand), "{} reads {operand} before it is defined", node.name);
        }
        assert!(defined.insert(node.name.clone()), "{} defined twice", node.name);
    }
}

#[test]
fn delegate_owned_state_is_refused_by_name() {
    let graph = decoder(1, true).expect("a valid graph");
    let err = kv_example_trt::network_from_graph(&graph).expect_err("TensorRT keeps no state");
    assert!(err.to_string().contains("k_cache_0"), "{err}");
}
