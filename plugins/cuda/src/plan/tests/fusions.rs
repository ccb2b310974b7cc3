//! The fusions of spelled forms, each matched only when its parts are private: RoPE (in any traced order, into
//! the GEMV of a decode row), SwiGLU into its gate and up GEMV, RMS norms spelled in ops, a norm that adds the
//! residual itself, and a lone product's soft-capping.

use super::*;

/// RoPE is matched by structure, in the order Hugging Face's `q * cos + rotate_half(q) * sin` traces (the
/// product by `cos` first) as in the order `tests/support/hf.rs` builds; an intermediate something else reads
/// (here a graph output) leaves the seven ops as they are.
#[test]
fn rope_is_one_step_in_any_traced_order_and_only_when_its_parts_are_private() {
    let build = |expose_slice: bool| {
        let mut b = ref_graph::GraphBuilder::new();
        let x = b.input("x", ElemType::F32, &[1, 2, 1, 4]).expect("fresh");
        let cos = b.input("cos", ElemType::F32, &[1, 4]).expect("fresh");
        let sin = b.input("sin", ElemType::F32, &[1, 4]).expect("fresh");
        let (out, x1) = hf_rope(&mut b, x, [cos, sin], 3, 4);
        b.output(out).expect("declared");
        if expose_slice {
            b.output(x1).expect("declared");
        }
        Plan::new(&b.finish().expect("valid")).expect("lowered")
    };
    assert_eq!(kinds(&build(false)), ["rope"]);
    assert_eq!(kinds(&build(true)), ["b.mul", "copy", "copy", "neg", "copy", "copy", "b.mul", "add"]);
}

/// `x * cos + rotate_half(x) * sin` along `x`'s last axis, `axis`, of `width`, as Hugging Face traces it:
/// the output and the first half's slice.
fn hf_rope(
    b: &mut ref_graph::GraphBuilder,
    x: TensorId,
    tables: [TensorId; 2],
    axis: u64,
    width: u64,
) -> (TensorId, TensorId) {
    let [cos, sin] = tables;
    let plain = b.mul("plain", x, cos).expect("typed");
    let x1 = b.slice("x1", x, axis, 0, width / 2).expect("typed");
    let x2 = b.slice("x2", x, axis, width / 2, width).expect("typed");
    let neg = b.unary("neg", UnaryFn::Neg, x2).expect("typed");
    let rot = b.concat("rot", neg, x1, axis).expect("typed");
    let rotated = b.mul("rotated", rot, sin).expect("typed");
    (b.add("out", plain, rotated).expect("typed"), x1)
}

/// A decode step's RoPE of a projection is applied by that projection's GEMV, which stores the rotated row
/// as the RoPE's output (the product and its view never written); a prefill's, or one whose product
/// something else reads, stays a launch of its own after a GEMV that stores the product.
#[test]
fn rope_fuses_into_the_gemv_of_a_decode_row_only_when_it_owns_the_product() {
    // `rows` query rows of two heads of 4; `exposed`: the product is also a graph output.
    let build = |rows: u64, exposed: bool| {
        let mut b = ref_graph::GraphBuilder::new();
        let x = b.input("x", ElemType::F32, &[rows, 8]).expect("fresh");
        let w = b.constant_f32("w", &[8, 8], vec![0.5; 64]).expect("fresh");
        let cos = b.input("cos", ElemType::F32, &[rows, 1, 4]).expect("fresh");
        let sin = b.input("sin", ElemType::F32, &[rows, 1, 4]).expect("fresh");
        let q = b.mat_mul("q", x, w).expect("typed");
        let heads = b.reshape("heads", q, &[rows, 2, 4]).expect("typed");
        let (out, _) = hf_rope(&mut b, heads, [cos, sin], 2, 4);
        b.output(out).expect("declared");
        if exposed {
            b.output(q).expect("declared");
        }
        b.finish().expect("valid")
    };
    let graph = build(1, false);
    let plan = Plan::new(&graph).expect("lowered");
    assert_eq!(kinds(&plan), ["gemv1+rope"]);
    let find = |name: &str| graph.find(name).expect("tensor");
    let Step::Gemv { ref mats, rope: Some(tables), .. } = plan.steps[0] else { panic!("{:?}", kinds(&plan)) };
    assert_eq!((mats[0].y, mats[0].roped), (find("out"), true));
    assert_eq!(tables, RopeTables { cos: find("cos"), sin: find("sin"), half: 2, head: 4 });
    for part in ["q", "heads"] {
        assert_eq!(plan.homes[find(part).0], Home::SameAs(find("out")), "'{part}' is never written");
    }
    for (rows, exposed) in [(3, false), (1, true)] {
        let graph = build(rows, exposed);
        let plan = Plan::new(&graph).expect("lowered");
        assert_eq!(kinds(&plan), ["gemv1", "rope"], "{rows} rows, product exposed: {exposed}");
        let Step::Gemv { ref mats, .. } = plan.steps[0] else { unreachable!("checked") };
        assert_eq!((mats[0].y, mats[0].roped), (find("q"), false));
    }
}

