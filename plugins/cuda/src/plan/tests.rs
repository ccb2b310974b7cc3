//! The plan's tests: kv-example's decoder keeps its fused fast path; the Hugging Face forms (payload 1.3)
//! lower through the general path with caches in place, GQA attention and reshapes that allocate nothing.

use super::*;
use kv_example::{model, Config, Weights};
use ref_graph::Op;

mod emulated;
mod fusions;
#[path = "../../tests/support/hf.rs"]
mod hf;
mod real;

fn kinds(plan: &Plan) -> Vec<String> {
    plan.steps.iter().map(Step::label).collect()
}

#[test]
fn decode_step_fuses_projections_residuals_and_cache_updates() {
    let cfg = Config { layers: 2, ..Config::tiny() };
    let graph = model::build_graph(&cfg, &Weights::generate(&cfg), 1).expect("graph");
    let plan = Plan::new(&graph).expect("lowered");
    let layer = ["norm+gemv3+kv_update", "attention", "gemv1+residual"];
    let mut expected: Vec<&str> = vec!["embedding"];
    expected.extend(layer);
    expected.extend(layer);
    expected.extend(["norm+gemv1"]);
    let got = kinds(&plan);
    assert_eq!(got[..expected.len()], expected[..], "{got:?}");
    // Whatever follows the logits projection reads the logits (argmax), never a cache.
    assert!(got[expected.len()..].iter().all(|k| k == "argmax"), "{got:?}");
    assert_eq!(plan.floats, [Float::F32]);
    for layer in 0..cfg.layers {
        for (out, cache) in [
            (model::k_cache_out(layer), model::k_cache(layer)),
            (model::v_cache_out(layer), model::v_cache(layer)),
        ] {
            let (out, cache) = (graph.find(&out).expect("out"), graph.find(&cache).expect("cache"));
            assert_eq!(plan.homes[out.0], Home::SameAs(cache), "{out:?} is its cache's storage");
            assert_eq!(plan.homes[cache.0], Home::Io);
        }
    }
    // The residual GEMV writes the layer's output (`x_1`), reading the previous residual (`x_0`).
    let Step::Gemv { mats, .. } = &plan.steps[3] else { panic!("{got:?}") };
    assert_eq!(graph.tensor(mats[0].y).name, "x_1");
    assert_eq!(mats[0].residual.map(|r| graph.tensor(r).name.clone()).as_deref(), Some("x_0"));
    // The QKV projection writes K and V into the caches itself, at the position, and Q nowhere else.
    let Step::Gemv { mats, cache_rows: Some(rows), .. } = &plan.steps[1] else { panic!("{got:?}") };
    let find = |name: &str| graph.find(name).expect("tensor");
    assert_eq!(
        mats.iter().map(|m| m.cache).collect::<Vec<_>>(),
        [None, Some(find(&model::k_cache(0))), Some(find(&model::v_cache(0)))]
    );
    assert_eq!(rows.position, find(model::INPUT_POS));
    assert_eq!((rows.heads, rows.len, rows.head_dim), (2, 16, 16));
    // The embedding writes `x_0` straight from both tables.
    let Step::Gather { out, plus: Some(plus), .. } = &plan.steps[0] else { panic!("{got:?}") };
    assert_eq!(graph.tensor(*out).name, "x_0");
    assert_eq!(graph.tensor(plus.table).name, "pos_emb");
    assert_eq!(graph.tensor(plus.position).name, model::INPUT_POS);
    // The product the residual GEMV replaced is never allocated or written.
    let o = graph.find("layer0.o").expect("o");
    assert!(plan
        .steps
        .iter()
        .all(|s| !matches!(s, Step::Gemv { mats, .. } if mats.iter().any(|m| m.y == o))));
}

