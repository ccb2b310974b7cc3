//! Payload 1.3: a graph using every new op and bf16 round trips, and each graph is written with the oldest
//! minor version that expresses it.

use super::{sample, sample_with_state};
use crate::*;

use ElemType::{Bf16, F32, I64};

fn bf16s(values: &[f32]) -> Vec<half::bf16> {
    values.iter().map(|&v| half::bf16::from_f32(v)).collect()
}

/// A decoder layer in bf16 as Hugging Face writes it: `[1, T]` ids, a decomposed RMSNorm with a scalar eps,
/// `nn.Linear` projections with a bias, head-major queries rotated by slices and a concat, GQA over rank-4
/// caches, a scaled attention, and an argmax of rank-3 logits.
pub(super) fn sample_1_3() -> Graph {
    let mut b = GraphBuilder::new();
    let ids = b.input("input_ids", I64, &[1, 3]).expect("fresh");
    let pos = b.input("cache_position", I64, &[1]).expect("fresh");
    let kc = b.input("k_cache", Bf16, &[1, 1, 6, 4]).expect("fresh");
    let vc = b.input("v_cache", Bf16, &[1, 1, 6, 4]).expect("fresh");
    let emb = b.constant_bf16("emb", &[5, 8], bf16s(&[0.25; 40])).expect("40 values");
    let eps = b.constant_bf16("eps", &[], bf16s(&[1e-6])).expect("1 value");
    let wq = b.constant_bf16("wq", &[8, 8], bf16s(&[0.5; 64])).expect("64 values");
    let bq =
        b.constant_bf16("bq", &[8], bf16s(&[-1.0, 2.0, 0.0, 3.5, 1.0, 1.0, 1.0, 1.0])).expect("8 values");
    let wk = b.constant_bf16("wk", &[8, 4], bf16s(&[1.0; 32])).expect("32 values");
    let g = b.constant_bf16("g", &[8], bf16s(&[1.0; 8])).expect("8 values");
    let x = b.gather("x", emb, ids).expect("[1, 3, 8]");
    let sq = b.unary("sq", UnaryFn::Square, x).expect("typed");
    let ms = b.mean("ms", sq).expect("[1, 3, 1]");
    let ms = b.add("ms_eps", ms, eps).expect("broadcast");
    let r = b.unary("r", UnaryFn::Rsqrt, ms).expect("typed");
    let xn = b.mul("xn", x, r).expect("broadcast");
    let xn = b.rms_norm("xn2", xn, g, 1e-6).expect("rank 3");
    let linear = MatMulOptions { transpose_b: true, bias: Some(bq) };
    let q = b.mat_mul_with("q", xn, wq, linear).expect("[1, 3, 8]");
    let q = b.reshape("q4", q, &[1, 3, 2, 4]).expect("typed");
    let q = b.permute("qh", q, &[0, 2, 1, 3]).expect("[1, 2, 3, 4]");
    let lo = b.slice("q_lo", q, 3, 0, 2).expect("typed");
    let hi = b.slice("q_hi", q, 3, 2, 4).expect("typed");
    let hi = b.unary("q_hi_neg", UnaryFn::Neg, hi).expect("typed");
    let rot = b.concat("q_rot", hi, lo, 3).expect("typed");
    let q = b.sub("q_sub", q, rot).expect("typed");
    let q = b.div("q_div", q, eps).expect("typed");
    let k = b.mat_mul("k", xn, wk).expect("[1, 3, 4]");
    let k = b.reshape("k4", k, &[1, 1, 3, 4]).expect("head-major");
    let v = b.reshape("v2", k, &[3, 4]).expect("token-major");
    let k_out = b.kv_cache_update("k_out", kc, k, pos).expect("typed");
    let v_out = b.kv_cache_update("v_out", vc, v, pos).expect("typed");
    let attn = b.causal_attention_scaled("attn", q, k_out, v_out, pos, 0.5).expect("GQA 2 over 1");
    let next = b.argmax("next", attn).expect("rank 4");
    let next_f = b.cast("next_f", next, F32).expect("typed");
    let seen = b.input("seen", I64, &[1]).expect("fresh");
    let seen = b.assign("seen_out", seen, pos).expect("typed");
    for out in [attn, next, next_f, k_out, v_out, seen] {
        b.output(out).expect("declared");
    }
    b.finish().expect("valid")
}

