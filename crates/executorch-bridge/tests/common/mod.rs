//! Test programs and expectations: the committed fixtures (`fixtures/executorch/`, written by the exporter,
//! with torch eager's tokens and logits) when they exist, and `.pte` files built here around kv-example's
//! reference blobs (with the f64 oracle's expectations) always.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use delegate_abi::host::HostConfig;
use host_runtime::plugins::{Discovery, Registry};
use kv_example::{Config, Oracle, Weights};
use pte_format::model::{DataLocation, ScalarType};
use pte_format::testing::{DelegateSpec, InstructionSpec, MethodSpec, ProgramSpec, TensorSpec, ValueSpec};

pub const BACKEND: &str = "ReferenceBackend";

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn dylib_name(stem: &str) -> String {
    format!("{}{stem}{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX)
}

/// The directory holding `libreference_delegate_dylib.so`: `$DELEGATE_TEST_PLUGIN_DIR` (set by `cargo xtask
/// test`), else built once into `target/plugin-tests`.
pub fn plugin_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = match std::env::var_os("DELEGATE_TEST_PLUGIN_DIR") {
            Some(dir) => workspace_root().join(dir),
            None => {
                let target = workspace_root().join("target/plugin-tests");
                let status = Command::new(env!("CARGO"))
                    .current_dir(workspace_root())
                    .args(["build", "--quiet", "-p", "reference-delegate-dylib", "--target-dir"])
                    .arg(&target)
                    .status()
                    .expect("cargo runs");
                assert!(status.success(), "building reference-delegate-dylib failed");
                target.join("debug")
            }
        };
        assert!(
            dir.join(dylib_name("reference_delegate_dylib")).is_file(),
            "{} has no {}: run `cargo build -p reference-delegate-dylib` (cargo xtask test does)",
            dir.display(),
            dylib_name("reference_delegate_dylib")
        );
        dir
    })
}

/// A directory holding only (a link to) `libreference_delegate_dylib.so` and its manifest (written here,
/// from the library): the shared plugin directory also holds libraries that must never be probed
/// (`crash-on-load` aborts the process that opens it).
pub fn reference_only_dir() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        let library = link_reference_dylib(dir.path());
        write_manifest(&library, false);
        dir
    })
    .path()
}

/// Links the reference dylib into `dir`; returns the link.
pub fn link_reference_dylib(dir: &Path) -> PathBuf {
    let name = dylib_name("reference_delegate_dylib");
    let library = dir.join(&name);
    std::os::unix::fs::symlink(plugin_dir().join(&name), &library).expect("link the dylib");
    library
}

/// Writes `library`'s manifest next to it, as `delegate-host plugin-manifest [--isolate] LIB` does.
pub fn write_manifest(library: &Path, isolate: bool) -> host_runtime::plugin_manifest::PluginManifest {
    let described = host_runtime::plugins::describe_library(library, &HostConfig::default())
        .unwrap_or_else(|err| panic!("{}: {err}", library.display()));
    let manifest = host_runtime::plugin_manifest::PluginManifest { isolate, ..described };
    let path = host_runtime::plugin_manifest::PluginManifest::path_for(library);
    std::fs::write(&path, manifest.to_json()).expect("write the manifest");
    manifest
}

/// Plugins from a directory holding only the reference dylib (no embedded plugin), found by its manifest:
/// `ReferenceBackend` is served in this process by the dylib loaded from disk.
pub fn dylib_registry() -> Registry {
    let dir = reference_only_dir();
    let registry = Registry::discover(Discovery::new().dirs([dir]));
    let served = registry.served(BACKEND).expect("the reference dylib serves ReferenceBackend");
    let plugin = served.in_process().expect("runs in this process");
    let path = plugin.path().expect("loaded from a file, not embedded");
    assert_eq!(
        path.file_name().and_then(|n| n.to_str()),
        Some(dylib_name("reference_delegate_dylib").as_str())
    );
    registry
}

