//! The hollow exported graphs of `fixtures/bench/` (issue 45 item 3), on the CPU: each reads and holds every
//! layer of its model as transformers' recipe exports it; the 26 M-parameter one, filled from a seed, is a
//! valid graph that delegate-pack packs, the CUDA delegate's planner takes (its `init` fails only for want of a
//! GPU) and the reference delegate runs to finite logits; and a damaged file is refused by name.

use std::path::{Path, PathBuf};

use delegate_abi::host::{ArgList, Plugin, Slot};
use delegate_abi::{DTypeCode, InitContext, MemoryKind};
use et_error::{ErrorCode, HasErrorCode};
use ref_graph::{Data, ElemType, Graph, TensorId};

#[allow(dead_code)] // the bench reads more of a hollow graph than the tests do
#[path = "../benches/support/hollow.rs"]
mod hollow;
#[path = "../benches/support/traffic.rs"]
mod traffic;

use hollow::{Error, Hollow};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/bench").join(name)
}

/// What a committed graph holds.
struct Expected {
    file: &'static str,
    /// The transformers class exported.
    model: &'static str,
    layers: u64,
    dim: u64,
    heads: u64,
    kv_heads: u64,
    vocab: u64,
    /// Q/K/V biases (Qwen2).
    bias: bool,
}

const GRAPHS: [Expected; 3] = [
    Expected {
        file: "llama-1b.rgd",
        model: "LlamaForCausalLM",
        layers: 16,
        dim: 2048,
        heads: 32,
        kv_heads: 8,
        vocab: 128_256,
        bias: false,
    },
    Expected {
        file: "qwen2.5-0.5b.rgd",
        model: "Qwen2ForCausalLM",
        layers: 24,
        dim: 896,
        heads: 14,
        kv_heads: 2,
        vocab: 151_936,
        bias: true,
    },
    Expected {
        file: "tiny-26m.rgd",
        model: "LlamaForCausalLM",
        layers: 8,
        dim: 512,
        heads: 8,
        kv_heads: 2,
        vocab: 4096,
        bias: false,
    },
];

#[test]
fn every_committed_graph_reads_and_holds_every_layer() {
    for Expected { file, model, layers, dim, heads, kv_heads, vocab, bias } in GRAPHS {
        let hollow = Hollow::read(&fixture(file)).unwrap_or_else(|e| panic!("{e}"));
        let (m, s) = (hollow.shape.model.as_str(), &hollow.shape.sizes);
        assert_eq!(
            (m, s.layers, s.dim, s.heads, s.kv_heads, s.head_dim, s.vocab, s.bias, s.tied),
            (model, layers, dim, heads, kv_heads, 64, vocab, bias, true),
            "{file}"
        );
        assert_eq!((s.dtype.as_str(), s.max_len), ("bf16", 2048), "{file}");
        let count = |op: &str| hollow.op_counts.get(op).copied().unwrap_or(0) as u64;
        // Per layer: K and V cache updates, one attention, Q/K/V/O and gate/up/down products, two norms
        // (each fused into one `rms_norm` by the lowering); then the final norm and the tied logits product.
        assert_eq!(count("kv_cache_update"), 2 * layers, "{file}");
        assert_eq!(count("causal_attention"), layers, "{file}");
        assert_eq!(count("mat_mul"), 7 * layers + 1, "{file}");
        assert_eq!(count("rms_norm"), 2 * layers + 1, "{file}");
        assert_eq!((count("gather"), count("argmax")), (1, 1), "{file}");
        // Filled: the embedding and the seven matrices of each layer; everything else keeps its exported bytes.
        assert_eq!(hollow.kept_and_filled().1 as u64, 7 * layers + 1, "{file}");
    }
}

/// The values of constant `name` as f32.
fn values(graph: &Graph, name: &str) -> Vec<f32> {
    let id = graph.find(name).unwrap_or_else(|| panic!("no tensor {name}"));
    match graph.constant(id).unwrap_or_else(|| panic!("{name} is not a constant")) {
        Data::Bf16(v) => v.iter().map(|x| x.to_f32()).collect(),
        Data::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
        Data::F32(v) => v.clone(),
        Data::I64(v) => v.iter().map(|&x| x as f32).collect(),
    }
}

