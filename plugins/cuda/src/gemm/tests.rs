//! The GEMM path's tests, on the CPU: which steps take it and what each becomes (for kv-example's decoder, the
//! Hugging Face forms and the committed prefill export), and the cuBLAS call of a product checked against
//! BLAS's own column-major definition.

use kv_example::{model, Config, Weights};
use ref_graph::{ElemType, Graph, TensorId, UnaryFn};

use super::*;
use crate::plan::Plan;

// The plan's tests load the same decoder privately (`plan::tests`); a second copy here keeps this module
// independent of theirs.
#[allow(clippy::duplicate_mod)]
#[path = "../../tests/support/hf.rs"]
mod hf;

/// What a part is, in a word: a product `gemm`, else the step's label (`rms_norm`, `add`, `b.mul`, ...).
fn kinds(parts: &[Part]) -> Vec<String> {
    parts
        .iter()
        .map(|p| match p {
            Part::Product(_) => "gemm".to_owned(),
            Part::Step(step) => step.label(),
        })
        .collect()
}

/// The plan of `graph` and its GEMM path.
fn expanded(graph: &Graph) -> (Plan, Expansion) {
    let mut plan = Plan::new(graph).expect("lowered");
    let expansion = Expansion::new(&mut plan);
    (plan, expansion)
}

fn products(e: &Expansion) -> Vec<Product> {
    e.parts
        .iter()
        .flatten()
        .flatten()
        .filter_map(|p| if let Part::Product(p) = p { Some(*p) } else { None })
        .collect()
}

/// A decode step keeps every GEMV and gains no scratch: its launches are the plan's.
fn assert_untouched(graph: &Graph) {
    let plan = Plan::new(graph).expect("lowered");
    let (mut with, before) = (plan.clone(), plan.dtypes.len());
    let e = Expansion::new(&mut with);
    assert!(!e.any() && e.scratch.is_empty(), "a one-row step takes the GEMM path: {e:?}");
    assert_eq!(with.dtypes.len(), before);
    assert_eq!(with.steps, plan.steps);
}

/// kv-example's prefill: the normalised Q/K/V GEMV that writes the caches becomes the norm into scratch, three
/// products from it and one update of both caches over the prompt's rows; the output projection a product
/// and the residual added into it; the logits the final norm and a product. Its decode step is untouched.
#[test]
fn a_prefill_runs_its_products_as_gemms_and_a_decode_step_keeps_its_gemvs() {
    let cfg = Config { layers: 2, ..Config::tiny() };
    let weights = Weights::generate(&cfg);
    assert_untouched(&model::build_graph(&cfg, &weights, 1).expect("graph"));
    let rows = cfg.prompt.len();
    assert!(rows as u32 >= GEMM_MIN_ROWS, "the tiny prompt is a prefill of several rows");
    let graph = model::build_graph(&cfg, &weights, rows).expect("graph");
    let (plan, e) = expanded(&graph);
    let routed: Vec<(String, Vec<String>)> = plan
        .steps
        .iter()
        .zip(&e.parts)
        .filter_map(|(step, parts)| parts.as_ref().map(|p| (step.label(), kinds(p))))
        .collect();
    let qkv = ["rms_norm", "gemm", "gemm", "gemm", "kv_update2"];
    let out = ["gemm", "add"];
    let layer = [("norm+gemv3+kv_update", &qkv[..]), ("gemv1+residual", &out[..])];
    let mut expected: Vec<(&str, &[&str])> = layer.iter().chain(&layer).copied().collect();
    expected.push(("norm+gemv1", &["rms_norm", "gemm"]));
    let expected: Vec<(String, Vec<String>)> =
        expected.iter().map(|(s, p)| (s.to_string(), p.iter().map(|k| k.to_string()).collect())).collect();
    assert_eq!(routed, expected);
    // Every GEMV of the plan took the path; a call queues each other step's launch and the routed ones' parts.
    assert_eq!(plan.steps.iter().filter(|s| routes(s)).count(), routed.len());
    let parts: usize = expected.iter().map(|(_, p)| p.len()).sum();
    assert_eq!(e.launches(), plan.steps.len() - routed.len() + parts);
    let find = |name: &str| graph.find(name).expect("tensor");
    // Q, K and V read the normalised rows in scratch and write their own tensors; the caches then receive K
    // and V at the position, over every row.
    let Some(parts) = e.of(1) else { panic!("the first layer's Q/K/V") };
    let Part::Step(Step::Norm { input, out: normed, rows: m, dim, .. }) = parts[0] else {
        panic!("{parts:?}")
    };
    assert_eq!((input, m as usize, u64::from(dim)), (find("x_0"), rows, cfg.dim() as u64));
    assert!(normed.0 >= graph.tensors().len(), "the normalised rows are scratch, past the graph's tensors");
    // One normalised scratch tensor for each normalised GEMV (two layers' Q/K/V, the logits), one buffer.
    assert_eq!(e.scratch.len(), 3);
    assert_eq!(e.scratch[0], (normed, Role::Normed));
    assert!(e.scratch.iter().all(|&(_, role)| role == Role::Normed));
    assert_eq!(e.role_bytes, [rows * cfg.dim() * 4, 0, 0]);
    let Step::Gemv { ref mats, cache_rows: Some(c), .. } = plan.steps[1] else { panic!("a fused Q/K/V") };
    for (part, mat) in parts[1..4].iter().zip(mats) {
        let Part::Product(p) = *part else { panic!("{parts:?}") };
        let want = (normed, mat.w, mat.y, rows as u32, mat.n, cfg.dim() as u32, Float::F32);
        assert_eq!((p.a, p.w, p.y, p.m, p.n, p.k, p.float), want);
    }
    let Part::Step(Step::KvUpdate { ref caches, position, layout }) = parts[4] else { panic!("{parts:?}") };
    let (k, v) = (find(&model::k_cache(0)), find(&model::v_cache(0)));
    assert_eq!(caches[..], [(k, mats[1].y), (v, mats[2].y)]);
    assert_eq!(position, c.position);
    let expected =
        KvLayout { rows: rows as u32, heads: c.heads, len: c.len, head_dim: c.head_dim, head_major: false };
    assert_eq!(layout, expected);
    // The output projection writes the layer's output and adds the residual to it, in place.
    let Some([Part::Product(o), Part::Step(Step::Add { a, b, out, n })]) = e.of(3) else { panic!("{e:?}") };
    assert_eq!((o.y, *a, *out, *b), (find("x_1"), find("x_1"), find("x_1"), find("x_0")));
    assert_eq!(*n, (rows * cfg.dim()) as u64);
}