/// Each layer's attention step, for a decode step (1 row) and a prefill (the prompt's rows): its query,
/// the layer's updated caches and the position input, and its shape (rows, heads, cache length, head
/// size, ranges per head) with the scratch it needs. The shape is the same at every
/// position: the kernel reads the position from device memory and attends to rows `0..=position + t`
/// for query row `t` (pinned on the GPU by `tests/gpu.rs`, `rows_past_the_position_are_never_read`).
#[test]
fn attention_steps_have_the_layers_shape_and_scratch() {
    // Every extent distinct (and the cache longer than one block of rows), so a swap or an off-by-one
    // in any of them shows.
    let cfg = Config { layers: 2, heads: 3, head_dim: 16, max_len: 300, ..Config::tiny() };
    let weights = Weights::generate(&cfg);
    for rows in [1, cfg.prompt.len()] {
        let graph = model::build_graph(&cfg, &weights, rows).expect("graph");
        let plan = Plan::new(&graph).expect("lowered");
        let find = |name: &str| graph.find(name).expect("tensor");
        let attention: Vec<_> = plan.steps.iter().filter(|s| matches!(s, Step::Attention { .. })).collect();
        assert_eq!(attention.len(), cfg.layers, "one attention step per layer");
        for (layer, step) in attention.into_iter().enumerate() {
            let Step::Attention { q, k, v, position, out, shape, splits, early } = *step else {
                unreachable!()
            };
            let AttnShape { rows: r, heads, kv_heads, len, head_dim, head_major, scale, softcap } = shape;
            assert_eq!((kv_heads, head_major, scale), (3, false, 0.25), "token-major, no GQA, 1/sqrt(16)");
            assert_eq!(softcap, None, "no soft-capping");
            assert_eq!(q, find(&format!("layer{layer}.q")));
            assert_eq!((k, v), (find(&model::k_cache_out(layer)), find(&model::v_cache_out(layer))));
            assert_eq!(position, find(model::INPUT_POS));
            assert_eq!(out, find(&format!("layer{layer}.attn")));
            // 640 blocks over 3 heads and the rows, at most one range per 32 cache rows (10 for 300).
            let want = (640 / (3 * rows as u32)).min(10);
            assert_eq!(
                (r, heads, len, head_dim, splits),
                (rows as u32, 3, 300, 16, want),
                "layer {layer}, {rows} rows"
            );
            assert!(early, "the caches are updated at the position, an input nothing writes");
        }
        // Partial outputs and (max, sum) pairs per (row, head, range); one merge ticket per (row, head).
        let want = (640 / (3 * rows)).min(10);
        let expected =
            AttnScratch { partials: rows * 3 * want * 16, maxima: rows * 3 * want * 2, counters: rows * 3 };
        assert_eq!(plan.attn_scratch, expected, "{rows} rows");
    }
}

#[test]
fn delegate_owned_state_is_refused_naming_the_cache() {
    let mut b = ref_graph::GraphBuilder::new();
    let pos = b.input("input_pos", ref_graph::ElemType::I64, &[1]).expect("fresh");
    let row = b.input("k", ref_graph::ElemType::F32, &[1, 2]).expect("fresh");
    let cache = b.state("k_cache", ref_graph::ElemType::F32, &[1, 4, 2]).expect("fresh");
    let k = b.kv_cache_update("k_cache_out", cache, row, pos).expect("typed");
    let q = b.input("q", ref_graph::ElemType::F32, &[1, 2]).expect("fresh");
    let attn = b.causal_attention("attn", q, k, k, pos).expect("typed");
    b.output(attn).expect("declared");
    let err = Plan::new(&b.finish().expect("valid")).expect_err("state is not held on the GPU yet");
    assert!(err.0.contains("'k_cache' is delegate-owned state"), "{}", err.0);
}

/// Attention ranges: about 640 blocks at one query row, fewer per head the more heads and rows share the
/// launch, never more ranges than 32-row pieces of the cache, and at least one.
#[test]
fn attention_splits_fill_the_gpu_without_slicing_short_caches_thin() {
    for (heads, rows, len, expected) in [
        (8, 1, 8192, 80),
        (8, 1, 1024, 32),
        (2, 1, 16, 1),
        (32, 1, 2048, 20),
        (8, 16, 8192, 5),
        (64, 16, 8192, 1),
    ] {
        assert_eq!(attention_splits(heads, rows, len), expected, "{heads} heads, {rows} rows, {len}");
    }
}

