//! The program manifest: a small TOML file naming mutable buffers, methods (ordered delegate calls) and how
//! `delegate-host run` generates tokens.
//!
//! Every error names the file and the line and column of the offending value.
//!
//! ```toml
//! format = 1
//! [buffers.k_cache_0]              # caller-owned mutable buffer, zero-initialised at load
//! dtype = "f32"
//! shape = [2, 16, 16]
//! memory = "host"                  # or "device" / "managed" (CUDA, with `device = N`, default 0) / "pinned"
//!
//! [methods.decode]
//! inputs = [{ name = "tokens", dtype = "i64", shape = [1] }, { name = "input_pos", dtype = "i64", shape = [1] }]
//! outputs = [{ name = "logits", dtype = "f32", shape = [1, 64] }]
//! [[methods.decode.calls]]
//! blob = "decode.blob"             # relative to the manifest
//! backend = "ReferenceBackend"
//! args = ["input:tokens", "input:input_pos", "buffer:k_cache_0", "buffer:k_cache_0", "output:logits"]
//!
//! [generate]                       # optional: what `run` feeds back
//! prefill = "prefill"
//! decode = "decode"
//! prompt = [1, 7, 3, 12]
//! token_input = "tokens"
//! position_input = "input_pos"
//! logits_output = "logits"
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use blob_format::model::DType;
use delegate_abi::MemoryKind;
use serde::Deserialize;
use toml::Spanned;

/// The manifest format version this build reads.
pub const FORMAT: u32 = 1;

/// A parsed, checked manifest.
#[derive(Debug, Clone)]
pub struct Manifest {
    /// Where it was read from; blob paths are relative to its directory.
    pub path: PathBuf,
    /// Mutable buffers by name, in name order.
    pub buffers: BTreeMap<String, TensorDecl>,
    /// Methods by name.
    pub methods: BTreeMap<String, Method>,
    /// How `run` drives the methods, if the program says.
    pub generate: Option<Generate>,
}

/// A declared tensor: element type, static shape, where it lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorDecl {
    /// Name (buffer, input or output).
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Static shape.
    pub shape: Vec<u64>,
    /// Memory kind (buffers only; user inputs and outputs live in host memory).
    pub memory: MemoryKind,
    /// CUDA device ordinal of a device or managed buffer (`device = N`, default 0); 0 otherwise.
    pub device: i32,
}

impl TensorDecl {
    /// Number of elements.
    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }

    /// Size in bytes.
    pub fn nbytes(&self) -> u64 {
        self.numel() * self.dtype.size_bytes() as u64
    }
}

/// One method: its user inputs and outputs and the delegate calls it makes, in order.
#[derive(Debug, Clone)]
pub struct Method {
    /// The method's name.
    pub name: String,
    /// User inputs.
    pub inputs: Vec<TensorDecl>,
    /// User outputs.
    pub outputs: Vec<TensorDecl>,
    /// Delegate calls, in execution order.
    pub calls: Vec<Call>,
}

/// One delegate call.
#[derive(Debug, Clone)]
pub struct Call {
    /// The blob file (resolved against the manifest's directory).
    pub blob: PathBuf,
    /// The backend id that must serve it.
    pub backend: String,
    /// What each delegate argument position binds to.
    pub args: Vec<ArgRef>,
    /// Where the call is declared, for messages.
    pub location: Location,
    /// Where each arg is declared, for messages.
    pub arg_locations: Vec<Location>,
}

/// What a delegate argument binds to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArgRef {
    /// A user input of the method.
    Input(String),
    /// A user output of the method.
    Output(String),
    /// A mutable buffer of the program.
    Buffer(String),
}

impl fmt::Display for ArgRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArgRef::Input(name) => write!(f, "input:{name}"),
            ArgRef::Output(name) => write!(f, "output:{name}"),
            ArgRef::Buffer(name) => write!(f, "buffer:{name}"),
        }
    }
}

/// How `run` drives a program: prefill once over the prompt, then decode steps feeding back the argmax token.
#[derive(Debug, Clone)]
pub struct Generate {
    /// The method run once over the prompt.
    pub prefill: String,
    /// The method run once per generated token.
    pub decode: String,
    /// Prompt token ids.
    pub prompt: Vec<i64>,
    /// The i64 input that takes token ids.
    pub token_input: String,
    /// The i64 `[1]` input that takes the start position.
    pub position_input: String,
    /// The f32 output holding logits, `[T, vocab]`.
    pub logits_output: String,
    /// How many positions the caches hold, when the program says: `run` refuses more steps than fit.
    pub max_positions: Option<u64>,
}