/// The Hugging Face forms in bf16, f16 and f32 at a prefill of 16 rows: every product on the path (seven a
/// layer and the logits), the scratch of the model's type; Q/K/V's biases added across the rows; SwiGLU's gate
/// and up into scratch, then `silu(gate)` in place and `* up` into the GEMV's output. The decode step of one
/// row is untouched.
#[test]
fn hugging_face_prefill_products_and_swiglu_take_the_gemm_path() {
    for dtype in [ElemType::Bf16, ElemType::F16, ElemType::F32] {
        let cfg = hf::Hf::tiny(dtype);
        assert_untouched(&hf::build(&cfg, 1));
        let graph = hf::build(&cfg, 16);
        let (plan, e) = expanded(&graph);
        assert!(plan.steps.iter().all(|s| !matches!(s, Step::Gemv { .. }) || routes(s)), "{dtype}");
        let products = products(&e);
        assert_eq!(products.len(), 7 * cfg.layers + 1, "{dtype}");
        assert!(products.iter().all(|p| p.m == 16 && Float::of(dtype) == Some(p.float)), "{dtype}");
        assert!(e.scratch.iter().all(|&(id, _)| plan.dtypes[id.0] == dtype), "{dtype}");
        let glu: Vec<_> = plan
            .steps
            .iter()
            .zip(&e.parts)
            .filter_map(
                |(s, p)| if let Step::Gemv { glu: Some(out), .. } = *s { Some((out, p)) } else { None },
            )
            .collect();
        assert_eq!(glu.len(), cfg.layers, "{dtype}: one SwiGLU a layer");
        for (out, parts) in glu {
            let parts = parts.as_deref().expect("routed");
            let n = 16 * cfg.ffn;
            let [.., Part::Product(gate), Part::Product(up), Part::Step(glu)] = parts else {
                panic!("{parts:?}")
            };
            assert_eq!((gate.n as u64, up.n as u64), (cfg.ffn, cfg.ffn));
            let (func, gate, up) = (UnaryFn::Silu, gate.y, up.y);
            assert_eq!(
                *glu,
                Step::Glu { func, gate, up, out, n, dtype },
                "SiLU and the product in one launch"
            );
        }
        // Qwen2's Q/K/V biases: each added to its product's rows, broadcast down them.
        let biases: Vec<&Step> = e
            .parts
            .iter()
            .flatten()
            .flatten()
            .filter_map(|p| match p {
                Part::Step(s @ Step::Binary { op: BinOp::Add, .. }) => Some(s),
                _ => None,
            })
            .collect();
        assert_eq!(biases.len(), 3 * cfg.layers, "{dtype}");
        for s in biases {
            let Step::Binary { ref walk, a, out, .. } = *s else { unreachable!() };
            assert_eq!((walk.dims.len(), walk.b[0], walk.b[1], walk.a[1], a), (2, 0, 1, 1, out), "{dtype}");
            assert_eq!(walk.dims[0], 16);
        }
    }
}

