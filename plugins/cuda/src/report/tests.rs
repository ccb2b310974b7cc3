//! The report's tests: reasons name the op's form and tensors, fused launches carry none, layers are told
//! apart by names (or attention), and a payload is read as `init` reads it.

use et_error::{ErrorCode, HasErrorCode};
use kv_example::{model, Config, Weights};
use ref_graph::{ElemType, Graph, GraphBuilder, MatMulOptions, TensorId, UnaryFn};

use super::*;

const LINEAR: MatMulOptions = MatMulOptions { transpose_b: true, bias: None };

fn weight(b: &mut GraphBuilder, name: &str, n: u64, k: u64) -> TensorId {
    b.constant_f32(name, &[n, k], vec![0.5; (n * k) as usize]).expect("constant")
}

/// The one launch that writes `name`.
fn writing<'r>(report: &'r PlanReport, name: &str) -> &'r Launch {
    let mut found = report.launches.iter().filter(|l| l.writes.iter().any(|w| w == name));
    let launch = found.next().unwrap_or_else(|| panic!("no launch writes '{name}': {report:#?}"));
    assert!(found.next().is_none(), "one launch writes '{name}': {report:#?}");
    launch
}

fn reason<'r>(report: &'r PlanReport, name: &str) -> &'r str {
    let launch = writing(report, name);
    assert!(!launch.fused, "'{name}' runs on its own: {launch:?}");
    launch.reason.as_deref().unwrap_or_else(|| panic!("'{name}' has a reason: {launch:?}"))
}

/// A product followed by ops with no fused form: a sigmoid times another input (no SiLU), a cast, a mean,
/// a subtraction and a permute that moves data.
fn general_graph() -> Graph {
    let mut b = GraphBuilder::new();
    let x = b.input("x", ElemType::F32, &[2, 8]).expect("input");
    let y = b.input("y", ElemType::F32, &[2, 8]).expect("input");
    let w = weight(&mut b, "model.layers.0.mlp.weight", 8, 8);
    let p = b.mat_mul_with("proj", x, w, LINEAR).expect("mat_mul");
    let s = b.unary("proj_sigmoid", UnaryFn::Sigmoid, p).expect("sigmoid");
    let gated = b.mul("gated", y, s).expect("mul");
    let half = b.cast("half", gated, ElemType::F16).expect("cast");
    let avg = b.mean("avg", gated).expect("mean");
    let centred = b.sub("centred", gated, avg).expect("sub");
    let turned = b.permute("turned", centred, &[1, 0]).expect("permute");
    for out in [half, turned] {
        b.output(out).expect("output");
    }
    b.finish().expect("valid")
}

#[test]
fn every_general_launch_says_what_form_it_is_in_the_graphs_names() {
    let report = PlanReport::of_graph(&general_graph()).expect("planned");
    let product = writing(&report, "proj");
    assert!(product.fused && product.reason.is_none(), "a product is the fast path: {product:?}");
    assert_eq!(product.kind, "gemm", "two rows: the product runs on cuBLAS");
    let sigmoid = reason(&report, "proj_sigmoid");
    assert!(sigmoid.starts_with("sigmoid of 'proj': a sigmoid has no fused form"), "{sigmoid}");
    let mul = reason(&report, "gated");
    assert!(mul.starts_with("mul of 'y' [2, 8] and 'proj_sigmoid' [2, 8]: "), "{mul}");
    assert!(mul.contains("SwiGLU") && mul.contains("RoPE"), "names the fused forms a product has: {mul}");
    let cast = reason(&report, "half");
    assert!(cast.starts_with("cast of 'gated' from f32 to f16"), "{cast}");
    assert!(reason(&report, "avg").starts_with("mean over the last axis of 'gated' [2, 8]"));
    assert!(reason(&report, "centred").contains("a subtraction has no fused form"));
    let permute = reason(&report, "turned");
    assert!(permute.starts_with("permute of 'centred' [2, 8] by [1, 0]"), "{permute}");
    assert_eq!(writing(&report, "turned").kind, "copy");
    for launch in &report.launches {
        assert_eq!(launch.fused, launch.reason.is_none(), "{launch:?}");
        assert!(!launch.reason.as_deref().unwrap_or("x").contains('\n'), "one line: {launch:?}");
    }
    assert_eq!((report.fused(), report.general()), (1, report.launches.len() - 1));
    assert_eq!(report.ops, 7, "the graph's ops");
}