/// One program to run and what it must produce.
#[derive(Debug, Clone)]
pub struct Case {
    pub path: PathBuf,
    /// Whether each decode step must copy nothing (planned KV outputs, or delegate-owned caches).
    pub zero_copy: bool,
    /// Bytes of every KV cache together (what a step's write-backs copy without the planning pass).
    pub cache_bytes: u64,
    pub tokens: Vec<i64>,
    /// The last logits row after prefill and after each decode step.
    pub logits: Vec<Vec<f32>>,
    pub tolerance: f32,
    /// The methods the program must have (any order).
    pub methods: Vec<String>,
}

pub const PROMPT: [i64; 4] = [1, 7, 3, 12];
pub const STEPS: usize = 12;

/// The committed fixtures (`None` when `expected.json` is missing).
pub fn fixture_cases() -> Option<Vec<Case>> {
    let dir = workspace_root().join("fixtures/executorch");
    let text = std::fs::read_to_string(dir.join("expected.json")).ok()?;
    let expected: serde_json::Value = serde_json::from_str(&text).expect("expected.json is JSON");
    let tokens: Vec<i64> = serde_json::from_value(expected["tokens"].clone()).expect("tokens");
    assert_eq!(expected["prompt"], serde_json::json!(PROMPT));
    assert_eq!(expected["steps"], serde_json::json!(STEPS));
    let npy = expected["logits"].as_str().unwrap_or("logits.npy");
    let bytes = std::fs::read(dir.join(npy)).expect("logits.npy");
    let file = npyz::NpyFile::new(&bytes[..]).expect("an .npy file");
    let shape = file.shape().to_vec();
    let flat: Vec<f32> = file.into_vec::<f32>().expect("f32 logits");
    assert_eq!(shape.len(), 2, "logits.npy is [13, vocab]");
    let logits: Vec<Vec<f32>> = flat.chunks(shape[1] as usize).map(<[f32]>::to_vec).collect();
    let cfg = Config::tiny();
    let cache_bytes = (2 * cfg.layers * cfg.cache_len() * 4) as u64;
    let programs = expected["programs"].as_object().expect("programs");
    assert!(!programs.is_empty());
    Some(
        programs
            .iter()
            .map(|(file, meta)| Case {
                path: dir.join(file),
                zero_copy: meta["planned"] == serde_json::json!(true) || meta["design"] == "owned",
                cache_bytes,
                tokens: tokens.clone(),
                logits: logits.clone(),
                tolerance: 1e-4,
                methods: serde_json::from_value(meta["methods"].clone()).expect("methods"),
            })
            .collect(),
    )
}

/// Our own programs (`buffers_{1m,2m}[_planned].pte` laid out as ExecuTorch lays out the exporter's) written
/// into `dir`, with the oracle's expectations.
pub fn own_cases(dir: &Path) -> Vec<Case> {
    let cfg = Config::tiny();
    let (tokens, logits) = oracle(&cfg);
    let cache_bytes = (2 * cfg.layers * cfg.cache_len() * 4) as u64;
    let mut cases = Vec::new();
    for (methods, planned) in [(1, false), (1, true), (2, false), (2, true)] {
        let name = format!("buffers_{methods}m{}.pte", if planned { "_planned" } else { "" });
        let path = dir.join(&name);
        std::fs::write(&path, program(&cfg, methods, planned, BACKEND)).expect("write the program");
        cases.push(Case {
            path,
            zero_copy: planned,
            cache_bytes,
            tokens: tokens.clone(),
            logits: logits.clone(),
            tolerance: kv_example::check::tolerance_for(cfg.dtype) as f32,
            methods: if methods == 1 {
                vec!["forward".into()]
            } else {
                vec!["prefill".into(), "decode".into()]
            },
        });
    }
    cases
}