/// Every product reads its weight as `[N, K]` rows: a `[K, N]` constant through one transposed upload
/// (and as stored only when something else reads it too), a `transpose_b` weight as stored.
#[test]
fn products_read_weight_rows_and_transpose_only_what_needs_it() {
    let cfg = Config { layers: 2, ..Config::tiny() };
    let graph = model::build_graph(&cfg, &Weights::generate(&cfg), 1).expect("graph");
    let plan = Plan::new(&graph).expect("lowered");
    let names: Vec<(&str, bool)> =
        plan.transposed.iter().map(|&(w, stored)| (graph.tensor(w).name.as_str(), stored)).collect();
    let mut expected: Vec<String> = (0..cfg.layers)
        .flat_map(|l| ["wq", "wk", "wv", "wo"].map(|w| format!("layer{l}.{w}")))
        .chain(["w_out".to_owned()])
        .collect();
    expected.sort();
    let mut got: Vec<String> = names.iter().map(|(n, _)| (*n).to_owned()).collect();
    got.sort();
    assert_eq!(got, expected);
    assert!(names.iter().all(|&(_, stored)| !stored), "no weight is uploaded twice: {names:?}");

    // Hugging Face's `nn.Linear` weights are already rows: nothing is transposed.
    let hf = hf::build(&hf::Hf::tiny(ElemType::F32), 1);
    assert_eq!(Plan::new(&hf).expect("lowered").transposed, []);

    // A table both gathered and multiplied by is uploaded both ways.
    let mut b = ref_graph::GraphBuilder::new();
    let ids = b.input("ids", ElemType::I64, &[1]).expect("fresh");
    let table = b.constant_f32("table", &[4, 4], (0..16).map(|v| v as f32).collect()).expect("fresh");
    let x = b.gather("x", table, ids).expect("typed");
    let y = b.mat_mul("y", x, table).expect("typed");
    b.output(y).expect("declared");
    let graph = b.finish().expect("valid");
    let plan = Plan::new(&graph).expect("lowered");
    assert_eq!(plan.transposed, [(table, true)]);

    // A `[K, N]` product by a computed matrix is refused, naming it.
    let mut b = ref_graph::GraphBuilder::new();
    let a = b.input("a", ElemType::F32, &[1, 4]).expect("fresh");
    let m = b.input("m", ElemType::F32, &[4, 4]).expect("fresh");
    let y = b.mat_mul("y", a, m).expect("typed");
    b.output(y).expect("declared");
    let err = Plan::new(&b.finish().expect("valid")).expect_err("a computed [K, N] matrix");
    assert!(err.0.contains("mat_mul 'y' multiplies by 'm'"), "{}", err.0);
}

