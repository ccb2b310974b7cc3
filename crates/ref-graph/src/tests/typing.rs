//! Payload 1.3's typing rules: for every op, an accepted form and each refusal with its message.

use crate::*;

/// A builder with one input per `(name, dtype, shape)`, and their ids.
fn with_inputs<const N: usize>(decls: [(&str, ElemType, &[u64]); N]) -> (GraphBuilder, [TensorId; N]) {
    let mut b = GraphBuilder::new();
    let ids = decls.map(|(name, dtype, shape)| b.input(name, dtype, shape).expect("fresh name"));
    (b, ids)
}

/// The message of a refused op, without the `op N (name): ` prefix.
fn refusal(result: Result<TensorId, Error>) -> String {
    let message = result.expect_err("the op is refused").to_string();
    message.split_once("): ").map_or(message.clone(), |(_, detail)| detail.to_owned())
}

/// Asserts each refused op's message, without the `op N (name): ` prefix: one row a refusal, in order.
#[track_caller]
fn assert_refusals<const N: usize>(cases: [(Result<TensorId, Error>, &str); N]) {
    for (row, (result, expected)) in cases.into_iter().enumerate() {
        assert_eq!(refusal(result), expected, "refusal {row}");
    }
}

/// The dtype and shape the builder inferred for the output of `b.op(..)`.
macro_rules! typed {
    ($b:ident . $($call:tt)*) => {{
        let id = $b.$($call)*.expect("typed");
        let decl = &$b.declared()[id.0];
        (decl.dtype, decl.shape.clone())
    }};
}

use ElemType::{Bf16, F16, F32, I64};

#[test]
fn broadcast_shape_follows_numpy() {
    assert_eq!(broadcast_shape(&[], &[]), Some(vec![]));
    assert_eq!(broadcast_shape(&[1, 1, 4], &[]), Some(vec![1, 1, 4]), "a scalar stretches everywhere");
    assert_eq!(broadcast_shape(&[], &[3]), Some(vec![3]));
    assert_eq!(broadcast_shape(&[2, 3, 4], &[4]), Some(vec![2, 3, 4]), "aligned at the last axis");
    assert_eq!(broadcast_shape(&[2, 1, 4], &[3, 1]), Some(vec![2, 3, 4]), "size-1 extents stretch");
    assert_eq!(broadcast_shape(&[1, 5], &[7, 1]), Some(vec![7, 5]));
    assert_eq!(broadcast_shape(&[2, 4], &[3, 4]), None);
    assert_eq!(broadcast_shape(&[4], &[2, 3]), None, "the last axes differ");
}

#[test]
fn gather_takes_indices_of_any_rank() {
    let (mut b, [t, t16, ids, s, f]) = with_inputs([
        ("t", F32, &[5, 3]),
        ("t16", Bf16, &[5, 3]),
        ("ids", I64, &[1, 4]),
        ("s", I64, &[]),
        ("f", F32, &[2]),
    ]);
    assert_eq!(typed!(b.gather("x", t, ids)), (F32, vec![1, 4, 3]));
    assert_eq!(typed!(b.gather("x16", t16, ids)), (Bf16, vec![1, 4, 3]));
    assert_refusals([
        (b.gather("y", t, s), "operand 'indices' ('s') is i64 [], expected i64 of rank at least 1"),
        (b.gather("y", t, f), "operand 'indices' ('f') is f32 [2], expected i64 of rank at least 1"),
        (
            b.gather("y", ids, ids),
            "operand 'table' ('ids') is i64 [1, 4], expected f32, f16 or bf16 of rank 2",
        ),
    ]);
}