/// Hugging Face's SwiGLU (`silu(x W_gate) * (x W_up)`) becomes one GEMV that writes the product, with the
/// gate and up products and the SiLU never written, only when nothing else reads them; otherwise the two ops
/// stay launches of their own and the products are written.
#[test]
fn swiglu_fuses_into_its_gate_and_up_gemv_only_when_its_parts_are_private() {
    use ref_graph::ElemType::Bf16;
    // Which of the gate product, the up product and the SiLU a second op also reads (or none); whether the
    // up product comes first.
    let build = |also_read: Option<usize>, up_first: bool| {
        let mut b = ref_graph::GraphBuilder::new();
        let x = b.input("x", Bf16, &[1, 8]).expect("fresh");
        let weight = |b: &mut ref_graph::GraphBuilder, name: &str, k: u64, n: u64| {
            b.constant_bf16(name, &[k, n], vec![half::bf16::ONE; (k * n) as usize]).expect("fresh")
        };
        let (wg, wu, wd) =
            (weight(&mut b, "w_gate", 8, 16), weight(&mut b, "w_up", 8, 16), weight(&mut b, "w_down", 16, 8));
        let (gate, up) = if up_first {
            let up = b.mat_mul("up", x, wu).expect("typed");
            (b.mat_mul("gate", x, wg).expect("typed"), up)
        } else {
            let gate = b.mat_mul("gate", x, wg).expect("typed");
            (gate, b.mat_mul("up", x, wu).expect("typed"))
        };
        let s = b.unary("silu", UnaryFn::Silu, gate).expect("typed");
        let product = b.mul("product", s, up).expect("typed");
        let y = b.mat_mul("y", product, wd).expect("typed");
        b.output(y).expect("declared");
        if let Some(part) = also_read {
            let other = b.add("other", [gate, up, s][part], product).expect("typed");
            b.output(other).expect("declared");
        }
        b.finish().expect("valid")
    };
    for up_first in [false, true] {
        let graph = build(None, up_first);
        let plan = Plan::new(&graph).expect("lowered");
        assert_eq!(kinds(&plan), ["gemv2+swiglu", "gemv1"]);
        let Step::Gemv { glu: Some(out), ref mats, .. } = plan.steps[0] else { panic!("{:?}", kinds(&plan)) };
        let find = |name: &str| graph.find(name).expect("tensor");
        assert_eq!(out, find("product"));
        assert_eq!(mats.iter().map(|m| m.y).collect::<Vec<_>>(), [find("gate"), find("up")], "gate first");
        for part in ["gate", "up", "silu"] {
            assert_eq!(plan.homes[find(part).0], Home::SameAs(out), "'{part}' is never allocated");
        }
    }
    for part in 0..3 {
        let plan = Plan::new(&build(Some(part), false)).expect("lowered");
        assert!(
            plan.steps.iter().all(|s| !matches!(s, Step::Gemv { glu: Some(_), .. })),
            "part {part} read twice: {:?}",
            kinds(&plan)
        );
    }
}

/// Gemma 2's RMS norms, spelled in f32 ops (between casts in its f16 export, their `(1 + w)` folded by the
/// exporter into f32 gains), are each one norm: none of their ops runs on its own, and the kernels read every
/// gain in the model's type (a half model's f32 gains converted once, at init).
#[test]
fn spelled_rms_norms_are_norms_with_gains_in_the_models_type() {
    let mut checked = 0;
    for (name, graph) in real::fixtures().into_iter().filter(|(name, _)| name.starts_with("gemma2")) {
        let plan = Plan::new(&graph).expect("lowered");
        let all = kinds(&plan);
        let spelled = ["square", "mean", "rsqrt", "cast_f32", "cast_f16"];
        assert!(!all.iter().any(|k| spelled.contains(&k.as_str())), "{name}: {all:?}");
        let dtype = graph.tensor(graph.find(&real::Roles::of(&graph).logits).expect("logits")).dtype;
        let gains: Vec<TensorId> = plan
            .steps
            .iter()
            .filter_map(|s| match *s {
                Step::Norm { norm, .. } | Step::Gemv { norm: Some(norm), .. } => Some(norm.gain),
                _ => None,
            })
            .collect();
        assert_eq!(gains.len(), 9, "{name}: four norms a layer and the final one: {all:?}");
        for gain in gains {
            assert_eq!(graph.tensor(gain).dtype, ElemType::F32, "{name}: Gemma 2's gains are f32 constants");
            assert_eq!(
                plan.dtypes[gain.0],
                dtype,
                "{name}: '{}' read as the model's type",
                graph.tensor(gain).name
            );
        }
        checked += 1;
    }
    assert_eq!(checked, 2, "gemma2_f16 and gemma2_f32");
}

