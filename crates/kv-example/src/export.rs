//! Writes the example as a program: one native blob per method and a `program.toml` manifest.

use std::path::{Path, PathBuf};

use crate::model::{self, INPUT_POS, LOGITS, TOKENS};
use crate::{Config, ConfigError, Weights};
use blob_format::model::{Alias, AliasKind, Binding, DType, Dim, Header, PayloadKind, Producer, Role};
use et_error::{ErrorCode, HasErrorCode};
use program_manifest::{BufferSpec, CallSpec, GenerateSpec, MethodSpec, ProgramSpec, TensorSpec, FORMAT};

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

/// What [`reference()`] wrote.
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
/// v cache), then outputs with the cache outputs **first** and `logits` last, the order ExecuTorch's
/// `arrange_graph_outputs` gives buffer mutations. The graph lists `logits` first: binding is by name.
fn bindings(cfg: &Config, rows: usize) -> Vec<Binding> {
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
        out.push(binding(model::k_cache(l), Role::Input, DType::F32, &cache));
        out.push(binding(model::v_cache(l), Role::Input, DType::F32, &cache));
    }
    for l in 0..cfg.layers {
        out.push(binding(model::k_cache_out(l), Role::Output, DType::F32, &cache));
        out.push(binding(model::v_cache_out(l), Role::Output, DType::F32, &cache));
    }
    out.push(binding(LOGITS.to_owned(), Role::Output, DType::F32, &[rows, cfg.vocab]));
    out
}

/// The blob header for a method over `rows` tokens.
pub fn header(cfg: &Config, rows: usize) -> Header {
    let aliases = (0..cfg.layers)
        .flat_map(|l| {
            [(model::k_cache_out(l), model::k_cache(l)), (model::v_cache_out(l), model::v_cache(l))]
        })
        .map(|(output, input)| Alias { output, input, kind: AliasKind::KvCacheUpdate })
        .collect();
    Header {
        producer: Some(Producer { name: PRODUCER.to_owned(), version: env!("CARGO_PKG_VERSION").to_owned() }),
        backend_id: REFERENCE_BACKEND.to_owned(),
        payload_kind: PayloadKind::ReferenceGraph,
        bindings: bindings(cfg, rows),
        aliases,
        device_id: 0,
        hardware_compatible: false,
        hardware_target: None,
        engine_library_version: Some(format!("reference-delegate {}", env!("CARGO_PKG_VERSION"))),
        engine_metadata: None,
    }
}

/// The native blob of the method over `rows` tokens (the prompt length for prefill, 1 for decode).
pub fn reference_blob(cfg: &Config, weights: &Weights, rows: usize) -> Result<Vec<u8>, ExportError> {
    cfg.validate()?;
    let graph = model::build_graph(cfg, weights, rows)?;
    Ok(blob_format::native::to_vec(&header(cfg, rows), &graph.encode()))
}

/// The call's `args`: one reference per threaded binding of [`header`], in the same order.
fn call_args(cfg: &Config, rows: usize) -> Vec<String> {
    bindings(cfg, rows)
        .into_iter()
        .map(|b| match (b.role, b.name.as_str()) {
            (Role::Input, TOKENS | INPUT_POS) => format!("input:{}", b.name),
            (Role::Output, LOGITS) => format!("output:{}", b.name),
            // Cache outputs are the buffer-mutation output slots of their buffers.
            (_, name) => format!("buffer:{}", name.replacen("_cache_out_", "_cache_", 1)),
        })
        .collect()
}

fn method(cfg: &Config, rows: usize, blob: &str) -> MethodSpec {
    let spec = |name: &str, dtype: DType, shape: Vec<i64>| TensorSpec {
        name: name.to_owned(),
        dtype: dtype.name().to_owned(),
        shape,
        memory: None,
        device: None,
    };
    MethodSpec {
        inputs: vec![spec(TOKENS, DType::I64, vec![rows as i64]), spec(INPUT_POS, DType::I64, vec![1])],
        outputs: vec![spec(LOGITS, DType::F32, vec![rows as i64, cfg.vocab as i64])],
        calls: vec![CallSpec {
            blob: blob.to_owned(),
            backend: REFERENCE_BACKEND.to_owned(),
            args: call_args(cfg, rows),
        }],
    }
}

/// The program manifest: per-layer cache buffers (host memory), `prefill` and `decode` methods (separate
/// delegate instances sharing the buffers), and the generate section.
pub fn manifest(cfg: &Config) -> ProgramSpec {
    let cache = BufferSpec {
        dtype: DType::F32.name().to_owned(),
        shape: cfg.cache_shape().iter().map(|&d| d as i64).collect(),
        memory: program_manifest::MemoryKind::Host.name().to_owned(),
        device: None,
    };
    let buffers = (0..cfg.layers)
        .flat_map(|l| [model::k_cache(l), model::v_cache(l)])
        .map(|name| (name, cache.clone()))
        .collect();
    let methods = [
        (PREFILL.to_owned(), method(cfg, cfg.prompt_len(), PREFILL_BLOB)),
        (DECODE.to_owned(), method(cfg, 1, DECODE_BLOB)),
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
            next_token_output: None,
            max_positions: Some(cfg.max_len as u64),
        }),
    }
}

/// Writes `prefill.blob`, `decode.blob` and `program.toml` for the reference backend into `dir` (created if
/// missing; existing files are replaced).
pub fn reference(cfg: &Config, dir: &Path) -> Result<ExportedProgram, ExportError> {
    cfg.validate()?;
    let weights = Weights::generate(cfg);
    let write = |name: &str, bytes: &[u8]| -> Result<PathBuf, ExportError> {
        let path = dir.join(name);
        std::fs::write(&path, bytes).map_err(|source| ExportError::Io { path: path.clone(), source })?;
        Ok(path)
    };
    std::fs::create_dir_all(dir).map_err(|source| ExportError::Io { path: dir.to_owned(), source })?;
    let prefill_blob = write(PREFILL_BLOB, &reference_blob(cfg, &weights, cfg.prompt_len())?)?;
    let decode_blob = write(DECODE_BLOB, &reference_blob(cfg, &weights, 1)?)?;
    let manifest = manifest(cfg);
    let manifest_path = write(MANIFEST, manifest.to_toml()?.as_bytes())?;
    Ok(ExportedProgram { manifest_path, manifest, prefill_blob, decode_blob })
}