#[test]
fn mat_mul_takes_leading_rows_a_transposed_weight_and_a_bias() {
    let (mut b, [a, w, wt, bias, bias4, b16, v]) = with_inputs([
        ("a", F32, &[2, 3, 4]),
        ("w", F32, &[4, 5]),
        ("wt", F32, &[5, 4]),
        ("bias", F32, &[5]),
        ("bias4", F32, &[4]),
        ("b16", F16, &[5]),
        ("v", F32, &[4]),
    ]);
    assert_eq!(typed!(b.mat_mul("y", a, w)), (F32, vec![2, 3, 5]));
    let linear = MatMulOptions { transpose_b: true, bias: Some(bias) };
    assert_eq!(typed!(b.mat_mul_with("z", a, wt, linear)), (F32, vec![2, 3, 5]));
    assert_refusals([
        (
            b.mat_mul_with("e", a, w, MatMulOptions { transpose_b: true, bias: None }),
            "inner extents differ: 'a' is [2, 3, 4] and 'w' is [4, 5] (transposed: [N, K])",
        ),
        (
            b.mat_mul_with("e", a, wt, MatMulOptions { transpose_b: true, bias: Some(bias4) }),
            "operand 'bias' ('bias4') is f32 [4], expected [5] (the output columns of 'wt' [5, 4])",
        ),
        (
            b.mat_mul_with("e", a, w, MatMulOptions { transpose_b: false, bias: Some(b16) }),
            "operand 'bias' ('b16') is f16, but operand 'a' ('a') is f32: the float operands of one op share \
             one float type",
        ),
        (b.mat_mul("e", v, w), "operand 'a' ('v') is f32 [4], expected f32, f16 or bf16 of rank at least 2"),
        (b.mat_mul("e", a, a), "operand 'b' ('a') is f32 [2, 3, 4], expected f32, f16 or bf16 of rank 2"),
    ]);
}

#[test]
fn elementwise_ops_broadcast_and_take_one_element_type() {
    let (mut b, [x, eps, y, z, i, j, h, q]) = with_inputs([
        ("x", F32, &[2, 1, 4]),
        ("eps", F32, &[]),
        ("y", F32, &[3, 1]),
        ("z", F32, &[3, 4]),
        ("i", I64, &[1]),
        ("j", I64, &[]),
        ("h", Bf16, &[4]),
        ("q", F32, &[5]),
    ]);
    assert_eq!(typed!(b.add("a", x, eps)), (F32, vec![2, 1, 4]));
    assert_eq!(typed!(b.sub("s", x, y)), (F32, vec![2, 3, 4]));
    assert_eq!(typed!(b.mul("m", i, j)), (I64, vec![1]), "index arithmetic in i64");
    assert_eq!(typed!(b.add("ai", j, i)), (I64, vec![1]));
    assert_eq!(typed!(b.div("d", z, eps)), (F32, vec![3, 4]));
    assert_eq!(refusal(b.add("e", x, q)), "shapes do not broadcast: 'x' is [2, 1, 4] and 'q' is [5]");
    assert_eq!(typed!(b.div("d2", y, q)), (F32, vec![3, 5]), "[3, 1] / [5]: both stretch");
    assert_refusals([
        (
            b.sub("e", i, x),
            "operand 'b' ('x') is f32 [2, 1, 4], but operand 'a' ('i') is i64: both operands have one \
             element type",
        ),
        (b.add("e", x, i), "operand 'b' ('i') is i64 [1], expected f32, f16 or bf16"),
        (b.div("e", i, j), "operand 'a' ('i') is i64 [1], expected f32, f16 or bf16"),
        (
            b.mul("e", x, h),
            "operand 'b' ('h') is bf16, but operand 'a' ('x') is f32: the float operands of one op share one \
             float type",
        ),
    ]);
}