/// Tokens and last logits rows of the run protocol, from kv-example's f64 oracle.
fn oracle(cfg: &Config) -> (Vec<i64>, Vec<Vec<f32>>) {
    let mut oracle = Oracle::new(cfg);
    let rows = oracle.prefill(&PROMPT).expect("oracle prefill");
    let to_f32 = |row: &[f64]| row.iter().map(|&v| v as f32).collect::<Vec<f32>>();
    let mut logits = vec![to_f32(rows.last().expect("a row"))];
    let mut tokens = vec![kv_example::argmax(logits.last().expect("a row")) as i64];
    for i in 0..STEPS {
        let row = oracle.decode(*tokens.last().expect("a token"), PROMPT.len() + i).expect("oracle decode");
        logits.push(to_f32(&row));
        tokens.push(kv_example::argmax(logits.last().expect("a row")) as i64);
    }
    (tokens, logits)
}

/// Where a program's new caches live and how they reach the buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Own storage, a `copy_` write-back per cache (ExecuTorch's `MemoryPlanningPass`).
    Separate,
    /// On the buffers' (mem_id, offset), a `copy_` self-copy per cache kept (what `KvAliasMemoryPlanningPass`
    /// exported before it removed them).
    SelfCopy,
    /// On the buffers' (mem_id, offset), no write-back (`KvAliasMemoryPlanningPass`).
    InPlace,
}

/// A KV decoder `.pte` with program-level mutable buffers, as `to_executorch` emits it: per method one
/// DelegateCall (args in the blob's binding order: tokens, input_pos, caches, new caches, logits, next token),
/// then a `copy_` write-back per cache without `planned`; `planned` puts each new cache on its buffer's
/// (mem_id, offset) and has no write-back, as the export's planning pass does.
pub fn program(cfg: &Config, methods: usize, planned: bool, backend: &str) -> Vec<u8> {
    program_with(cfg, methods, if planned { Layout::InPlace } else { Layout::Separate }, backend)
}

/// [`program`] with the caches laid out as `layout` says.
pub fn program_with(cfg: &Config, methods: usize, layout: Layout, backend: &str) -> Vec<u8> {
    program_spec(cfg, methods, layout, backend).to_bytes()
}

/// The value of [`program`]'s method whose K output is the delegate's new K cache (`k_cache_out_0`).
pub const K_NEW: usize = 4;

/// A hostile program: `buffers_1m.pte`'s design (one `forward`, KV outputs written back by `copy_`) whose
/// DelegateCall output `k_cache_out_0` (value [`K_NEW`]) is not planned memory but a constant of the program
/// (`data_buffer_idx` 1, in the constant segment, read-only when ExecuTorch maps the file): the delegate
/// would write its new K cache into the program's constant data.
pub fn kv_output_in_constant_data(cfg: &Config) -> Vec<u8> {
    let mut spec = program_spec(cfg, 1, Layout::Separate, BACKEND);
    let ValueSpec::Tensor(k_new) = &mut spec.methods[0].values[K_NEW] else { unreachable!("a tensor") };
    k_new.allocation = None;
    k_new.data_buffer_idx = 1;
    // Constant 1 at offset 0 of the constant segment (offsets[0] is reserved), as large as the tensor.
    spec.segments[0] = vec![0; cfg.cache_len() * 4];
    spec.constant_segment = Some((0, vec![0, 0]));
    spec.to_bytes()
}

/// The [`ProgramSpec`] behind [`program_with`], for tests that change one thing.
pub fn program_spec(cfg: &Config, methods: usize, layout: Layout, backend: &str) -> ProgramSpec {
    let weights = Weights::generate(cfg);
    let rows_of = |name: &str| if name == "prefill" { PROMPT.len() } else { 1 };
    let names: &[&str] = if methods == 1 { &["forward"] } else { &["prefill", "decode"] };
    let mut segments = vec![Vec::new()];
    let mut specs = Vec::new();
    for name in names {
        let rows = rows_of(name);
        let blob = kv_example::export::blob(cfg, &weights, rows, blob_backend(backend)).expect("blob");
        segments.push(blob);
        specs.push(method(cfg, name, rows, layout, backend, segments.len() - 1));
    }
    ProgramSpec {
        version: 0,
        methods: specs,
        segments,
        inline_data: Vec::new(),
        constant_segment: Some((0, vec![0])),
        named_data: Vec::new(),
    }
}