/// A GEMV requests its weights, norm gains and biases before the previous kernel finishes only when each
/// holds one value all call (a constant, or an input no op writes): a product by a computed `[N, K]` matrix
/// or with a computed bias waits first.
#[test]
fn products_read_weights_ahead_only_when_no_kernel_of_the_call_writes_them() {
    let early = |plan: &Plan| -> Vec<bool> {
        plan.steps
            .iter()
            .filter_map(|s| if let Step::Gemv { early, .. } = *s { Some(early) } else { None })
            .collect()
    };
    let cfg = Config { layers: 2, ..Config::tiny() };
    let example =
        Plan::new(&model::build_graph(&cfg, &Weights::generate(&cfg), 1).expect("graph")).expect("lowered");
    assert!(early(&example).iter().all(|&e| e), "constant weights are read ahead: {:?}", early(&example));
    let hf = Plan::new(&hf::build(&hf::Hf::tiny(ElemType::F32), 1)).expect("lowered");
    assert!(early(&hf).iter().all(|&e| e), "{:?}", early(&hf));

    let product = |computed_weight: bool, computed_bias: bool| {
        let mut b = ref_graph::GraphBuilder::new();
        let a = b.input("a", ElemType::F32, &[1, 4]).expect("fresh");
        let mut w = b.input("w", ElemType::F32, &[3, 4]).expect("fresh");
        if computed_weight {
            w = b.add("w2", w, w).expect("typed");
        }
        let mut bias = b.constant_f32("bias", &[3], vec![0.5; 3]).expect("fresh");
        if computed_bias {
            bias = b.add("bias2", bias, bias).expect("typed");
        }
        let options = ref_graph::MatMulOptions { transpose_b: true, bias: Some(bias) };
        let y = b.mat_mul_with("y", a, w, options).expect("typed");
        b.output(y).expect("declared");
        early(&Plan::new(&b.finish().expect("valid")).expect("lowered"))
    };
    assert_eq!(product(false, false), [true], "an input weight no op writes");
    assert_eq!(product(true, false), [false], "a weight a kernel of the call computes");
    assert_eq!(product(false, true), [false], "a bias a kernel of the call computes");
}

/// The decomposed RMSNorm of Hugging Face (f32 inside, the weight times the cast back).
const NORM: [&str; 8] = ["cast_f32", "square", "mean", "b.add", "rsqrt", "b.mul", "cast_{dtype}", "b.mul"];
/// Rotate-half RoPE over head-major q or k (two slices, neg, concat, x*cos, rot*sin, the sum): one launch.
const ROPE: [&str; 1] = ["rope"];

fn hf_expected(dtype: ElemType, layers: usize, rows: u64) -> Vec<String> {
    // Head views are no step: aliases of a decode step's one row, and a prefill's RoPE, cache update and
    // attention read (and write) its rows token-major instead of the permutes (`plan/fast/heads.rs`).
    // RoPE's tables (positions, angles, cos, sin and their casts) in one launch.
    let mut e: Vec<&str> = vec!["rope_tables", "gather"];
    for _ in 0..layers {
        e.extend(NORM);
        if rows == 1 {
            // The Q/K/V GEMV rotates Q and K and writes K and V into the caches.
            e.extend(["gemv3+bias+kv_update+rope", "attention"]);
        } else {
            e.extend(["gemv3+bias"]);
            e.extend(ROPE);
            e.extend(ROPE);
            e.extend(["kv_update2", "attention"]);
        }
        e.extend(["gemv1+residual"]);
        e.extend(NORM);
        e.extend(["gemv2+swiglu", "gemv1+residual"]);
    }
    e.extend(NORM);
    e.extend(["gemv1", "argmax"]);
    e.into_iter().map(|k| k.replace("{dtype}", dtype.name())).collect()
}

/// The Hugging Face forms lower, in every float type: one step per op of the general path where the fast
/// path does not apply, `nn.Linear` as the row-dot GEMV (Q, K and V in one launch with their biases, gate and
/// up in another that writes silu(gate) * up, the down and output projections adding the residual),
/// head-major rank-4 caches updated in place (by one K-and-V launch, or in a decode step by the Q/K/V GEMV,
/// which also applies the RoPE), GQA attention reading the caches where they are, and no step or allocation
/// for a reshape.
#[test]
fn hugging_face_forms_lower_with_caches_in_place_and_reshapes_free() {
    let capped = |dtype| hf::Hf { softcap: Some(2.0), ..hf::Hf::tiny(dtype) };
    let dtypes = [ElemType::F32, ElemType::F16, ElemType::Bf16];
    for cfg in dtypes.map(hf::Hf::tiny).into_iter().chain(dtypes.map(capped)) {
        let dtype = cfg.dtype;
        for rows in [1, 5] {
            let graph = hf::build(&cfg, rows);
            let plan = Plan::new(&graph).unwrap_or_else(|e| panic!("{dtype}, {rows} rows: {e}"));
            assert_eq!(kinds(&plan), hf_expected(dtype, cfg.layers, rows), "{dtype}, {rows} rows");
            assert_eq!(
                plan.floats,
                [Float::of(dtype).expect("float")],
                "typed steps all in the model's type"
            );
            check_hf_caches_and_attention(&graph, &plan, &cfg, rows);
            check_reshapes_are_aliases(&graph, &plan);
        }
    }
}