/// An RMS norm read by a reshape before its product stays alone, and says what reads it.
#[test]
fn a_norm_read_by_anything_but_products_says_so() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", ElemType::F32, &[1, 8]).expect("input");
    let gain = b.constant_f32("norm.weight", &[8], vec![1.0; 8]).expect("gain");
    let h = b.rms_norm("normed", x, gain, 1e-6).expect("rms_norm");
    let w = weight(&mut b, "proj.weight", 8, 8);
    let p = b.mat_mul_with("proj", h, w, LINEAR).expect("mat_mul");
    let e = b.unary("normed_exp", UnaryFn::Exp, h).expect("exp");
    b.output(p).expect("output");
    b.output(e).expect("output");
    let report = PlanReport::of_graph(&b.finish().expect("valid")).expect("planned");
    let norm = reason(&report, "normed");
    assert!(norm.starts_with("RMS norm of 'x' into 'normed' in a launch of its own"), "{norm}");
    assert!(norm.contains("here 'normed' is read by mat_mul, unary"), "{norm}");
}

/// kv-example's decoder is all fast path: no launch has a reason, and its layers (names without a layer
/// part) are told apart by attention.
#[test]
fn a_fully_fused_decoder_has_no_reasons_and_its_layers_by_attention() {
    let cfg = Config { layers: 3, ..Config::tiny() };
    let graph = model::build_graph(&cfg, &Weights::generate(&cfg), 1).expect("graph");
    let report = PlanReport::of_graph(&graph).expect("planned");
    assert!(report.launches.iter().all(|l| l.fused && l.reason.is_none()), "{report:#?}");
    let layers = report.layers.clone().expect("layers");
    assert_eq!(layers.rule, LayerRule::Attention);
    assert_eq!(layers.launches.len(), cfg.layers);
    assert_eq!(layers.before + layers.launches.iter().sum::<usize>() + layers.after, report.launches.len());
    let attention = report.launches.iter().filter(|l| l.kind == "attention");
    assert!(attention.enumerate().all(|(i, l)| l.layer == Some(i)), "{report:#?}");
}

/// A call of several rows (a prefill's chunk) lists the launches the engine queues for it: each GEMV step
/// on the GEMM path becomes its products on cuBLAS (`gemm`) and the launches around them, all fused, and the
/// layers count those launches; the same decoder of one row keeps its GEMVs.
#[test]
fn a_chunk_of_rows_lists_its_products_as_gemm_launches_counted_in_its_layers() {
    let cfg = Config { layers: 2, ..Config::tiny() };
    let weights = Weights::generate(&cfg);
    let decode =
        PlanReport::of_graph(&model::build_graph(&cfg, &weights, 1).expect("graph")).expect("planned");
    assert!(decode.launches.iter().all(|l| l.kind != "gemm"), "one row keeps its GEMVs: {decode:#?}");
    let graph = model::build_graph(&cfg, &weights, 4).expect("graph");
    let mut plan = Plan::new(&graph).expect("planned");
    let expansion = Expansion::new(&mut plan);
    let report = PlanReport::of_graph(&graph).expect("planned");
    assert_eq!(report.launches.len(), expansion.launches(), "one launch a part: {report:#?}");
    assert!(report.launches.iter().all(|l| l.fused && l.reason.is_none()), "{report:#?}");
    let gemms = report.launches.iter().filter(|l| l.kind == "gemm").count();
    let products: usize = (0..plan.steps.len())
        .filter_map(|i| expansion.of(i))
        .map(|parts| parts.iter().filter(|p| matches!(p, Part::Product(_))).count())
        .sum();
    assert!(gemms > 0 && gemms == products, "{gemms} gemm launches, {products} products: {report:#?}");
    assert!(report.launches.iter().all(|l| !l.kind.contains("gemv")), "no GEMV left: {report:#?}");
    let layers = report.layers.clone().expect("layers");
    assert_eq!(layers.launches.len(), cfg.layers);
    assert_eq!(layers.before + layers.launches.iter().sum::<usize>() + layers.after, report.launches.len());
    for (layer, &count) in layers.launches.iter().enumerate() {
        let tagged = report.launches.iter().filter(|l| l.layer == Some(layer)).count();
        assert_eq!(tagged, count, "layer {layer}: {report:#?}");
    }
}