/// The blob kind for a DelegateCall naming `backend`: the CUDA delegate's header for `CudaBackend`, the
/// reference delegate's otherwise (the payload is the same reference graph).
fn blob_backend(backend: &str) -> kv_example::export::Backend {
    if backend == kv_example::export::CUDA_BACKEND {
        kv_example::export::Backend::Cuda
    } else {
        kv_example::export::Backend::Reference
    }
}

fn method(
    cfg: &Config,
    name: &str,
    rows: usize,
    layout: Layout,
    backend: &str,
    segment: usize,
) -> MethodSpec {
    use ScalarType::{Float, Long};
    assert_eq!(cfg.layers, 1, "the test program has one layer");
    let cache: Vec<i32> = cfg.cache_shape().iter().map(|&d| d as i32).collect();
    let cache_bytes = (cfg.cache_len() * 4) as u64;
    let rows = rows as i32;
    let vocab = cfg.vocab as i32;
    // mem_id 1: activations; mem_id 2: the caches, shared across methods.
    let mut at = 0u64;
    let mut place = |bytes: u64| {
        let here = at;
        at += bytes.div_ceil(64) * 64;
        here
    };
    let tokens = place(8 * rows as u64);
    let input_pos = place(8);
    let (k_new, v_new) = match layout {
        Layout::Separate => ((1, place(cache_bytes)), (1, place(cache_bytes))),
        Layout::SelfCopy | Layout::InPlace => ((2, 0), (2, cache_bytes)),
    };
    let logits = place(4 * (rows * vocab) as u64);
    let next = place(8);
    let values = vec![
        ValueSpec::Tensor(TensorSpec::planned(Long, &[rows], 1, tokens)),
        ValueSpec::Tensor(TensorSpec::planned(Long, &[1], 1, input_pos)),
        ValueSpec::Tensor(TensorSpec::planned(Float, &cache, 2, 0).named("k_cache_0")),
        ValueSpec::Tensor(TensorSpec::planned(Float, &cache, 2, cache_bytes).named("v_cache_0")),
        ValueSpec::Tensor(TensorSpec::planned(Float, &cache, k_new.0, k_new.1)),
        ValueSpec::Tensor(TensorSpec::planned(Float, &cache, v_new.0, v_new.1)),
        ValueSpec::Tensor(TensorSpec::planned(Float, &[rows, vocab], 1, logits)),
        ValueSpec::Tensor(TensorSpec::planned(Long, &[1], 1, next)),
        ValueSpec::Bool(false),
    ];
    let mut instructions =
        vec![InstructionSpec::Delegate { delegate: 0, args: vec![0, 1, 2, 3, 4, 5, 6, 7] }];
    let mut operators = vec![];
    if layout != Layout::InPlace {
        operators.push(("aten::copy_".to_owned(), String::new()));
        instructions.push(InstructionSpec::Kernel { op: 0, args: vec![2, 4, 8, 2] });
        instructions.push(InstructionSpec::Kernel { op: 0, args: vec![3, 5, 8, 3] });
    }
    MethodSpec {
        name: name.to_owned(),
        values,
        inputs: vec![0, 1],
        outputs: vec![6],
        operators,
        delegates: vec![DelegateSpec {
            id: backend.to_owned(),
            location: DataLocation::Segment,
            index: segment as u32,
            compile_specs: vec![],
        }],
        instructions,
        non_const_buffer_sizes: vec![0, at as i64, 2 * cache_bytes as i64],
    }
}