#[test]
fn unary_mean_and_cast_keep_the_shape() {
    let (mut b, [x, i, s]) = with_inputs([("x", Bf16, &[2, 3]), ("i", I64, &[2]), ("s", F32, &[])]);
    assert_eq!(typed!(b.unary("r", UnaryFn::Rsqrt, x)), (Bf16, vec![2, 3]));
    assert_eq!(typed!(b.unary("n", UnaryFn::Neg, s)), (F32, vec![]));
    assert_eq!(
        refusal(b.unary("e", UnaryFn::Exp, i)),
        "operand 'input' ('i') is i64 [2], expected f32, f16 or bf16"
    );
    assert_eq!(typed!(b.mean("m", x)), (Bf16, vec![2, 1]));
    assert_eq!(
        refusal(b.mean("e", s)),
        "operand 'input' ('s') is f32 [], expected f32, f16 or bf16 of rank at least 1"
    );
    assert_eq!(typed!(b.cast("c", i, F32)), (F32, vec![2]));
    assert_eq!(typed!(b.cast("c2", x, F32)), (F32, vec![2, 3]));
    assert_eq!(typed!(b.cast("c3", x, I64)), (I64, vec![2, 3]));
}

#[test]
fn reshape_keeps_the_element_count() {
    let (mut b, [x, i]) = with_inputs([("x", F32, &[2, 3]), ("i", I64, &[6])]);
    assert_eq!(typed!(b.reshape("r", x, &[3, 1, 2])), (F32, vec![3, 1, 2]));
    assert_eq!(typed!(b.reshape("ri", i, &[1, 6])), (I64, vec![1, 6]));
    assert_eq!(
        refusal(b.reshape("e", x, &[4])),
        "attribute 'shape' [4] does not hold the 6 elements of 'x' [2, 3] (every extent at least 1)"
    );
    assert!(refusal(b.reshape("e", x, &[0, 6])).starts_with("attribute 'shape' [0, 6] does not hold"));
    assert!(
        refusal(b.reshape("e", x, &[u64::MAX, 2])).starts_with("attribute 'shape' [18446744073709551615, 2]")
    );
}

#[test]
fn permute_takes_a_permutation() {
    let (mut b, [x]) = with_inputs([("x", F16, &[2, 3, 4])]);
    assert_eq!(typed!(b.permute("p", x, &[2, 0, 1])), (F16, vec![4, 2, 3]));
    for dims in [&[0, 0, 1][..], &[0, 1], &[0, 1, 3], &[0, 1, 2, 3]] {
        assert_eq!(
            refusal(b.permute("e", x, dims)),
            format!("attribute 'dims' {dims:?} is not a permutation of 0..3 (the axes of 'x' [2, 3, 4])")
        );
    }
}

#[test]
fn slice_cuts_a_non_empty_range_of_one_axis() {
    let (mut b, [x]) = with_inputs([("x", I64, &[2, 6])]);
    assert_eq!(typed!(b.slice("s", x, 1, 2, 5)), (I64, vec![2, 3]));
    assert_eq!(typed!(b.slice("s0", x, 0, 1, 2)), (I64, vec![1, 6]));
    assert_refusals([
        (b.slice("e", x, 2, 0, 1), "attribute 'axis' is 2, but 'x' [2, 6] has rank 2"),
        (b.slice("e", x, 1, 3, 3), "slice 3..3 of axis 1 of 'x' [2, 6] is not within 0..6 and non-empty"),
        (b.slice("e", x, 1, 4, 7), "slice 4..7 of axis 1 of 'x' [2, 6] is not within 0..6 and non-empty"),
    ]);
}

#[test]
fn concat_joins_along_one_axis() {
    let (mut b, [x, y, z, w, h]) = with_inputs([
        ("x", F32, &[2, 3]),
        ("y", F32, &[2, 4]),
        ("z", F32, &[3, 4]),
        ("w", F32, &[2, 3, 1]),
        ("h", F16, &[2, 4]),
    ]);
    assert_eq!(typed!(b.concat("c", x, y, 1)), (F32, vec![2, 7]));
    assert_eq!(typed!(b.concat("c0", y, z, 0)), (F32, vec![5, 4]));
    assert_refusals([
        (
            b.concat("e", x, h, 1),
            "operand 'b' ('h') is f16, but operand 'a' ('x') is f32: concat joins one element type",
        ),
        (
            b.concat("e", x, z, 1),
            "'x' [2, 3] and 'z' [3, 4] differ in rank or in an extent other than axis 1",
        ),
        (
            b.concat("e", x, w, 1),
            "'x' [2, 3] and 'w' [2, 3, 1] differ in rank or in an extent other than axis 1",
        ),
        (b.concat("e", x, y, 2), "attribute 'axis' is 2, but 'x' [2, 3] has rank 2"),
    ]);
}