/// The committed prefill export (`fixtures/executorch/prefill/llama_f32.cuda.pte`, transformers' recipe with
/// a `prefill` method of 3 tokens beside the one-token decode step): every product of its prefill takes the
/// GEMM path, none of its decode step's.
#[test]
fn the_exported_prefill_method_runs_its_products_as_gemms() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/executorch/prefill/llama_f32.cuda.pte");
    let bytes = std::fs::read(&path).expect("the prefill fixture is committed");
    let program = pte_format::Program::parse(&bytes).expect("a program");
    let graph = |prefill: bool| {
        let method = program.methods.iter().find(|m| (m.name == "prefill") == prefill).expect("the method");
        let call = &method.delegates[0];
        ref_graph_contract::read_blob(call.processed.data, call.id, "the CUDA delegate").expect("a graph").1
    };
    assert_eq!(program.methods.len(), 2, "a prefill method beside the decode step's");
    assert_untouched(&graph(false));
    let prefill = graph(true);
    let (plan, e) = expanded(&prefill);
    let gemvs = plan.steps.iter().filter(|s| matches!(s, Step::Gemv { .. })).count();
    assert!(gemvs > 0);
    assert_eq!(plan.steps.iter().filter(|s| routes(s)).count(), gemvs, "every product of the prefill");
    let products = products(&e);
    assert!(products.len() >= gemvs, "{products:?}");
    assert!(products.iter().all(|p| p.m == 3 && p.float == Float::F32));
}

/// Host matrices addressed as device memory is: matrix `i` at `i << 20`, elements of `elem` bytes.
struct Memory {
    mats: Vec<Vec<f64>>,
    elem: u64,
}

impl Memory {
    fn at(&mut self, addr: u64, i: usize) -> &mut f64 {
        let offset = (addr & 0xf_ffff) / self.elem;
        &mut self.mats[(addr >> 20) as usize][offset as usize + i]
    }
}

/// BLAS's column-major product, by its definition: `C = alpha op(A) op(B) + beta C`, `op(A)` `m x k`, element
/// `(i, j)` of a column-major matrix at `i + j * ld`; with `beta = 0`, `C` is not read (it may hold anything).
fn blas(g: &cuda_rt::Sgemm, mem: &mut Memory) {
    let at = |t: bool, i: usize, j: usize, ld: usize| if t { j + i * ld } else { i + j * ld };
    for i in 0..g.m {
        for j in 0..g.n {
            let mut s = 0.0;
            for l in 0..g.k {
                s += *mem.at(g.a, at(g.transpose_a, i, l, g.lda))
                    * *mem.at(g.b, at(g.transpose_b, l, j, g.ldb));
            }
            let c = mem.at(g.c, i + j * g.ldc);
            let kept = if g.beta == 0.0 { 0.0 } else { f64::from(g.beta) * *c };
            *c = f64::from(g.alpha) * s + kept;
        }
    }
}