#[test]
fn the_26m_graph_fills_packs_plans_and_runs_to_finite_logits() {
    let hollow = Hollow::read(&fixture("tiny-26m.rgd")).unwrap_or_else(|e| panic!("{e}"));
    let graph = hollow.fill(45).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(graph.ops().len(), hollow.op_counts.values().sum::<usize>());

    // The fill's rule: matrices from normal(0, 0.02), the same for the same seed; norm weights as exported.
    let q = values(&graph, "inner.model.model.layers.3.self_attn.q_proj.weight");
    let mean = q.iter().sum::<f32>() / q.len() as f32;
    let std = (q.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / q.len() as f32).sqrt();
    assert!(mean.abs() < 1e-3 && (std - 0.02).abs() < 1e-3, "mean {mean}, std {std}");
    assert!(values(&graph, "inner.model.model.layers.3.input_layernorm.weight").iter().all(|&w| w == 1.0));

    // The bytes a step at 1024 reads: every weight once (the tied table is the logits' weight too) and 1025
    // rows of each of the 16 caches of [1, 2, 2048, 64] bf16.
    let weights: u64 = graph.constants().map(|(id, _)| graph.tensor(id).nbytes() as u64).sum();
    assert_eq!(traffic::bytes_per_step(&graph, 1024), weights + 16 * 2 * 1025 * 64 * 2);

    // Packed as every exporter packs it, and planned by the CUDA delegate: without a GPU, `init` gets as far as
    // opening the device.
    let blob = delegate_pack::pack_graph(&graph, cuda_delegate::BACKEND_ID).unwrap_or_else(|e| panic!("{e}"));
    let cuda = Plugin::embedded(cuda_delegate::delegate_root()).expect("the CUDA plugin");
    if let Err(err) = cuda.init(&InitContext { blob: &blob, compile_specs: &[], runtime_specs: &[] }) {
        assert!(err.to_string().contains("opening CUDA device"), "the plan refuses the graph: {err}");
    }

    let (logits, next) = reference_step(&graph, 5);
    assert!(logits.iter().all(|x| x.is_finite() && x.abs() < 10.0), "logits {:?}", &logits[..8]);
    assert!(logits.iter().any(|&x| x != 0.0), "all logits are zero");
    assert!((0..4096).contains(&next), "next token {next}");
}