#[test]
fn a_graph_of_every_1_3_op_round_trips_as_1_3() {
    let graph = sample_1_3();
    let mut names: Vec<&str> = graph.ops().iter().map(|op| op.name()).collect();
    names.sort_unstable();
    names.dedup();
    let mut all = crate::ops::OP_NAMES.to_vec();
    all.retain(|&op| op != "positions");
    all.sort_unstable();
    assert_eq!(names, all, "the sample uses every op but positions (unchanged in 1.3)");

    let payload = graph.encode();
    assert_eq!(u16::from_le_bytes([payload[6], payload[7]]), 3);
    assert_eq!(graph.payload_version(), (1, PAYLOAD_MINOR_DECODER_OPS));
    let decoded = Graph::decode(&payload).expect("valid payload");
    assert_eq!(decoded, graph);
    let bq = decoded.constant(decoded.find("bq").expect("declared")).expect("a constant");
    assert_eq!(bq, &Data::Bf16(bf16s(&[-1.0, 2.0, 0.0, 3.5, 1.0, 1.0, 1.0, 1.0])));
    let json = String::from_utf8_lossy(&payload[16..]);
    for key in [
        r#""transpose_b":true"#,
        r#""bias":"bq""#,
        r#""scale":0.5"#,
        r#""func":"rsqrt""#,
        r#""dtype":"bf16""#,
    ] {
        assert!(json.contains(key), "the payload spells {key}");
    }
}

/// A graph of one op: `build` adds it (and its inputs) and returns what to mark as output.
fn one_op(build: impl FnOnce(&mut GraphBuilder) -> Result<Vec<TensorId>, Error>) -> Graph {
    let mut b = GraphBuilder::new();
    for out in build(&mut b).expect("typed") {
        b.output(out).expect("declared");
    }
    b.finish().expect("valid")
}

fn minor(graph: &Graph) -> u16 {
    let (major, minor) = graph.payload_version();
    assert_eq!(major, PAYLOAD_VERSION_MAJOR);
    assert_eq!(u16::from_le_bytes([graph.encode()[6], graph.encode()[7]]), minor, "encode writes it");
    minor
}

/// An attention layer: caches of `cache` shape, rows `update`, queries `q`, and optionally a scale.
fn attention(cache: &[u64], update: &[u64], q: &[u64], scale: Option<f32>) -> Graph {
    one_op(|b| {
        let pos = b.input("pos", I64, &[1])?;
        let kc = b.input("kc", F32, cache)?;
        let vc = b.input("vc", F32, cache)?;
        let (u, q) = (b.input("u", F32, update)?, b.input("q", F32, q)?);
        let k = b.kv_cache_update("k", kc, u, pos)?;
        let v = b.kv_cache_update("v", vc, u, pos)?;
        let out = match scale {
            Some(scale) => b.causal_attention_scaled("attn", q, k, v, pos, scale)?,
            None => b.causal_attention("attn", q, k, v, pos)?,
        };
        Ok(vec![out])
    })
}