/// The cuBLAS call of a product computes the row-major `y = a w^T` the GEMV computes (`y[r, j] = a[r, :] .
/// w[w_row + j, :]`), run here through BLAS's column-major definition with every extent distinct: over the
/// whole weight, and over a slice of its rows (an f32 and a bf16 one: the slice's offset in bytes).
#[test]
fn the_cublas_call_computes_the_row_major_product() {
    let (m, n, k) = (3usize, 5usize, 4usize);
    for (float, elem, w_row) in [(Float::Bf16, 2, 0usize), (Float::Bf16, 2, 2), (Float::F32, 4, 3)] {
        let rows = n + w_row + 1;
        let a: Vec<f64> = (0..m * k).map(|i| (i as f64 * 0.37).sin()).collect();
        let w: Vec<f64> = (0..rows * k).map(|i| (i as f64 * 0.71).cos()).collect();
        let (m32, n32, k32) = (m as u32, n as u32, k as u32);
        let (a_id, w_id, y_id) = (TensorId(0), TensorId(1), TensorId(2));
        let product = Product {
            a: a_id,
            w: w_id,
            transposed: false,
            w_row: w_row as u32,
            y: y_id,
            m: m32,
            n: n32,
            k: k32,
            float,
        };
        let call = launch::call(&product, 0, 1 << 20, 2 << 20);
        let expected = match float {
            Float::F32 => cuda_rt::GemmType::F32,
            Float::F16 => cuda_rt::GemmType::F16,
            Float::Bf16 => cuda_rt::GemmType::Bf16,
        };
        assert_eq!(call.dtype, expected);
        let mut mem = Memory { mats: vec![a.clone(), w.clone(), vec![f64::NAN; m * n]], elem };
        blas(&call.product, &mut mem);
        for r in 0..m {
            for j in 0..n {
                let want: f64 = (0..k).map(|l| a[r * k + l] * w[(w_row + j) * k + l]).sum();
                let got = mem.mats[2][r * n + j];
                assert!(
                    (got - want).abs() < 1e-12,
                    "{float:?} from row {w_row}: y[{r}, {j}] = {got} not {want}"
                );
            }
        }
    }
}

/// A GELU MLP (GPT-2's form, `gelu(x w1^T) w2^T`) at 4 rows: the GEMV's activation applied to its product in
/// place, after the GEMM.
#[test]
fn an_activation_follows_its_product() {
    let (rows, dim, ffn) = (4u64, 8u64, 16u64);
    let mut b = ref_graph::GraphBuilder::new();
    let x = b.input("x", ElemType::F32, &[rows, dim]).expect("x");
    let w1 = b.constant_f32("w1", &[ffn, dim], vec![0.01; (ffn * dim) as usize]).expect("w1");
    let w2 = b.constant_f32("w2", &[dim, ffn], vec![0.02; (ffn * dim) as usize]).expect("w2");
    let linear = ref_graph::MatMulOptions { transpose_b: true, bias: None };
    let h = b.mat_mul_with("h", x, w1, linear).expect("h");
    let g = b.unary("g", UnaryFn::Gelu, h).expect("gelu");
    let y =
        b.mat_mul_with("y", g, w2, ref_graph::MatMulOptions { transpose_b: true, bias: None }).expect("y");
    b.output(y).expect("output");
    let graph = b.finish().expect("graph");
    let (plan, e) = expanded(&graph);
    let fused = plan.steps.iter().any(|s| matches!(s, Step::Gemv { activation: Some(UnaryFn::Gelu), .. }));
    let parts: Vec<Vec<String>> = e.parts.iter().flatten().map(|p| kinds(p)).collect();
    assert!(fused, "the planner fuses the GELU into its GEMV: {:?}", plan.steps);
    assert_eq!(parts, [vec!["gemm", "gelu"], vec!["gemm"]], "{:?}", plan.steps);
    let Some([Part::Product(p), Part::Step(Step::Unary { input, out, n, .. })]) = e.of(0) else {
        panic!("{e:?}")
    };
    assert_eq!((*input, *out, *n), (p.y, p.y, rows * ffn));
}

/// A gated GELU MLP (Gemma's `gelu_tanh(x wg^T) * (x wu^T)`) at 4 rows: the gate and up GEMV's GELU is the
/// gate's alone, after both GEMMs, in one launch with the product with the up projection.
#[test]
fn a_gated_gelu_is_the_gates_activation() {
    let (rows, dim, ffn) = (4u64, 8u64, 16u64);
    let mut b = ref_graph::GraphBuilder::new();
    let x = b.input("x", ElemType::F32, &[rows, dim]).expect("x");
    let wg = b.constant_f32("wg", &[ffn, dim], vec![0.01; (ffn * dim) as usize]).expect("wg");
    let wu = b.constant_f32("wu", &[ffn, dim], vec![0.03; (ffn * dim) as usize]).expect("wu");
    let linear = ref_graph::MatMulOptions { transpose_b: true, bias: None };
    let gate = b.mat_mul_with("gate", x, wg, linear).expect("gate");
    let up = b.mat_mul_with("up", x, wu, linear).expect("up");
    let g = b.unary("g", UnaryFn::GeluTanh, gate).expect("gelu");
    let y = b.mul("y", g, up).expect("y");
    b.output(y).expect("output");
    let graph = b.finish().expect("graph");
    let (plan, e) = expanded(&graph);
    let fused = plan
        .steps
        .iter()
        .any(|s| matches!(s, Step::Gemv { glu: Some(_), activation: Some(UnaryFn::GeluTanh), .. }));
    assert!(fused, "the planner fuses the gated GELU into the gate and up GEMV: {:?}", plan.steps);
    let parts: Vec<Vec<String>> = e.parts.iter().flatten().map(|p| kinds(p)).collect();
    assert_eq!(parts, [vec!["gemm", "gemm", "geglu"]], "{:?}", plan.steps);
    let Some([Part::Product(g), Part::Product(u), Part::Step(Step::Glu { func, gate, up, out, .. })]) =
        e.of(0)
    else {
        panic!("{e:?}")
    };
    assert_eq!((*func, *gate, *up, *out), (UnaryFn::GeluTanh, g.y, u.y, y), "the GELU of the gate's product");
}