fn check_hf_caches_and_attention(graph: &ref_graph::Graph, plan: &Plan, cfg: &hf::Hf, rows: u64) {
    let find = |name: &str| graph.find(name).expect("tensor");
    let mut layer = 0;
    for step in &plan.steps {
        match *step {
            Step::KvUpdate { ref caches, position, layout } => {
                let names = [hf::k_cache(layer), hf::v_cache(layer)];
                assert_eq!(caches.iter().map(|c| c.0).collect::<Vec<_>>(), names.clone().map(|n| find(&n)));
                assert_eq!(position, find(hf::POS));
                // The updates read token-major (the head permutes dropped).
                let expected =
                    KvLayout { rows: rows as u32, heads: 2, len: 40, head_dim: 16, head_major: false };
                assert_eq!(layout, expected);
                for (out, cache) in [(hf::k_cache_out(layer), &names[0]), (hf::v_cache_out(layer), &names[1])]
                {
                    assert_eq!(plan.homes[find(&out).0], Home::SameAs(find(cache)), "{out} is its cache");
                }
            }
            Step::Gemv { ref mats, cache_rows: Some(at), rope, .. } => {
                // A decode step: Q and K rotated, K and V written into the layer's caches.
                let caches = [None, Some(find(&hf::k_cache(layer))), Some(find(&hf::v_cache(layer)))];
                assert_eq!(mats.iter().map(|m| m.cache).collect::<Vec<_>>(), caches);
                assert_eq!(mats.iter().map(|m| m.roped).collect::<Vec<_>>(), [true, true, false]);
                assert_eq!(rope.map(|t| t.half), Some(cfg.head_dim as u32 / 2));
                assert_eq!((at.position, at.heads, at.len, at.head_dim), (find(hf::POS), 2, 40, 16));
                for (out, cache) in [
                    (hf::k_cache_out(layer), hf::k_cache(layer)),
                    (hf::v_cache_out(layer), hf::v_cache(layer)),
                ] {
                    assert_eq!(plan.homes[find(&out).0], Home::SameAs(find(&cache)), "{out} is its cache");
                }
            }
            Step::Attention { k, v, shape, .. } => {
                assert_eq!((k, v), (find(&hf::k_cache_out(layer)), find(&hf::v_cache_out(layer))));
                let scale = 1.0 / (cfg.head_dim as f32).sqrt();
                let expected = AttnShape {
                    rows: rows as u32,
                    heads: 4,
                    kv_heads: 2,
                    len: 40,
                    head_dim: 16,
                    // A decode row's head-major views are its one row; a prefill's permutes are dropped.
                    head_major: rows == 1,
                    scale,
                    softcap: cfg.softcap,
                };
                assert_eq!(shape, expected, "GQA: 4 query heads read 2 KV heads");
                layer += 1;
            }
            _ => {}
        }
    }
    assert_eq!(layer, cfg.layers);
}

fn check_reshapes_are_aliases(graph: &ref_graph::Graph, plan: &Plan) {
    let writes: Vec<TensorId> = plan.steps.iter().flat_map(Step::writes).collect();
    let mut reshapes = 0;
    for op in graph.ops() {
        if let Op::Reshape { input, out, .. } = *op {
            reshapes += 1;
            assert_eq!(
                plan.homes[out.0],
                Home::SameAs(Home::root(&plan.homes, input)),
                "'{}' aliases its input",
                graph.tensor(out).name
            );
            assert!(!writes.contains(&out), "no step writes '{}'", graph.tensor(out).name);
        }
    }
    assert!(reshapes > 0);
    // Every scratch allocation is written by some step: nothing is allocated for an alias.
    for (index, home) in plan.homes.iter().enumerate() {
        if *home == Home::Scratch {
            assert!(
                writes.contains(&TensorId(index)),
                "'{}' is allocated but never written",
                graph.tensors()[index].name
            );
        }
    }
}