/// Layers by the index in weight names: each from its first named launch to the next's; the last until a
/// launch reads a constant of no layer (the head).
#[test]
fn layers_are_told_apart_by_the_index_in_weight_names() {
    let mut b = GraphBuilder::new();
    let mut x = b.input("x", ElemType::F32, &[1, 8]).expect("input");
    x = b.unary("x_tanh", UnaryFn::Tanh, x).expect("tanh");
    for layer in 0..2 {
        let w = weight(&mut b, &format!("model.layers.{layer}.proj.weight"), 8, 8);
        let p = b.mat_mul_with(&format!("p{layer}"), x, w, LINEAR).expect("mat_mul");
        x = b.unary(&format!("s{layer}"), UnaryFn::Sigmoid, p).expect("sigmoid");
    }
    let head = weight(&mut b, "lm_head.weight", 4, 8);
    let logits = b.mat_mul_with("logits", x, head, LINEAR).expect("head");
    b.output(logits).expect("output");
    let report = PlanReport::of_graph(&b.finish().expect("valid")).expect("planned");
    let layers = report.layers.clone().expect("layers");
    assert_eq!(
        (layers.rule, layers.launches, layers.before, layers.after),
        (LayerRule::Names, vec![2, 2], 1, 1)
    );
    let tagged: Vec<Option<usize>> = report.launches.iter().map(|l| l.layer).collect();
    assert_eq!(tagged, [None, Some(0), Some(0), Some(1), Some(1), None]);
}

/// A payload is read as `init` reads it: the blob for `CudaBackend`, a graph inside; anything else is the
/// delegate's own typed error.
#[test]
fn a_payload_is_read_and_refused_as_init_reads_it() {
    let graph = general_graph();
    let blob = delegate_pack::pack_graph(&graph, BACKEND_ID).expect("packed");
    assert_eq!(plan_report(&blob).expect("report"), PlanReport::of_graph(&graph).expect("planned"));
    let other = delegate_pack::pack_graph(&graph, "ReferenceBackend").expect("packed");
    let err = plan_report(&other).expect_err("another backend's blob");
    assert_eq!(err.error_code(), ErrorCode::DelegateInvalidCompatibility, "{err}");
    let engine = blob_format::Blob::parse(&blob).expect("parses").engine;
    let middle = engine.as_ptr() as usize - blob.as_ptr() as usize + engine.len() / 2;
    let mut flipped = blob.clone();
    flipped[middle] ^= 0xff;
    let err = plan_report(&flipped).expect_err("a corrupt payload");
    assert!(!err.to_string().is_empty() && !err.to_string().contains('\n'), "{err}");
    let err = plan_report(&blob[..blob.len() / 2]).expect_err("a cut payload");
    assert_ne!(err.error_code(), ErrorCode::Ok, "{err}");
}

/// Work on constants alone (a weight's cast an exporter left in the graph) is the same every call: said so.
#[test]
fn a_launch_that_reads_constants_alone_says_so() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", ElemType::F16, &[1, 8]).expect("input");
    let gain = b.constant_f32("model.layers.0.norm.weight", &[8], vec![1.0; 8]).expect("gain");
    let half_gain = b.cast("gain_f16", gain, ElemType::F16).expect("cast");
    let scaled = b.mul("scaled", x, half_gain).expect("mul");
    b.output(scaled).expect("output");
    let report = PlanReport::of_graph(&b.finish().expect("valid")).expect("planned");
    let cast = reason(&report, "gain_f16");
    assert!(
        cast.ends_with("; it reads constants alone, so it computes the same values every call"),
        "{cast}"
    );
    assert!(!reason(&report, "scaled").contains("constants alone"), "it reads the input 'x'");
    assert_eq!(writing(&report, "gain_f16").layer, None, "no layer marked by constant work");
}