/// A norm whose output only a residual add of its shape reads adds the residual itself (Gemma 2's
/// post-norms, `x + norm(y)`): one launch writing the sum, the norm's own output never stored. Read by
/// anything else too, it keeps its add.
#[test]
fn a_norm_read_only_by_a_residual_add_adds_the_residual_itself() {
    let build = |norm_is_output: bool| {
        let mut b = ref_graph::GraphBuilder::new();
        let x = b.input("x", ElemType::F32, &[1, 4]).expect("x");
        let y = b.input("y", ElemType::F32, &[1, 4]).expect("y");
        let gain = b.constant_f32("gain", &[4], vec![1.0, 2.0, 3.0, 4.0]).expect("gain");
        let t = b.rms_norm("t", y, gain, 1e-6).expect("norm");
        let h = b.add("h", x, t).expect("add");
        b.output(h).expect("output");
        if norm_is_output {
            b.output(t).expect("output");
        }
        b.finish().expect("graph")
    };
    let graph = build(false);
    let plan = Plan::new(&graph).expect("lowered");
    assert_eq!(kinds(&plan), ["rms_norm+residual"]);
    assert_eq!(plan.homes[graph.find("t").expect("t").0], Home::SameAs(graph.find("h").expect("h")));
    let mut emu = emulate::Emulator::new(&graph, plan);
    emu.set("x", &[10.0, 20.0, 30.0, 40.0]);
    // mean(y^2) = 4: each y / 2 (to eps's precision) times its gain.
    emu.set("y", &[2.0, -2.0, 2.0, -2.0]);
    emu.run().expect("runs");
    let h = emu.read("h");
    let want = [11.0, 18.0, 33.0, 36.0];
    assert!(h.iter().zip(want).all(|(h, w)| (h - w).abs() < 1e-4), "{h:?}, not {want:?}");
    assert_eq!(kinds(&Plan::new(&build(true)).expect("lowered")), ["rms_norm", "add"]);
}

/// Final-logit soft-capping after a lone product (Gemma 2's `tanh(y / c) * c`) is the GEMV's last epilogue,
/// its intermediates never stored, and the emulated plan gives the three ops' values; with an intermediate
/// read by anything else too, the ops keep their launches.
#[test]
fn a_softcap_of_a_lone_product_is_its_gemvs_epilogue() {
    let build = |tanh_is_output: bool| {
        let mut b = ref_graph::GraphBuilder::new();
        let x = b.input("x", ElemType::F32, &[1, 4]).expect("x");
        let w = b.constant_f32("w", &[2, 4], vec![1.0, 2.0, 3.0, 4.0, -1.0, -2.0, -3.0, -4.0]).expect("w");
        let (c1, c2) = (b.constant_f32("c1", &[], vec![3.0]), b.constant_f32("c2", &[], vec![3.0]));
        let linear = ref_graph::MatMulOptions { transpose_b: true, bias: None };
        let y = b.mat_mul_with("y", x, w, linear).expect("y");
        let d = b.div("d", y, c1.expect("c1")).expect("d");
        let t = b.unary("t", UnaryFn::Tanh, d).expect("t");
        let capped = b.mul("capped", t, c2.expect("c2")).expect("capped");
        b.output(capped).expect("output");
        if tanh_is_output {
            b.output(t).expect("output");
        }
        b.finish().expect("graph")
    };
    let graph = build(false);
    let plan = Plan::new(&graph).expect("lowered");
    assert_eq!(kinds(&plan), ["gemv1+softcap"]);
    let capped = graph.find("capped").expect("capped");
    for part in ["y", "d", "t"] {
        assert_eq!(
            plan.homes[graph.find(part).expect("part").0],
            Home::SameAs(capped),
            "'{part}' never stored"
        );
    }
    let mut emu = emulate::Emulator::new(&graph, plan);
    emu.set("x", &[0.5, 0.25, 0.0, 0.25]);
    emu.run().expect("runs");
    // y = [2, -2]: 3 * tanh(2 / 3) and its negation, in f32.
    let want = 3.0 * (2.0f32 / 3.0).tanh();
    let got = emu.read("capped");
    assert!((got[0] - f64::from(want)).abs() < 1e-6 && (got[1] + f64::from(want)).abs() < 1e-6, "{got:?}");
    assert_eq!(kinds(&Plan::new(&build(true)).expect("lowered")), ["gemv1", "b.div", "tanh", "b.mul"]);
}