/// A broadcast over more axes than the strided kernels take is refused at `init`, naming the tensor (a
/// typed `NotSupported`, never a wrong launch); an equal-shape add of the same rank takes the fast path.
#[test]
fn broadcasts_beyond_six_axes_are_refused_naming_the_tensor() {
    let mut b = ref_graph::GraphBuilder::new();
    let x = b.input("x", ElemType::F32, &[1, 2, 1, 2, 1, 2, 3]).expect("fresh");
    let y = b.input("y", ElemType::F32, &[3]).expect("fresh");
    let same = b.add("same", x, x).expect("typed");
    let wide = b.add("wide", same, y).expect("typed");
    b.output(wide).expect("output");
    let err = Plan::new(&b.finish().expect("valid")).expect_err("rank 7 broadcast");
    assert!(err.0.contains("tensor 'wide' has rank 7"), "{}", err.0);
}

/// An assign (Hugging Face StaticCache's `cumulative_length` set to `cache_position[0]`) is one copy into the
/// caller's buffer it targets: its output is that buffer's storage, so nothing is allocated for it and
/// nothing is copied back after the call.
#[test]
fn an_assign_is_one_copy_into_the_target_buffer() {
    let mut b = ref_graph::GraphBuilder::new();
    let pos = b.input("cache_position", ElemType::I64, &[1]).expect("fresh");
    let length = b.input("cumulative_length_0", ElemType::I64, &[]).expect("fresh");
    let x = b.input("x", ElemType::F32, &[2]).expect("fresh");
    let y = b.add("y", x, x).expect("typed");
    let first = b.reshape("first", pos, &[]).expect("one element");
    let written = b.assign("cumulative_length_0_out", length, first).expect("typed");
    b.output(y).expect("output");
    b.output(written).expect("output");
    let graph = b.finish().expect("valid");
    let plan = Plan::new(&graph).expect("lowered");
    assert_eq!(kinds(&plan), ["add", "copy"]);
    assert_eq!(plan.homes[written.0], Home::SameAs(length), "the output is the buffer");
    assert_eq!(plan.homes[first.0], Home::SameAs(pos), "the reshape allocates nothing");
    let Step::Copy { src, dst, elem: 8, ref walk, src_off: 0, dst_off: 0 } = plan.steps[1] else {
        panic!("{:?}", plan.steps[1])
    };
    assert_eq!((src, dst, walk.dims.as_slice()), (first, written, &[1][..]));
    let mut emu = emulate::Emulator::new(&graph, plan);
    emu.set("cache_position", &[6.0]);
    emu.set("cumulative_length_0", &[-1.0]);
    emu.set("x", &[1.0, 2.0]);
    emu.run().expect("runs");
    assert_eq!(emu.read("cumulative_length_0"), [6.0]);
    assert_eq!(emu.read("y"), [2.0, 4.0]);
}