impl Generate {
    /// Decode steps that fit after the prompt, when the program says how many positions it holds.
    pub fn max_decode_steps(&self) -> Option<usize> {
        self.max_positions.map(|max| (max as usize).saturating_sub(self.prompt.len()))
    }
}

/// A line and column (1-based) in the manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Location {
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// A manifest that cannot be read or does not make sense.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The file could not be read.
    #[error("cannot read manifest {path}: {source}")]
    Io {
        /// The manifest path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid TOML of the manifest's shape, or a value is wrong.
    #[error("{path}:{location}: {message}")]
    Invalid {
        /// The manifest path.
        path: PathBuf,
        /// Where.
        location: Location,
        /// What is wrong.
        message: String,
    },
}

impl et_error::HasErrorCode for Error {
    fn error_code(&self) -> et_error::ErrorCode {
        match self {
            Error::Io { .. } => et_error::ErrorCode::AccessFailed,
            Error::Invalid { .. } => et_error::ErrorCode::InvalidProgram,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawManifest {
    format: Spanned<u32>,
    #[serde(default)]
    buffers: BTreeMap<Spanned<String>, RawBuffer>,
    methods: BTreeMap<Spanned<String>, RawMethod>,
    generate: Option<Spanned<RawGenerate>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBuffer {
    dtype: Spanned<String>,
    shape: Spanned<Vec<i64>>,
    #[serde(default)]
    memory: Option<Spanned<String>>,
    #[serde(default)]
    device: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTensor {
    name: Spanned<String>,
    dtype: Spanned<String>,
    shape: Spanned<Vec<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMethod {
    #[serde(default)]
    inputs: Vec<RawTensor>,
    #[serde(default)]
    outputs: Vec<RawTensor>,
    calls: Spanned<Vec<Spanned<RawCall>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCall {
    blob: Spanned<String>,
    backend: Spanned<String>,
    args: Vec<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGenerate {
    prefill: Spanned<String>,
    decode: Spanned<String>,
    prompt: Spanned<Vec<i64>>,
    token_input: Spanned<String>,
    position_input: Spanned<String>,
    logits_output: Spanned<String>,
    #[serde(default)]
    max_positions: Option<Spanned<u64>>,
}

/// Turns byte offsets into line/column for error messages.
struct Source<'a> {
    path: &'a Path,
    text: &'a str,
}

impl Source<'_> {
    fn location(&self, offset: usize) -> Location {
        let before = &self.text[..offset.min(self.text.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        Location { line, column }
    }

    fn error<T>(&self, span: std::ops::Range<usize>, message: impl Into<String>) -> Result<T, Error> {
        Err(Error::Invalid {
            path: self.path.to_owned(),
            location: self.location(span.start),
            message: message.into(),
        })
    }
}

impl Manifest {
    /// Reads and checks a manifest file.
    pub fn load(path: &Path) -> Result<Manifest, Error> {
        let text =
            std::fs::read_to_string(path).map_err(|source| Error::Io { path: path.to_owned(), source })?;
        Manifest::parse(path, &text)
    }

    /// Parses and checks manifest text; `path` names it in errors and anchors relative blob paths.
    pub fn parse(path: &Path, text: &str) -> Result<Manifest, Error> {
        let src = Source { path, text };
        let raw: RawManifest = toml::from_str(text).map_err(|err| Error::Invalid {
            path: path.to_owned(),
            location: err.span().map(|s| src.location(s.start)).unwrap_or_default(),
            message: err.message().trim().to_owned(),
        })?;
        if *raw.format.get_ref() != FORMAT {
            return src.error(
                raw.format.span(),
                format!(
                    "manifest format {} is not supported; this build reads format {FORMAT}",
                    raw.format.get_ref()
                ),
            );
        }
        let base = path.parent().unwrap_or(Path::new("."));

        let mut buffers = BTreeMap::new();
        for (name, buffer) in raw.buffers {
            let memory = match &buffer.memory {
                None => MemoryKind::Host,
                Some(memory) => MemoryKind::from_name(memory.get_ref()).map_or_else(
                    || {
                        src.error(
                            memory.span(),
                            format!(
                                "unknown memory kind '{}' for buffer '{}' (expected host, device, managed or pinned)",
                                memory.get_ref(),
                                name.get_ref()
                            ),
                        )
                    },
                    Ok,
                )?,
            };
            let mut decl = tensor_decl(&src, &name, &buffer.dtype, &buffer.shape, memory)?;
            if let Some(device) = &buffer.device {
                if !matches!(memory, MemoryKind::Device | MemoryKind::Managed) {
                    return src.error(
                        device.span(),
                        format!(
                            "buffer '{}' is {memory} memory; `device` applies to device and managed buffers",
                            name.get_ref()
                        ),
                    );
                }
                decl.device = match i32::try_from(*device.get_ref()) {
                    Ok(ordinal) if ordinal >= 0 => ordinal,
                    _ => {
                        return src.error(
                            device.span(),
                            format!(
                                "device {} of buffer '{}' is not a CUDA device ordinal",
                                device.get_ref(),
                                name.get_ref()
                            ),
                        )
                    }
                };
            }
            buffers.insert(name.into_inner(), decl);
        }

        let mut methods = BTreeMap::new();
        for (name, method) in raw.methods {
            let method = check_method(&src, base, &name, method, &buffers)?;
            methods.insert(name.into_inner(), method);
        }

        let generate = match raw.generate {
            None => None,
            Some(generate) => Some(check_generate(&src, generate, &methods)?),
        };
        Ok(Manifest { path: path.to_owned(), buffers, methods, generate })
    }
}

fn tensor_decl(
    src: &Source<'_>,
    name: &Spanned<String>,
    dtype: &Spanned<String>,
    shape: &Spanned<Vec<i64>>,
    memory: MemoryKind,
) -> Result<TensorDecl, Error> {
    if name.get_ref().is_empty() {
        return src.error(name.span(), "tensor name is empty");
    }
    let Some(parsed) = DType::from_name(dtype.get_ref()) else {
        return src.error(
            dtype.span(),
            format!(
                "unknown dtype '{}' for '{}' (expected one of: {})",
                dtype.get_ref(),
                name.get_ref(),
                DType::ALL.map(DType::name).join(", ")
            ),
        );
    };
    let mut dims = Vec::with_capacity(shape.get_ref().len());
    for &dim in shape.get_ref() {
        match u64::try_from(dim) {
            Ok(dim) => dims.push(dim),
            Err(_) => {
                return src.error(
                    shape.span(),
                    format!(
                        "shape of '{}' has negative extent {dim}; buffers need static shapes",
                        name.get_ref()
                    ),
                )
            }
        }
    }
    let bytes = dims
        .iter()
        .try_fold(parsed.size_bytes() as u64, |acc, &d| acc.checked_mul(d))
        .filter(|&b| usize::try_from(b).is_ok());
    if bytes.is_none() {
        return src.error(shape.span(), format!("'{}' is too large to allocate", name.get_ref()));
    }
    Ok(TensorDecl { name: name.get_ref().clone(), dtype: parsed, shape: dims, memory, device: 0 })
}

fn check_method(
    src: &Source<'_>,
    base: &Path,
    name: &Spanned<String>,
    raw: RawMethod,
    buffers: &BTreeMap<String, TensorDecl>,
) -> Result<Method, Error> {
    let mut inputs: Vec<TensorDecl> = Vec::new();
    let mut outputs: Vec<TensorDecl> = Vec::new();
    for (list, raws) in [(&mut inputs, &raw.inputs), (&mut outputs, &raw.outputs)] {
        for t in raws {
            if list.iter().any(|d| d.name == *t.name.get_ref()) {
                return src.error(
                    t.name.span(),
                    format!("method '{}' declares '{}' twice", name.get_ref(), t.name.get_ref()),
                );
            }
            list.push(tensor_decl(src, &t.name, &t.dtype, &t.shape, MemoryKind::Host)?);
        }
    }
    if raw.calls.get_ref().is_empty() {
        return src.error(raw.calls.span(), format!("method '{}' makes no delegate call", name.get_ref()));
    }
    let mut calls = Vec::new();
    for call in raw.calls.into_inner() {
        let location = src.location(call.span().start);
        let call = call.into_inner();
        if call.backend.get_ref().is_empty() {
            return src.error(call.backend.span(), "backend id is empty");
        }
        let mut args = Vec::with_capacity(call.args.len());
        let mut arg_locations = Vec::with_capacity(call.args.len());
        for arg in &call.args {
            let parsed = match arg.get_ref().split_once(':') {
                Some(("input", n)) => ArgRef::Input(n.to_owned()),
                Some(("output", n)) => ArgRef::Output(n.to_owned()),
                Some(("buffer", n)) => ArgRef::Buffer(n.to_owned()),
                _ => {
                    return src.error(
                        arg.span(),
                        format!(
                            "argument '{}' must be 'input:NAME', 'output:NAME' or 'buffer:NAME'",
                            arg.get_ref()
                        ),
                    )
                }
            };
            let known = match &parsed {
                ArgRef::Input(n) => inputs.iter().any(|d| d.name == *n),
                ArgRef::Output(n) => outputs.iter().any(|d| d.name == *n),
                ArgRef::Buffer(n) => buffers.contains_key(n),
            };
            if !known {
                let what = match &parsed {
                    ArgRef::Input(_) => format!("method '{}' declares no input", name.get_ref()),
                    ArgRef::Output(_) => format!("method '{}' declares no output", name.get_ref()),
                    ArgRef::Buffer(_) => "the program declares no buffer".to_owned(),
                };
                let n = arg.get_ref().split_once(':').map_or("", |(_, n)| n);
                return src.error(arg.span(), format!("{what} named '{n}'"));
            }
            args.push(parsed);
            arg_locations.push(src.location(arg.span().start));
        }
        calls.push(Call {
            blob: base.join(call.blob.get_ref()),
            backend: call.backend.into_inner(),
            args,
            location,
            arg_locations,
        });
    }
    Ok(Method { name: name.get_ref().clone(), inputs, outputs, calls })
}

fn check_generate(
    src: &Source<'_>,
    raw: Spanned<RawGenerate>,
    methods: &BTreeMap<String, Method>,
) -> Result<Generate, Error> {
    let g = raw.get_ref();
    let method = |m: &Spanned<String>| -> Result<&Method, Error> {
        methods.get(m.get_ref()).map_or_else(
            || {
                src.error(
                    m.span(),
                    format!("[generate] names method '{}', which the program lacks", m.get_ref()),
                )
            },
            Ok,
        )
    };
    for m in [method(&g.prefill)?, method(&g.decode)?] {
        for (field, want, dtype, list) in [
            (&g.token_input, "input", DType::I64, &m.inputs),
            (&g.position_input, "input", DType::I64, &m.inputs),
            (&g.logits_output, "output", DType::F32, &m.outputs),
        ] {
            match list.iter().find(|d| d.name == *field.get_ref()) {
                None => {
                    return src.error(
                        field.span(),
                        format!("method '{}' has no {want} named '{}'", m.name, field.get_ref()),
                    )
                }
                Some(decl) if decl.dtype != dtype => {
                    return src.error(
                        field.span(),
                        format!("'{}' of method '{}' must be {dtype}, not {}", decl.name, m.name, decl.dtype),
                    )
                }
                Some(_) => {}
            }
        }
    }
    let prefill = method(&g.prefill)?;
    let tokens = prefill.inputs.iter().find(|d| d.name == *g.token_input.get_ref());
    if tokens.map(TensorDecl::numel) != Some(g.prompt.get_ref().len() as u64) {
        return src.error(
            g.prompt.span(),
            format!(
                "prompt has {} tokens but '{}' of method '{}' takes {}",
                g.prompt.get_ref().len(),
                g.token_input.get_ref(),
                prefill.name,
                tokens.map_or(0, TensorDecl::numel)
            ),
        );
    }
    if let Some(max) = &g.max_positions {
        if (*max.get_ref() as usize) < g.prompt.get_ref().len() {
            return src.error(
                max.span(),
                format!(
                    "max_positions is {} but the prompt alone has {} tokens",
                    max.get_ref(),
                    g.prompt.get_ref().len()
                ),
            );
        }
    }
    let g = raw.into_inner();
    Ok(Generate {
        prefill: g.prefill.into_inner(),
        decode: g.decode.into_inner(),
        prompt: g.prompt.into_inner(),
        token_input: g.token_input.into_inner(),
        position_input: g.position_input.into_inner(),
        logits_output: g.logits_output.into_inner(),
        max_positions: g.max_positions.map(Spanned::into_inner),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"format = 1
[buffers.k]
dtype = "f32"
shape = [2, 4]

[methods.decode]
inputs = [{ name = "tokens", dtype = "i64", shape = [1] }, { name = "pos", dtype = "i64", shape = [1] }]
outputs = [{ name = "logits", dtype = "f32", shape = [1, 8] }]
[[methods.decode.calls]]
blob = "decode.blob"
backend = "ReferenceBackend"
args = ["input:tokens", "input:pos", "buffer:k", "buffer:k", "output:logits"]

[generate]
prefill = "decode"
decode = "decode"
prompt = [3]
token_input = "tokens"
position_input = "pos"
logits_output = "logits"
"#;

    fn parse(text: &str) -> Result<Manifest, Error> {
        Manifest::parse(Path::new("dir/program.toml"), text)
    }

    fn error(text: &str) -> String {
        match parse(text) {
            Ok(_) => panic!("expected an error"),
            Err(err) => err.to_string(),
        }
    }

    #[test]
    fn reads_a_program() {
        let m = parse(GOOD).expect("valid manifest");
        assert_eq!(m.buffers["k"].nbytes(), 32);
        assert_eq!(m.buffers["k"].memory, MemoryKind::Host);
        assert_eq!(m.buffers["k"].device, 0);
        let on_device =
            parse(&GOOD.replace("shape = [2, 4]", "shape = [2, 4]\nmemory = \"managed\"\ndevice = 3"))
                .expect("valid manifest");
        assert_eq!((on_device.buffers["k"].memory, on_device.buffers["k"].device), (MemoryKind::Managed, 3));
        let call = &m.methods["decode"].calls[0];
        assert_eq!(call.blob, Path::new("dir/decode.blob"));
        assert_eq!(call.args[2], ArgRef::Buffer("k".into()));
        assert_eq!(call.arg_locations[0], Location { line: 12, column: 9 });
        assert_eq!(m.generate.expect("generate").prompt, vec![3]);
    }

    #[test]
    fn errors_name_line_and_column() {
        let cases = [
            (GOOD.replace("format = 1", "format = 2"), "dir/program.toml:1:10: manifest format 2 is not supported; this build reads format 1"),
            (GOOD.replace("\"buffer:k\", \"output", "\"buffer:q\", \"output"), "dir/program.toml:12:50: the program declares no buffer named 'q'"),
            (GOOD.replace("\"input:pos\"", "\"pos\""), "dir/program.toml:12:25: argument 'pos' must be 'input:NAME', 'output:NAME' or 'buffer:NAME'"),
            (GOOD.replace("dtype = \"f32\"\nshape", "dtype = \"f33\"\nshape"), "dir/program.toml:3:9: unknown dtype 'f33' for 'k' (expected one of: f32, f16, bf16, f64, i8, u8, i32, i64, bool)"),
            (GOOD.replace("prompt = [3]", "prompt = [3, 4]"), "dir/program.toml:17:10: prompt has 2 tokens but 'tokens' of method 'decode' takes 1"),
            (GOOD.replace("logits_output = \"logits\"", "logits_output = \"tokens\""), "dir/program.toml:20:17: method 'decode' has no output named 'tokens'"),
            (
                GOOD.replace("prompt = [3]", "prompt = [3]\nmax_positions = 0"),
                "dir/program.toml:18:17: max_positions is 0 but the prompt alone has 1 tokens",
            ),
            (GOOD.replace("shape = [2, 4]", "shape = [2, -4]"), "dir/program.toml:4:9: shape of 'k' has negative extent -4; buffers need static shapes"),
            (GOOD.replace("shape = [2, 4]", "shape = [2, 4]\ndevice = 1"), "dir/program.toml:5:10: buffer 'k' is host memory; `device` applies to device and managed buffers"),
            (GOOD.replace("shape = [2, 4]", "shape = [2, 4]\nmemory = \"device\"\ndevice = -1"), "dir/program.toml:6:10: device -1 of buffer 'k' is not a CUDA device ordinal"),
            (GOOD.replace("blob = ", "blub = "), "dir/program.toml:10:1: unknown field `blub`, expected one of `blob`, `backend`, `args`"),
        ];
        for (text, expected) in cases {
            assert_eq!(error(&text), expected);
        }
    }
}
