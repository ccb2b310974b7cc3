//! `assign`: an in-place write of a whole tensor into a graph input (payload 1.3), reported as an alias like
//! a cache update, and kept out of every op that could observe it.

use alias_validate::EngineIntrospect;

use crate::*;

use ElemType::{F32, I64};

/// A step that records its position in a mutable buffer, as Hugging Face StaticCache's
/// `cumulative_length` is set to `cache_position[0]`, beside an ordinary computation.
fn sample_assign() -> Graph {
    let mut b = GraphBuilder::new();
    let pos = b.input("cache_position", I64, &[1]).expect("fresh");
    let length = b.input("cumulative_length_0", I64, &[]).expect("rank 0");
    let x = b.input("x", F32, &[2]).expect("fresh");
    let y = b.add("y", x, x).expect("typed");
    let first = b.reshape("first", pos, &[]).expect("one element");
    let written = b.assign("cumulative_length_0_out", length, first).expect("same type and shape");
    b.output(y).expect("declared");
    b.output(written).expect("declared");
    b.finish().expect("valid")
}

#[test]
fn an_assign_round_trips_as_1_3_and_reports_its_alias() {
    let graph = sample_assign();
    assert_eq!(graph.payload_version(), (1, 3));
    let decoded = Graph::decode(&graph.encode()).expect("decodes");
    assert_eq!(decoded, graph);
    let out = graph.find("cumulative_length_0_out").expect("declared");
    let target = graph.find("cumulative_length_0").expect("declared");
    assert_eq!(graph.in_place_of(out), Some(target));
    assert_eq!(graph.cache_update_of(out), None, "an assign is no cache update");
    assert_eq!(graph.in_place_pairs().collect::<Vec<_>>(), [(out, target)]);
    assert_eq!(graph.aliased_input("cumulative_length_0_out").as_deref(), Some("cumulative_length_0"));
    assert_eq!(graph.aliased_input("y"), None);
    assert_eq!(graph.tensor(out).shape, Vec::<u64>::new());
    assert_eq!(graph.tensor(out).dtype, I64);
}

#[test]
fn an_assign_of_another_type_or_shape_is_refused_naming_the_value() {
    for (dtype, shape) in [(F32, &[][..]), (I64, &[1][..])] {
        let mut b = GraphBuilder::new();
        let target = b.input("target", I64, &[]).expect("fresh");
        let value = b.input("value", dtype, shape).expect("fresh");
        let err = b.assign("out", target, value).expect_err("type or shape differs");
        let text = err.to_string();
        assert!(matches!(err, Error::OpMismatch { op: "assign", .. }), "{text}");
        assert!(text.contains("'value'") && text.contains("target 'target'"), "{text}");
    }
}

/// A graph with an assign of `value` into input `target`, then `extra` adding ops; its validation error.
fn misuse(extra: impl FnOnce(&mut GraphBuilder, [TensorId; 3])) -> Error {
    let mut b = GraphBuilder::new();
    let target = b.input("target", F32, &[2]).expect("fresh");
    let value = b.input("value", F32, &[2]).expect("fresh");
    let out = b.assign("out", target, value).expect("typed");
    extra(&mut b, [target, value, out]);
    b.finish().expect_err("the rules refuse it")
}

fn assert_misuse(err: Error, tensor: &str, words: &str) {
    let text = err.to_string();
    assert!(matches!(&err, Error::AssignMisuse { name, .. } if name == tensor), "{text}");
    assert!(text.contains(words), "{text}");
}

#[test]
fn assign_targets_and_outputs_are_kept_out_of_other_ops() {
    let read_target = misuse(|b, [target, _, _]| {
        let sum = b.add("sum", target, target).expect("typed");
        b.output(sum).expect("declared");
    });
    assert_misuse(read_target, "target", "only its assign may read it");
    let read_out = misuse(|b, [_, value, out]| {
        let sum = b.add("sum", out, value).expect("typed");
        b.output(sum).expect("declared");
    });
    assert_misuse(read_out, "out", "no op may read it");
    let twice = misuse(|b, [target, value, _]| {
        b.assign("again", target, value).expect("typed");
    });
    assert_misuse(twice, "target", "two ops");
}

#[test]
fn only_a_graph_input_is_assigned_in_place() {
    let mut b = GraphBuilder::new();
    let value = b.input("value", F32, &[2]).expect("fresh");
    let c = b.constant_f32("c", &[2], vec![1.0, 2.0]).expect("2 values");
    let out = b.assign("out", c, value).expect("typed");
    b.output(out).expect("declared");
    assert_misuse(b.finish().expect_err("a constant"), "c", "not a graph input");

    let mut b = GraphBuilder::new();
    let value = b.input("value", F32, &[2]).expect("fresh");
    let sum = b.add("sum", value, value).expect("typed");
    let out = b.assign("out", sum, value).expect("typed");
    b.output(out).expect("declared");
    assert_misuse(b.finish().expect_err("an op's output"), "sum", "not a graph input");
}

#[test]
fn a_cache_is_not_also_assigned() {
    let mut b = GraphBuilder::new();
    let pos = b.input("pos", I64, &[1]).expect("fresh");
    let cache = b.input("cache", F32, &[1, 2, 2]).expect("fresh");
    let update = b.input("update", F32, &[1, 2]).expect("fresh");
    let whole = b.input("whole", F32, &[1, 2, 2]).expect("fresh");
    let written = b.assign("written", cache, whole).expect("typed");
    let updated = b.kv_cache_update("updated", cache, update, pos).expect("typed");
    b.output(written).expect("declared");
    b.output(updated).expect("declared");
    assert_misuse(b.finish().expect_err("written twice"), "cache", "two ops");
}

#[test]
fn an_assign_of_a_cache_output_is_refused() {
    let mut b = GraphBuilder::new();
    let pos = b.input("pos", I64, &[1]).expect("fresh");
    let cache = b.input("cache", F32, &[1, 2, 2]).expect("fresh");
    let update = b.input("update", F32, &[1, 2]).expect("fresh");
    let copy = b.input("copy", F32, &[1, 2, 2]).expect("fresh");
    let updated = b.kv_cache_update("updated", cache, update, pos).expect("typed");
    let out = b.assign("out", copy, updated).expect("typed");
    b.output(out).expect("declared");
    let err = b.finish().expect_err("a cache output read by an assign");
    assert!(matches!(&err, Error::CacheMisuse { name, .. } if name == "updated"), "{err}");
}