/// An attention reads cache rows ahead of the previous kernel only when the plan proves no kernel of the
/// call writes them: caches updated only at the position (validation makes every attention's caches
/// `kv_cache_update` outputs), and a position that is an input nothing writes (validation lets no op read an
/// assign's target or output). A position the call computes makes it wait first.
#[test]
fn attention_reads_ahead_only_what_no_kernel_of_the_call_writes() {
    let early = |computed_position: bool| {
        let mut b = ref_graph::GraphBuilder::new();
        let mut pos = b.input("pos", ElemType::I64, &[1]).expect("fresh");
        if computed_position {
            let offset = b.input("offset", ElemType::I64, &[1]).expect("fresh");
            pos = b.add("shifted", pos, offset).expect("typed");
        }
        let q = b.input("q", ElemType::F32, &[1, 8]).expect("fresh");
        let row = b.input("row", ElemType::F32, &[1, 8]).expect("fresh");
        let k = b.input("k_cache", ElemType::F32, &[2, 16, 4]).expect("fresh");
        let v = b.input("v_cache", ElemType::F32, &[2, 16, 4]).expect("fresh");
        let k = b.kv_cache_update("k_out", k, row, pos).expect("typed");
        let v = b.kv_cache_update("v_out", v, row, pos).expect("typed");
        let attn = b.causal_attention("attn", q, k, v, pos).expect("typed");
        for out in [attn, k, v] {
            b.output(out).expect("declared");
        }
        let plan = Plan::new(&b.finish().expect("valid")).expect("lowered");
        plan.steps
            .iter()
            .find_map(|s| if let Step::Attention { early, .. } = *s { Some(early) } else { None })
    };
    assert_eq!(early(false), Some(true));
    assert_eq!(early(true), Some(false), "a position a kernel of the call writes");
}

/// Launches per decode step of every committed real export: each Llama-family decoder (Llama, Qwen2, the
/// eager-attention form, the hand-written decoder; f32, f16, bf16), StableLM (a partial rotary), GPT-NeoX
/// and Phi (a partial rotary and a parallel block; f32 and half, whose LayerNorm is spelled in f32 between
/// casts), Falcon (a parallel block, bias adds, a head-interleaved Q/K/V product), StarCoder2 and GPT-2
/// (LayerNorm with a bias, biased products, GELU; GPT-2's Q/K/V cut from one product) runs each layer in
/// five fused launches, with nothing of a layer on the general path; what depends on the position alone
/// runs once before the first layer. Gemma 2's layers (in the layers the report names) keep the counts in
/// the table: a lost fusion fails here.
#[test]
fn real_exports_reach_the_fused_launches() {
    let llama_layer = |bias: &str| {
        vec![
            format!("norm+gemv3{bias}+kv_update+rope"),
            "attention".into(),
            "gemv1+residual".into(),
            "norm+gemv2+swiglu".into(),
            "gemv1+residual".into(),
        ]
    };
    // LayerNorm (its bias too) inside the next GEMV, biases and GELU in the GEMVs' epilogues; GPT-2's one
    // Q/K/V product, cut by slices, three matrices of one launch (no RoPE: learned positions).
    let layernorm_layer = |rope: &str| {
        vec![
            format!("norm+gemv3+bias+kv_update{rope}"),
            "attention".into(),
            "gemv1+bias+residual".into(),
            "norm+gemv1+bias+gelu".into(),
            "gemv1+bias+residual".into(),
        ]
    };
    // (fixture, launches of each layer) of the family whose layers still run ops on the general path:
    // Gemma 2's (its norms, spelled in f32 ops, are read as norms and its gated GELU is the gate and up
    // GEMV's epilogue; each post-norm runs alone, adding its residual: seven launches a layer, the report
    // counting the last layer's final post-norm after the layers).
    let others = [("gemma2_f16", [7, 6]), ("gemma2_f32", [7, 6])];
    for (name, graph) in real::fixtures() {
        let plan = Plan::new(&graph).expect("lowered");
        let all = kinds(&plan);
        let parts = real::Parts::of(all.clone());
        assert_eq!(parts.count, 2, "{name}: the fixtures have two layers: {all:?}");
        if let Some(&(_, launches)) = others.iter().find(|(n, _)| *n == name) {
            let report = crate::report::PlanReport::of_graph(&graph).expect("a report");
            let layer = |i| report.launches.iter().filter(|l| l.layer == Some(i)).count();
            assert_eq!([layer(0), layer(1)], launches, "{name}: {all:?}");
            // The embedding scaled in its gather, once before the first layer.
            assert_eq!(parts.prologue, ["rope_tables", "counters2"], "{name}: {all:?}");
            assert_eq!(all[2], "gather+scale", "{name}: {all:?}");
            // The final-logit soft-capping in the logits' GEMV.
            assert_eq!(parts.epilogue, ["norm+gemv1+softcap", "argmax"], "{name}: {all:?}");
            continue;
        }
        let layers: Vec<String> = if name.starts_with("starcoder2") {
            (0..parts.count).flat_map(|_| layernorm_layer("+rope")).collect()
        } else if name.starts_with("gpt2") {
            (0..parts.count).flat_map(|_| layernorm_layer("")).collect()
        } else if name.starts_with("neox") {
            // A parallel residual: attention and MLP read the one residual stream, and the MLP's down
            // projection adds both the attention's output and the stream (`x + attn + mlp`, in that order).
            let layer = [
                "norm+gemv3+bias+kv_update+rope",
                "attention",
                "gemv1+bias",
                "norm+gemv1+bias+gelu",
                "gemv1+bias+residual+residual",
            ];
            (0..parts.count).flat_map(|_| layer.map(str::to_owned)).collect()
        } else if name.starts_with("phi") || name.starts_with("falcon") {
            // Phi's and Falcon's parallel block: one LayerNorm inside both the Q/K/V GEMV (which writes the
            // caches) and the MLP's up projection (with its GELU), before the attention. Falcon's biases are
            // adds after bias-less products, its Q/K/V slices of one head-interleaved product.
            let layer = [
                "norm+gemv3+bias+kv_update+rope",
                "norm+gemv1+bias+gelu",
                "attention",
                "gemv1+bias",
                "gemv1+bias+residual+residual",
            ];
            (0..parts.count).flat_map(|_| layer.map(str::to_owned)).collect()
        } else {
            // StableLM: biased Q/K/V with a partial rotary, stored rotated in the heads' first columns.
            let bias = if name.starts_with("qwen2") || name.starts_with("stablelm") { "+bias" } else { "" };
            (0..parts.count).flat_map(|_| llama_layer(bias)).collect()
        };
        assert_eq!(parts.layers, layers, "{name}: {all:?}");
        let head = if name.starts_with("phi") { "norm+gemv1+bias" } else { "norm+gemv1" };
        assert_eq!(parts.epilogue, [head, "argmax"], "{name}");
        // Before the first layer: RoPE's tables (positions, angles, cos and sin in the model's type) in one
        // launch, and the StaticCache's counters (one a layer) in one more; nothing else.
        let want = match name.as_str() {
            "hand_f32" => vec!["rope_tables"],
            "gpt2_f32" => vec!["counters2"],
            _ => vec!["rope_tables", "counters2"],
        };
        assert_eq!(parts.prologue, want, "{name}: {all:?}");
    }
}