/// One call of `graph` on the reference delegate at `position` (token 1, caches and counters zero, positions
/// `position`): the logits as f32 and the next token.
fn reference_step(graph: &Graph, position: i64) -> (Vec<f32>, i64) {
    let blob = delegate_pack::pack_graph(graph, reference_delegate::BACKEND_ID).expect("packs");
    let plugin = Plugin::embedded(reference_delegate::delegate_root()).expect("the reference plugin");
    let mut instance =
        plugin.init(&InitContext { blob: &blob, compile_specs: &[], runtime_specs: &[] }).expect("init");
    let targets: Vec<TensorId> = graph.in_place_pairs().map(|(_, input)| input).collect();
    let bytes = |id: TensorId| vec![0u8; graph.tensor(id).nbytes()];
    let mut inputs: Vec<Vec<u8>> = graph.inputs().iter().map(|&id| bytes(id)).collect();
    let mut outputs: Vec<Vec<u8>> = graph.outputs().iter().map(|&id| bytes(id)).collect();
    for (&id, memory) in graph.inputs().iter().zip(&mut inputs) {
        let decl = graph.tensor(id);
        if decl.dtype == ElemType::I64 && !targets.contains(&id) {
            let value = if decl.shape.len() == 2 { 1i64 } else { position };
            memory.copy_from_slice(bytemuck::cast_slice(&vec![value; decl.numel()]));
        }
    }
    let typed = |id: TensorId| {
        let decl = graph.tensor(id);
        let code = DTypeCode::try_from(decl.dtype.dtype()).expect("a dtype of the ABI");
        (code, decl.shape.iter().map(|&d| d as i64).collect::<Vec<i64>>())
    };
    {
        let mut list = ArgList::new();
        let mut slots: Vec<(TensorId, Slot)> = Vec::new();
        for (&id, memory) in graph.inputs().iter().zip(&mut inputs) {
            let (code, shape) = typed(id);
            if targets.contains(&id) {
                slots.push((id, list.push_inout(memory, code, &shape, MemoryKind::Host).expect("in-out")));
            } else {
                list.push_input(memory, code, &shape, MemoryKind::Host).expect("input");
            }
        }
        for (&id, memory) in graph.outputs().iter().zip(&mut outputs) {
            let (code, shape) = typed(id);
            match graph.in_place_of(id) {
                Some(input) => {
                    let at = slots.iter().position(|(i, _)| *i == input).expect("its input's slot");
                    list.push_output_in_place(slots.remove(at).1, code, &shape).expect("in place");
                }
                None => list.push_output(memory, code, &shape, MemoryKind::Host).expect("output"),
            }
        }
        instance.execute(&mut list, None).expect("the reference delegate runs the filled graph");
    }
    let output =
        |name: &str| graph.outputs().iter().position(|&id| graph.tensor(id).name == name).expect(name);
    let logits = &outputs[output("logits")];
    let logits =
        bytemuck::cast_slice::<u8, u16>(logits).iter().map(|&b| ref_graph::half::bf16::from_bits(b).to_f32());
    let next: i64 = bytemuck::pod_read_unaligned(&outputs[output("next_token")]);
    (logits.collect(), next)
}

/// The 26 M graph's file with `edit` applied, parsed.
fn edited(edit: impl FnOnce(&mut serde_json::Value)) -> Result<Hollow, Error> {
    let path = fixture("tiny-26m.rgd");
    let mut value: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("json");
    edit(&mut value);
    Hollow::parse(&serde_json::to_vec(&value).expect("json"), &path)
}

fn refused(result: Result<Hollow, Error>) -> Error {
    match result {
        Ok(_) => panic!("a damaged hollow graph is read"),
        Err(err) => err,
    }
}

#[test]
fn a_damaged_file_is_refused_naming_the_file_and_what() {
    let err = refused(edited(|v| v["format"] = "kv-delegate hollow graph 2".into()));
    assert!(matches!(err, Error::Format { .. }), "{err}");
    assert!(err.to_string().contains("tiny-26m.rgd") && err.to_string().contains("graph 2"), "{err}");

    let err = refused(edited(|v| v["description"]["constants"][0]["nbytes"] = 12.into()));
    assert!(
        matches!(err, Error::Constant { ref name, .. } if name == "inner.model.model.embed_tokens.weight")
    );
    assert!(err.to_string().contains("12 bytes"), "{err}");

    let err =
        refused(edited(|v| v["kept"]["inner.model.model.layers.0.input_layernorm.weight"] = "0g".into()));
    assert!(err.to_string().contains("not hex"), "{err}");
    let err =
        refused(edited(|v| v["kept"]["inner.model.model.layers.0.input_layernorm.weight"] = "00".into()));
    assert!(err.to_string().contains("1 kept bytes"), "{err}");
    let err = refused(edited(|v| v["kept"]["no_such_constant"] = "00".into()));
    assert!(matches!(err, Error::Constant { ref name, .. } if name == "no_such_constant"), "{err}");

    let err = refused(edited(|v| v["description"]["constants"][1]["offset"] = 8.into()));
    assert!(err.to_string().contains("overlaps"), "{err}");

    let err = refused(Hollow::parse(b"RGRF", &fixture("x.rgd")));
    assert!(matches!(err, Error::Json { .. }), "{err}");
    assert_eq!(err.error_code(), ErrorCode::InvalidProgram);
    let err = refused(Hollow::read(&fixture("missing.rgd")));
    assert!(err.to_string().contains("missing.rgd"), "{err}");
}