#[test]
fn rms_norm_and_argmax_take_any_leading_axes() {
    let (mut b, [x, v, g, g3]) =
        with_inputs([("x", F32, &[1, 3, 4]), ("v", F32, &[4]), ("g", F32, &[4]), ("g3", F32, &[3])]);
    assert_eq!(typed!(b.rms_norm("n", x, g, 1e-6)), (F32, vec![1, 3, 4]));
    assert_eq!(typed!(b.rms_norm("n1", v, g, 1e-6)), (F32, vec![4]));
    assert_refusals([
        (b.rms_norm("e", x, g3, 1e-6), "weight 'g3' has 3 columns, input 'x' has 4"),
        (b.rms_norm("e", x, g, 0.0), "attribute 'eps' is 0, expected a finite positive number"),
    ]);
    assert_eq!(typed!(b.argmax("a", x)), (I64, vec![1]));
}

#[test]
fn kv_cache_update_takes_rank_4_caches_and_head_major_rows() {
    let (mut b, [pos, c4, c3, tok, hm4, hm3, long, c4x2, c2]) = with_inputs([
        ("pos", I64, &[1]),
        ("c4", F32, &[1, 2, 8, 4]),
        ("c3", F32, &[2, 8, 4]),
        ("tok", F32, &[3, 8]),
        ("hm4", F32, &[1, 2, 3, 4]),
        ("hm3", F32, &[2, 3, 4]),
        ("long", F32, &[9, 8]),
        ("c4x2", F32, &[2, 2, 8, 4]),
        ("c2", F32, &[8, 4]),
    ]);
    assert_eq!(typed!(b.kv_cache_update("u1", c4, tok, pos)), (F32, vec![1, 2, 8, 4]));
    assert_eq!(typed!(b.kv_cache_update("u2", c4, hm4, pos)), (F32, vec![1, 2, 8, 4]));
    assert_eq!(typed!(b.kv_cache_update("u3", c3, hm3, pos)), (F32, vec![2, 8, 4]));
    assert_refusals([
        (
            b.kv_cache_update("e", c4, hm3, pos),
            "update 'hm3' is [2, 3, 4], but cache 'c4' [1, 2, 8, 4] takes token-major [T, 8] or head-major \
             [1, 2, T, 4] rows with T <= 8",
        ),
        (
            b.kv_cache_update("e", c3, long, pos),
            "update 'long' is [9, 8], but cache 'c3' [2, 8, 4] takes token-major [T, 8] or head-major [2, T, \
             4] rows with T <= 8",
        ),
        (
            b.kv_cache_update("e", c4x2, tok, pos),
            "operand 'cache' ('c4x2') is f32 [2, 2, 8, 4], expected a cache [H, L, Dh] or [1, H, L, Dh]",
        ),
        (
            b.kv_cache_update("e", c2, tok, pos),
            "operand 'cache' ('c2') is f32 [8, 4], expected f32, f16 or bf16 of rank at least 3",
        ),
        (
            b.kv_cache_update("e", c3, hm3, tok),
            "operand 'position' ('tok') is f32 [3, 8], expected i64 of rank 1",
        ),
    ]);
}