/// A StaticCache's counters, one a layer (each `cumulative_length = position + 1`, assigned back), run eight
/// to a launch, each computed straight into its buffer (no copy); the emulated plan gives every counter its
/// value.
#[test]
fn counters_run_eight_to_a_launch_into_their_buffers() {
    let mut g = ref_graph::GraphBuilder::new();
    let pos = g.input("cache_position", ElemType::I64, &[1]).expect("input");
    let scalar = g.reshape("position", pos, &[]).expect("reshape");
    for layer in 0..10 {
        let counter = g.input(&format!("counter_{layer}"), ElemType::I64, &[]).expect("counter");
        let one = g.constant_i64(&format!("one_{layer}"), &[], vec![1 + layer]).expect("constant");
        let sum = g.add(&format!("sum_{layer}"), scalar, one).expect("add");
        let out = g.assign(&format!("counter_out_{layer}"), counter, sum).expect("assign");
        g.output(out).expect("output");
    }
    let graph = g.finish().expect("graph");
    let plan = Plan::new(&graph).expect("lowered");
    assert_eq!(kinds(&plan), ["counters8", "counters2"]);
    let mut emu = emulate::Emulator::new(&graph, plan);
    emu.set("cache_position", &[41.0]);
    emu.run().expect("runs");
    for layer in 0..10 {
        assert_eq!(emu.read(&format!("counter_{layer}")), [42.0 + layer as f64], "layer {layer}");
    }
}