/// Soft-capped logits (Gemma 2's `tanh(y / c) * c`) at 4 rows: the GEMV's soft-capping as its three ops,
/// in place after the GEMM.
#[test]
fn a_softcap_follows_its_product() {
    let (rows, dim, vocab) = (4u64, 8u64, 16u64);
    let mut b = ref_graph::GraphBuilder::new();
    let x = b.input("x", ElemType::F32, &[rows, dim]).expect("x");
    let w = b.constant_f32("w", &[vocab, dim], vec![0.01; (vocab * dim) as usize]).expect("w");
    let c1 = b.constant_f32("c1", &[], vec![3.0]).expect("c1");
    let c2 = b.constant_f32("c2", &[], vec![3.0]).expect("c2");
    let linear = ref_graph::MatMulOptions { transpose_b: true, bias: None };
    let y = b.mat_mul_with("y", x, w, linear).expect("y");
    let d = b.div("d", y, c1).expect("d");
    let t = b.unary("t", UnaryFn::Tanh, d).expect("t");
    let out = b.mul("out", t, c2).expect("out");
    b.output(out).expect("output");
    let graph = b.finish().expect("graph");
    let (plan, e) = expanded(&graph);
    assert!(plan.steps.iter().any(|s| matches!(s, Step::Gemv { softcap: Some(_), .. })), "{:?}", plan.steps);
    let parts: Vec<Vec<String>> = e.parts.iter().flatten().map(|p| kinds(p)).collect();
    assert_eq!(parts, [vec!["gemm", "b.div", "tanh", "b.mul"]], "{:?}", plan.steps);
    let Some([Part::Product(p), Part::Step(Step::Binary { a, b, out, .. }), ..]) = e.of(0) else {
        panic!("{e:?}")
    };
    assert_eq!((*a, *b, *out), (p.y, c1, p.y), "y / c1 in place");
}

/// A parallel residual's two sums (GPT-NeoX's `x + attn + mlp`) at 4 rows: the GEMV's residual and second
/// residual become two adds into the product, in the graph's order.
#[test]
fn both_residuals_of_a_parallel_residual_follow_their_product() {
    let (rows, dim, n) = (4u64, 8u64, 16u64);
    let mut b = ref_graph::GraphBuilder::new();
    let x = b.input("x", ElemType::F32, &[rows, dim]).expect("x");
    let attn = b.input("attn", ElemType::F32, &[rows, n]).expect("attn");
    let resid = b.input("resid", ElemType::F32, &[rows, n]).expect("resid");
    let w = b.constant_f32("w", &[n, dim], vec![0.01; (n * dim) as usize]).expect("w");
    let mlp =
        b.mat_mul_with("mlp", x, w, ref_graph::MatMulOptions { transpose_b: true, bias: None }).expect("mlp");
    let first = b.add("first", mlp, attn).expect("first");
    let second = b.add("second", first, resid).expect("second");
    b.output(second).expect("output");
    let graph = b.finish().expect("graph");
    let (plan, e) = expanded(&graph);
    let Some(Step::Gemv { mats, .. }) = plan.steps.iter().find(|s| routes(s)) else {
        panic!("{:?}", plan.steps)
    };
    assert!(mats[0].residual2.is_some(), "the planner fuses the second sum: {:?}", plan.steps);
    let Some(
        [Part::Product(p), Part::Step(Step::Add { a: a1, b: b1, out: o1, .. }), Part::Step(Step::Add { a: a2, b: b2, out: o2, n: elems })],
    ) = e.of(0)
    else {
        panic!("{e:?}")
    };
    let second = graph.find("second").expect("second");
    assert_eq!((p.y, *a1, *o1, *a2, *o2), (second, second, second, second, second));
    assert_eq!((*b1, *b2, *elems), (attn, resid, rows * n));
}