#[test]
fn causal_attention_takes_grouped_queries_head_major_layouts_and_a_scale() {
    let (mut b, [pos, k3, k4, q_tok, q_hm4, q_hm3, q_odd, q_cols, q_long, v3x]) = with_inputs([
        ("pos", I64, &[1]),
        ("k3", F32, &[2, 8, 4]),
        ("k4", F32, &[1, 2, 8, 4]),
        ("q_tok", F32, &[3, 16]),
        ("q_hm4", F32, &[1, 4, 3, 4]),
        ("q_hm3", F32, &[4, 3, 4]),
        ("q_odd", F32, &[3, 12]),
        ("q_cols", F32, &[3, 10]),
        ("q_long", F32, &[9, 16]),
        ("v3x", F32, &[2, 7, 4]),
    ]);
    assert_eq!(typed!(b.causal_attention("a1", q_tok, k3, k3, pos)), (F32, vec![3, 16]));
    assert_eq!(typed!(b.causal_attention("a2", q_hm4, k4, k4, pos)), (F32, vec![1, 4, 3, 4]));
    assert_eq!(typed!(b.causal_attention_scaled("a3", q_hm3, k3, k3, pos, 0.125)), (F32, vec![4, 3, 4]));
    assert_eq!(
        refusal(b.causal_attention("e", q_odd, k3, k3, pos)),
        "grouped-query attention needs the query heads (Hq) to be a multiple of the KV heads (Hkv): queries \
         'q_odd' [3, 12] have Hq = 3, caches [2, 8, 4] have Hkv = 2"
    );
    let layouts = |q: &str, sq: &str, sk: &str, lead: &str| {
        format!(
            "queries '{q}' are {sq}, but caches {sk} take token-major [T, Hq * 4] or head-major [{lead}Hq, T, 4] \
             queries with T <= 8"
        )
    };
    assert_refusals([
        (b.causal_attention("e", q_cols, k3, k3, pos), &layouts("q_cols", "[3, 10]", "[2, 8, 4]", "")),
        (b.causal_attention("e", q_long, k3, k3, pos), &layouts("q_long", "[9, 16]", "[2, 8, 4]", "")),
        (b.causal_attention("e", q_hm3, k4, k4, pos), &layouts("q_hm3", "[4, 3, 4]", "[1, 2, 8, 4]", "1, ")),
        (
            b.causal_attention("e", q_tok, k3, v3x, pos),
            "caches differ: 'k3' is [2, 8, 4] and 'v3x' is [2, 7, 4]",
        ),
    ]);
    for scale in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        assert_eq!(
            refusal(b.causal_attention_scaled("e", q_tok, k3, k3, pos, scale)),
            format!("attribute 'scale' is {scale}, expected a finite positive number")
        );
    }
}

/// Rank-4 caches, head-major rows and grouped queries also pass the whole graph's checks (the in-place cache
/// rules included).
#[test]
fn a_grouped_query_layer_with_rank_4_caches_validates() {
    let (mut b, [pos, kc, vc, q, k, v]) = with_inputs([
        ("pos", I64, &[1]),
        ("k_cache", Bf16, &[1, 2, 8, 4]),
        ("v_cache", Bf16, &[1, 2, 8, 4]),
        ("q", Bf16, &[1, 4, 3, 4]),
        ("k", Bf16, &[1, 2, 3, 4]),
        ("v", Bf16, &[3, 8]),
    ]);
    let k_out = b.kv_cache_update("k_out", kc, k, pos).expect("head-major rows");
    let v_out = b.kv_cache_update("v_out", vc, v, pos).expect("token-major rows");
    let attn = b.causal_attention("attn", q, k_out, v_out, pos).expect("Hq = 4 over Hkv = 2");
    b.output(attn).expect("declared");
    b.output(k_out).expect("declared");
    let graph = b.finish().expect("valid");
    assert_eq!(graph.tensor(attn).shape, [1, 4, 3, 4]);
    assert_eq!(graph.tensor(attn).dtype, Bf16);
}