#[test]
fn each_graph_is_written_with_the_oldest_minor_that_expresses_it() {
    assert_eq!(minor(&sample()), PAYLOAD_MINOR_WITHOUT_STATE);
    assert_eq!(minor(&sample_with_state()), PAYLOAD_MINOR_WITH_STATE);
    assert_eq!(minor(&attention(&[2, 8, 4], &[3, 8], &[3, 8], None)), 1, "the 1.0 forms");

    let m = |shape_a: &[u64], shape_b: &[u64], transpose_b: bool, with_bias: bool| {
        one_op(|b| {
            let (a, w) = (b.input("a", F32, shape_a)?, b.input("w", F32, shape_b)?);
            let bias = if with_bias { Some(b.input("bias", F32, &[4])?) } else { None };
            Ok(vec![b.mat_mul_with("y", a, w, MatMulOptions { transpose_b, bias })?])
        })
    };
    let elementwise = |dtype: ElemType, sa: &[u64], sb: &[u64]| {
        one_op(|b| {
            let (x, y) = (b.input("x", dtype, sa)?, b.input("y", dtype, sb)?);
            Ok(vec![b.add("s", x, y)?])
        })
    };
    let unary =
        |dtype: ElemType, shape: &[u64], op: fn(&mut GraphBuilder, TensorId) -> Result<TensorId, Error>| {
            one_op(|b| {
                let x = b.input("x", dtype, shape)?;
                Ok(vec![op(b, x)?])
            })
        };
    let new_in_1_3 = [
        ("mat_mul of plain [M, K] x [K, N]", m(&[2, 3], &[3, 4], false, false), 1),
        ("mat_mul transpose_b", m(&[2, 3], &[4, 3], true, false), 3),
        ("mat_mul bias", m(&[2, 3], &[3, 4], false, true), 3),
        ("mat_mul of rank-3 a", m(&[1, 2, 3], &[3, 4], false, false), 3),
        ("add of equal f32 shapes", elementwise(F32, &[2, 3], &[2, 3]), 1),
        ("broadcasting add", elementwise(F32, &[2, 3], &[3]), 3),
        ("i64 add", elementwise(I64, &[1], &[1]), 3),
        ("bf16 add", elementwise(Bf16, &[2, 3], &[2, 3]), 3),
        ("a new op", unary(F32, &[2, 3], |b, x| b.mean("m", x)), 3),
        ("rank-2 argmax", unary(F32, &[2, 3], |b, x| b.argmax("m", x)), 1),
        ("rank-3 argmax", unary(F32, &[1, 2, 3], |b, x| b.argmax("m", x)), 3),
        ("rank-1 gather", unary(I64, &[3], gather), 1),
        ("rank-2 gather indices", unary(I64, &[1, 3], gather), 3),
        ("rank-2 rms_norm", unary(F32, &[2, 4], rms_norm), 1),
        ("rank-3 rms_norm", unary(F32, &[1, 2, 4], rms_norm), 3),
        ("rank-4 caches", attention(&[1, 2, 8, 4], &[3, 8], &[3, 8], None), 3),
        ("head-major updates", attention(&[2, 8, 4], &[2, 3, 4], &[3, 8], None), 3),
        ("head-major queries", attention(&[2, 8, 4], &[3, 8], &[2, 3, 4], None), 3),
        ("grouped queries", attention(&[2, 8, 4], &[3, 8], &[3, 16], None), 3),
        ("a scale", attention(&[2, 8, 4], &[3, 8], &[3, 8], Some(0.5)), 3),
    ];
    for (what, graph, expected) in new_in_1_3 {
        assert_eq!(minor(&graph), expected, "{what}");
        assert_eq!(Graph::decode(&graph.encode()).expect("reads"), graph, "{what}");
    }
}

fn gather(b: &mut GraphBuilder, ids: TensorId) -> Result<TensorId, Error> {
    let table = b.constant_f32("table", &[4, 2], vec![0.0; 8])?;
    b.gather("g", table, ids)
}

fn rms_norm(b: &mut GraphBuilder, x: TensorId) -> Result<TensorId, Error> {
    let w = b.constant_f32("w", &[4], vec![1.0; 4])?;
    b.rms_norm("n", x, w, 1e-5)
}

/// State with a 1.3 form is written as 1.3 (1.3 includes 1.2's state).
#[test]
fn state_with_a_1_3_form_is_1_3() {
    let mut b = GraphBuilder::new();
    let pos = b.input("pos", I64, &[1]).expect("fresh");
    let kc = b.state("kc", F32, &[1, 1, 4, 2]).expect("fresh");
    let u = b.input("u", F32, &[1, 2]).expect("fresh");
    let k = b.kv_cache_update("k", kc, u, pos).expect("typed");
    let attn = b.causal_attention("attn", u, k, k, pos).expect("typed");
    b.output(attn).expect("declared");
    let graph = b.finish().expect("valid");
    assert_eq!(minor(&graph), 3);
}
