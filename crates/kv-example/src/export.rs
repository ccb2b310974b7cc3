//! Writes the example as a program: one native blob per method and a `program.toml` manifest.
//!
//! [`reference`] writes today's program (reference backend, host memory); [`program`] writes it for a
//! [`Target`]: the backend the blobs and calls name ([`Backend::Reference`] or [`Backend::Cuda`], the same
//! reference-graph payload) and the memory every buffer and every method input and output is declared in.
//! Both methods output `logits` and `next_token` (the argmax of the last logits row, `i64 [1]`), and the
//! manifest's `[generate]` names both.

use std::path::{Path, PathBuf};

use crate::model::{self, INPUT_POS, LOGITS, NEXT_TOKEN, TOKENS};
use crate::{Config, ConfigError, Weights};
use blob_format::model::{Alias, AliasKind, Binding, DType, Dim, Header, PayloadKind, Producer, Role};
use et_error::{ErrorCode, HasErrorCode};
use program_manifest::{
    BufferSpec, CallSpec, GenerateSpec, MemoryKind, MethodSpec, ProgramSpec, TensorSpec, FORMAT,
};

/// File name of the prefill blob.
pub const PREFILL_BLOB: &str = "prefill.blob";
/// File name of the decode blob.
pub const DECODE_BLOB: &str = "decode.blob";
/// File name of the manifest.
pub const MANIFEST: &str = "program.toml";
/// Name of the prefill method.
pub const PREFILL: &str = "prefill";
/// Name of the decode method.
pub const DECODE: &str = "decode";
/// The blobs' producer name.
pub const PRODUCER: &str = "kv-example";
/// The backend id the exported blobs and calls name: the reference delegate's `BACKEND_ID` (this crate depends
/// on the graph format, not on the delegate; the delegate's tests check that the two agree).
pub const REFERENCE_BACKEND: &str = "ReferenceBackend";
/// The backend id of the CUDA delegate, which runs the same reference-graph payload on an NVIDIA GPU.
pub const CUDA_BACKEND: &str = "CudaBackend";

/// The delegate an exported program is for: the id its blob headers and manifest calls name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Backend {
    /// The CPU reference delegate ([`REFERENCE_BACKEND`]); it runs `f32` and `f16` blobs (computing in `f32`).
    #[default]
    Reference,
    /// The CUDA delegate ([`CUDA_BACKEND`]).
    Cuda,
}

impl Backend {
    /// The ExecuTorch backend id: [`REFERENCE_BACKEND`] or [`CUDA_BACKEND`].
    pub const fn id(self) -> &'static str {
        match self {
            Backend::Reference => REFERENCE_BACKEND,
            Backend::Cuda => CUDA_BACKEND,
        }
    }
}

/// What an export is for: the backend, and the memory kind of every cache buffer and every method input and
/// output (`tokens`, `input_pos`, `logits`, `next_token`).
///
/// With [`MemoryKind::Host`] the manifest leaves the inputs' and outputs' `memory` unset (host is the
/// default), exactly as [`reference`] always wrote; any other kind is written on each of them. Nothing
/// checks here that the backend accepts the kind (the reference delegate reads host, pinned and managed
/// memory; a host refuses a mismatch when it loads the program).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Target {
    /// The delegate.
    pub backend: Backend,
    /// Where buffers, inputs and outputs live.
    pub memory: MemoryKind,
}

impl Target {
    /// The reference delegate with host memory: what [`reference`] writes.
    pub const REFERENCE: Target = Target { backend: Backend::Reference, memory: MemoryKind::Host };
}

impl Default for Target {
    fn default() -> Target {
        Target::REFERENCE
    }
}

