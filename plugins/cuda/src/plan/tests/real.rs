//! The committed real exports' CUDA payloads (`fixtures/executorch/real/*.cuda.pte`), read out of their
//! programs as the delegate's `init` reads them.

use ref_graph::{Graph, Op};

/// Every `*.cuda.pte` fixture's delegate graph, by file stem (`llama_bf16`), in name order.
pub(crate) fn fixtures() -> Vec<(String, Graph)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/executorch/real");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .expect("the real fixtures")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.to_string_lossy().ends_with(".cuda.pte"))
        .collect();
    paths.sort();
    assert!(paths.len() >= 19, "the real fixtures are committed: {}", dir.display());
    paths
        .iter()
        .map(|path| {
            let bytes = std::fs::read(path).expect("readable");
            let program = pte_format::Program::parse(&bytes).expect("a program");
            let calls: Vec<_> = program.methods.iter().flat_map(|m| &m.delegates).collect();
            assert_eq!(calls.len(), 1, "{}: one delegate call", path.display());
            let (_, graph) =
                ref_graph_contract::read_blob(calls[0].processed.data, calls[0].id, "the CUDA delegate")
                    .expect("a reference graph");
            let stem = path.file_name().expect("a name").to_string_lossy();
            (stem.trim_end_matches(".cuda.pte").to_owned(), graph)
        })
        .collect()
}

/// The names of an export's token ids (the embedding's indices), position (the caches' update position),
/// logits (the float output no op writes in place) and next token (the argmax).
pub(crate) struct Roles {
    pub ids: String,
    pub pos: String,
    pub logits: String,
    pub next: String,
}

impl Roles {
    pub(crate) fn of(graph: &Graph) -> Roles {
        let name = |id| graph.tensor(id).name.clone();
        let find = |f: &dyn Fn(&Op<ref_graph::TensorId>) -> Option<ref_graph::TensorId>| {
            graph.ops().iter().find_map(f).map(name).expect("the role's op")
        };
        let ids = find(&|op| if let Op::Gather { indices, .. } = *op { Some(indices) } else { None });
        let pos =
            find(&|op| if let Op::KvCacheUpdate { position, .. } = *op { Some(position) } else { None });
        let next = find(&|op| if let Op::Argmax { out, .. } = *op { Some(out) } else { None });
        let logits = graph
            .outputs()
            .iter()
            .copied()
            .find(|&o| graph.in_place_of(o).is_none() && graph.tensor(o).dtype.is_float())
            .map(name)
            .expect("a logits output");
        Roles { ids, pos, logits, next }
    }
}

/// A plan's launches in three parts: before the embedding (what depends on the position alone: RoPE's
/// tables, the caches' counters), the layers (from the embedding to the logits' product, both excluded),
/// and after; with the number of layers (attention launches).
pub(crate) struct Parts {
    pub prologue: Vec<String>,
    pub layers: Vec<String>,
    pub epilogue: Vec<String>,
    pub count: usize,
}

impl Parts {
    pub(crate) fn of(kinds: Vec<String>) -> Parts {
        let embedding =
            kinds.iter().position(|k| k.starts_with("gather") || k == "embedding").expect("an embedding");
        let logits = kinds.iter().rposition(|k| k.contains("gemv")).expect("the logits' product");
        let count = kinds.iter().filter(|k| *k == "attention").count();
        Parts {
            prologue: kinds[..embedding].to_vec(),
            layers: kinds[embedding + 1..logits].to_vec(),
            epilogue: kinds[logits..].to_vec(),
            count,
        }
    }
}

/// The chunked prefill export (transformers' recipe with a prefill method of 3 rows,
/// `fixtures/executorch/prefill`) lowers with no head permute: each layer's RoPEs, cache update and attention
/// take the chunk's rows token-major (`plan/fast/heads.rs`), where the export spells a transpose to
/// head-major before them and one back after the attention.
#[test]
fn a_chunked_prefill_export_keeps_its_heads_token_major() {
    use crate::plan::{Plan, Step};
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/executorch/prefill/llama_f32.cuda.pte");
    let bytes = std::fs::read(&path).expect("the prefill fixture");
    let program = pte_format::Program::parse(&bytes).expect("a program");
    let method = program.methods.iter().find(|m| m.name == "prefill").expect("a prefill method");
    let call = &method.delegates[0];
    let (_, graph) = ref_graph_contract::read_blob(call.processed.data, call.id, "the CUDA delegate")
        .expect("a reference graph");
    let permutes = graph.ops().iter().filter(|op| matches!(op, Op::Permute { .. })).count();
    assert!(permutes >= 4, "the export spells its head permutes: {permutes}");
    let plan = Plan::new(&graph).expect("lowered");
    // The one copy left is the last row's logits, which the argmax reads (128 values of the vocabulary).
    let copies: Vec<_> = plan.steps.iter().filter(|s| matches!(s, Step::Copy { .. })).collect();
    assert!(
        matches!(copies[..], [Step::Copy { walk, .. }] if walk.dims == [1, 128]),
        "no head permute is a copy: {copies:?}"
    );
    let mut attentions = 0;
    for step in &plan.steps {
        match step {
            Step::Attention { shape, .. } => {
                attentions += 1;
                assert_eq!((shape.rows, shape.head_major), (3, false), "{shape:?}");
            }
            Step::KvUpdate { layout, .. } => assert_eq!((layout.rows, layout.head_major), (3, false)),
            _ => {}
        }
    }
    assert_eq!(attentions, 2, "one attention a layer");
}