/// Why the export failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExportError {
    /// The config describes no model. `InvalidArgument`.
    #[error("invalid config: {0}")]
    Config(#[from] ConfigError),
    /// The graph could not be built (a bug in this crate). `Internal`.
    #[error("building the reference graph failed: {0}")]
    Graph(#[from] ref_graph::Error),
    /// The manifest could not be serialized (a bug in this crate). `Internal`.
    #[error("writing the manifest failed: {0}")]
    Manifest(#[from] program_manifest::Error),
    /// A file could not be written. `AccessFailed`.
    #[error("cannot write {}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

impl HasErrorCode for ExportError {
    fn error_code(&self) -> ErrorCode {
        match self {
            ExportError::Config(err) => err.error_code(),
            ExportError::Graph(_) | ExportError::Manifest(_) => ErrorCode::Internal,
            ExportError::Io { .. } => ErrorCode::AccessFailed,
        }
    }
}

/// What [`reference()`] or [`program()`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportedProgram {
    /// The `program.toml` path.
    pub manifest_path: PathBuf,
    /// The manifest it holds.
    pub manifest: ProgramSpec,
    /// The prefill blob's path.
    pub prefill_blob: PathBuf,
    /// The decode blob's path.
    pub decode_blob: PathBuf,
}

/// The blob's bindings in delegate-argument order: inputs (`tokens`, `input_pos`, then every layer's k and
/// v cache), then outputs with the cache outputs **first**, then `logits` and `next_token` last, the order
/// ExecuTorch's `arrange_graph_outputs` gives buffer mutations. The graph lists `logits` first: binding is
/// by name.
fn bindings(cfg: &Config, rows: usize) -> Vec<Binding> {
    let float = cfg.dtype.dtype();
    let dims = |shape: &[usize]| Some(shape.iter().map(|&d| Dim::Static(d as u64)).collect());
    let binding = |name: String, role: Role, dtype: DType, shape: &[usize]| Binding {
        name,
        role,
        dtype: Some(dtype),
        shape: dims(shape),
        threaded: true,
    };
    let cache = cfg.cache_shape();
    let mut out = vec![
        binding(TOKENS.to_owned(), Role::Input, DType::I64, &[rows]),
        binding(INPUT_POS.to_owned(), Role::Input, DType::I64, &[1]),
    ];
    for l in 0..cfg.layers {
        out.push(binding(model::k_cache(l), Role::Input, float, &cache));
        out.push(binding(model::v_cache(l), Role::Input, float, &cache));
    }
    for l in 0..cfg.layers {
        out.push(binding(model::k_cache_out(l), Role::Output, float, &cache));
        out.push(binding(model::v_cache_out(l), Role::Output, float, &cache));
    }
    out.push(binding(LOGITS.to_owned(), Role::Output, float, &[rows, cfg.vocab]));
    out.push(binding(NEXT_TOKEN.to_owned(), Role::Output, DType::I64, &[1]));
    out
}

/// The blob header for a method over `rows` tokens, for the reference backend.
pub fn header(cfg: &Config, rows: usize) -> Header {
    header_for(cfg, rows, Backend::Reference)
}

/// The blob header for a method over `rows` tokens, for `backend`: the same bindings and aliases, the
/// backend's id.
pub fn header_for(cfg: &Config, rows: usize, backend: Backend) -> Header {
    let aliases = (0..cfg.layers)
        .flat_map(|l| {
            [(model::k_cache_out(l), model::k_cache(l)), (model::v_cache_out(l), model::v_cache(l))]
        })
        .map(|(output, input)| Alias { output, input, kind: AliasKind::KvCacheUpdate })
        .collect();
    Header {
        producer: Some(Producer { name: PRODUCER.to_owned(), version: env!("CARGO_PKG_VERSION").to_owned() }),
        backend_id: backend.id().to_owned(),
        payload_kind: PayloadKind::ReferenceGraph,
        bindings: bindings(cfg, rows),
        aliases,
        device_id: 0,
        hardware_compatible: false,
        hardware_target: None,
        engine_library_version: Some(match backend {
            Backend::Reference => format!("reference-delegate {}", env!("CARGO_PKG_VERSION")),
            Backend::Cuda => format!(
                "ref-graph payload {}.{}",
                ref_graph::PAYLOAD_VERSION_MAJOR,
                ref_graph::PAYLOAD_MINOR_WITHOUT_STATE // the decoder keeps its caches in caller storage
            ),
        }),
        engine_metadata: None,
    }
}

/// The native blob of the method over `rows` tokens (the prompt length for prefill, 1 for decode), for the
/// reference backend.
pub fn reference_blob(cfg: &Config, weights: &Weights, rows: usize) -> Result<Vec<u8>, ExportError> {
    blob(cfg, weights, rows, Backend::Reference)
}

/// The native blob of the method over `rows` tokens for `backend` (the payload is the same graph).
pub fn blob(cfg: &Config, weights: &Weights, rows: usize, backend: Backend) -> Result<Vec<u8>, ExportError> {
    cfg.validate()?;
    let graph = model::build_graph(cfg, weights, rows)?;
    Ok(blob_format::native::to_vec(&header_for(cfg, rows, backend), &graph.encode()))
}

/// The call's `args`: one reference per threaded binding of [`header`], in the same order.
fn call_args(cfg: &Config, rows: usize) -> Vec<String> {
    bindings(cfg, rows)
        .into_iter()
        .map(|b| match (b.role, b.name.as_str()) {
            (Role::Input, TOKENS | INPUT_POS) => format!("input:{}", b.name),
            (Role::Output, LOGITS | NEXT_TOKEN) => format!("output:{}", b.name),
            // Cache outputs are the buffer-mutation output slots of their buffers.
            (_, name) => format!("buffer:{}", name.replacen("_cache_out_", "_cache_", 1)),
        })
        .collect()
}

fn method(cfg: &Config, rows: usize, blob: &str, target: &Target) -> MethodSpec {
    let memory = (target.memory != MemoryKind::Host).then(|| target.memory.name().to_owned());
    let spec = |name: &str, dtype: DType, shape: Vec<i64>| TensorSpec {
        name: name.to_owned(),
        dtype: dtype.name().to_owned(),
        shape,
        memory: memory.clone(),
        device: None,
    };
    MethodSpec {
        inputs: vec![spec(TOKENS, DType::I64, vec![rows as i64]), spec(INPUT_POS, DType::I64, vec![1])],
        outputs: vec![
            spec(LOGITS, cfg.dtype.dtype(), vec![rows as i64, cfg.vocab as i64]),
            spec(NEXT_TOKEN, DType::I64, vec![1]),
        ],
        calls: vec![CallSpec {
            blob: blob.to_owned(),
            backend: target.backend.id().to_owned(),
            args: call_args(cfg, rows),
        }],
    }
}

/// Removes the `next_token` output from every method (its declaration and its call argument) and from
/// `[generate]`: the manifest of an engine that computes the logits only (the TensorRT example, whose network
/// has no argmax). A host then takes the argmax of the logits itself.
pub fn without_next_token(manifest: &mut ProgramSpec) {
    let arg = format!("output:{NEXT_TOKEN}");
    for method in manifest.methods.values_mut() {
        method.outputs.retain(|t| t.name != NEXT_TOKEN);
        for call in &mut method.calls {
            call.args.retain(|a| *a != arg);
        }
    }
    if let Some(generate) = &mut manifest.generate {
        generate.next_token_output = None;
    }
}

/// The program manifest for the reference backend in host memory: [`manifest_for`] with
/// [`Target::REFERENCE`].
pub fn manifest(cfg: &Config) -> ProgramSpec {
    manifest_for(cfg, &Target::REFERENCE)
}

/// The program manifest: per-layer cache buffers (in `target.memory`), `prefill` and `decode` methods
/// (separate delegate instances sharing the buffers, calling `target.backend`; inputs and outputs in
/// `target.memory`), and the generate section (with `next_token_output`).
pub fn manifest_for(cfg: &Config, target: &Target) -> ProgramSpec {
    let cache = BufferSpec {
        dtype: cfg.dtype.name().to_owned(),
        shape: cfg.cache_shape().iter().map(|&d| d as i64).collect(),
        memory: target.memory.name().to_owned(),
        device: None,
    };
    let buffers = (0..cfg.layers)
        .flat_map(|l| [model::k_cache(l), model::v_cache(l)])
        .map(|name| (name, cache.clone()))
        .collect();
    let methods = [
        (PREFILL.to_owned(), method(cfg, cfg.prompt_len(), PREFILL_BLOB, target)),
        (DECODE.to_owned(), method(cfg, 1, DECODE_BLOB, target)),
    ]
    .into_iter()
    .collect();
    ProgramSpec {
        format: FORMAT,
        buffers,
        methods,
        generate: Some(GenerateSpec {
            prefill: PREFILL.to_owned(),
            decode: DECODE.to_owned(),
            prompt: cfg.prompt.clone(),
            token_input: TOKENS.to_owned(),
            position_input: INPUT_POS.to_owned(),
            logits_output: LOGITS.to_owned(),
            next_token_output: Some(NEXT_TOKEN.to_owned()),
            max_positions: Some(cfg.max_len as u64),
        }),
    }
}

/// Writes `prefill.blob`, `decode.blob` and `program.toml` for the reference backend and host memory into
/// `dir` (created if missing; existing files are replaced): [`program`] with [`Target::REFERENCE`].
pub fn reference(cfg: &Config, dir: &Path) -> Result<ExportedProgram, ExportError> {
    program(cfg, dir, &Target::REFERENCE)
}

/// Writes `prefill.blob`, `decode.blob` and `program.toml` for `target` into `dir` (created if missing;
/// existing files are replaced).
pub fn program(cfg: &Config, dir: &Path, target: &Target) -> Result<ExportedProgram, ExportError> {
    cfg.validate()?;
    let weights = Weights::generate(cfg);
    let write = |name: &str, bytes: &[u8]| -> Result<PathBuf, ExportError> {
        let path = dir.join(name);
        std::fs::write(&path, bytes).map_err(|source| ExportError::Io { path: path.clone(), source })?;
        Ok(path)
    };
    std::fs::create_dir_all(dir).map_err(|source| ExportError::Io { path: dir.to_owned(), source })?;
    let prefill_blob = write(PREFILL_BLOB, &blob(cfg, &weights, cfg.prompt_len(), target.backend)?)?;
    let decode_blob = write(DECODE_BLOB, &blob(cfg, &weights, 1, target.backend)?)?;
    let manifest = manifest_for(cfg, target);
    let manifest_path = write(MANIFEST, manifest.to_toml()?.as_bytes())?;
    Ok(ExportedProgram { manifest_path, manifest, prefill_blob, decode_blob })
}
