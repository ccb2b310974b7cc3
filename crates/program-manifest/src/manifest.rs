//! [`Manifest`]: a manifest read and checked. Names resolve, dtypes and memory kinds are parsed, blob paths
//! are resolved against the manifest's directory, and every error names the line and column of the value at
//! fault.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use blob_format::model::DType;
use toml::de::{DeTable, DeValue};
use toml::Spanned;

use crate::file::open_regular;
use crate::spec::{CallSpec, GenerateSpec, MethodSpec, ProgramSpec, TensorSpec};
use crate::{BlobSource, Error, Location, MemoryKind, FORMAT};

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
    /// Memory kind (`memory = "..."`, default host).
    pub memory: MemoryKind,
    /// CUDA device ordinal of a device or managed tensor (`device = N`, default 0); 0 otherwise.
    pub device: i32,
}

impl TensorDecl {
    /// A host tensor's declaration, its size checked: the one way every reader (the TOML manifest, a `.pte`
    /// program mapped onto a manifest) builds one, so a shape whose size in bytes overflows is refused where
    /// it is read, naming the tensor, and never reaches an allocation.
    ///
    /// # Errors
    /// [`TooLarge`] when `dtype` × `shape` bytes overflow 64 bits or this host's address space.
    pub fn new(
        name: &str,
        dtype: DType,
        shape: Vec<u64>,
        memory: MemoryKind,
    ) -> Result<TensorDecl, TooLarge> {
        if checked_nbytes(dtype, &shape).is_none() {
            return Err(TooLarge { name: name.to_owned(), dtype, shape });
        }
        Ok(TensorDecl { name: name.to_owned(), dtype, shape, memory, device: 0 })
    }

    /// Number of elements; `u64::MAX` for a declaration built by hand whose product overflows
    /// ([`TensorDecl::new`] and the readers refuse those).
    pub fn numel(&self) -> u64 {
        self.shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d)).unwrap_or(u64::MAX)
    }

    /// Size in bytes; `u64::MAX`, which no allocation satisfies, for a declaration built by hand whose size
    /// overflows ([`TensorDecl::new`] and the readers refuse those).
    pub fn nbytes(&self) -> u64 {
        checked_nbytes(self.dtype, &self.shape).unwrap_or(u64::MAX)
    }
}

/// The size in bytes of a `dtype` tensor of `shape`, when it fits in 64 bits and in this host's address
/// space (`usize`): the one checked product behind [`TensorDecl::new`], [`TensorDecl::nbytes`] and the
/// manifest reader.
pub fn checked_nbytes(dtype: DType, shape: &[u64]) -> Option<u64> {
    shape
        .iter()
        .try_fold(dtype.size_bytes() as u64, |acc, &d| acc.checked_mul(d))
        .filter(|&bytes| usize::try_from(bytes).is_ok())
}

/// A tensor whose size in bytes overflows 64 bits or this host's address space ([`TensorDecl::new`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{name}' ({dtype} {shape:?}) is too large to allocate: its size in bytes overflows")]
pub struct TooLarge {
    /// The tensor's name.
    pub name: String,
    /// Its element type.
    pub dtype: DType,
    /// Its shape.
    pub shape: Vec<u64>,
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
    /// Where its blob is: a file (a manifest's call) or a payload inside a program file (a `.pte`'s call).
    pub blob: BlobSource,
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

/// Where a program's blob paths may point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BlobPaths {
    /// Relative paths inside the manifest's directory only (the default): a program cannot make a host read
    /// files elsewhere.
    #[default]
    WithinProgram,
    /// Absolute paths and paths through `..` too, for a host told to allow them.
    Anywhere,
}

/// How `run` drives a program: prefill once over the prompt, then decode steps feeding back the argmax token.
/// The `[generate]` section as written, once checked (its methods, inputs and outputs exist with the right
/// types, and the prompt fits `max_positions`): the same data, so the same type.
pub type Generate = GenerateSpec;

/// One step of a path into the TOML document: a key of a table or an index into an array.
#[derive(Clone, Copy)]
enum Seg<'p> {
    Key(&'p str),
    Index(usize),
}

/// The manifest's text with the spans of its values, to say where a checked value is written.
struct Source<'a> {
    path: &'a Path,
    text: &'a str,
    root: DeTable<'a>,
}

impl<'a> Source<'a> {
    fn new(path: &'a Path, text: &'a str) -> Result<Source<'a>, Error> {
        let root = DeTable::parse(text).map_err(|err| Error::Invalid {
            path: path.to_owned(),
            location: err.span().map(|s| Location::of_offset(text, s.start)).unwrap_or_default(),
            message: err.message().trim().to_owned(),
        })?;
        Ok(Source { path, text, root: root.into_inner() })
    }

    fn at(&self, offset: usize) -> Location {
        Location::of_offset(self.text, offset)
    }

    fn find(&self, path: &[Seg<'_>]) -> Option<&Spanned<DeValue<'a>>> {
        let (Seg::Key(first), rest) = path.split_first()? else { return None };
        let mut value = self.root.get(*first)?;
        for seg in rest {
            value = match *seg {
                Seg::Key(key) => value.get_ref().get(key)?,
                Seg::Index(index) => value.get_ref().get(index)?,
            };
        }
        Some(value)
    }

    /// Where the value at `path` starts; the unknown location (0:0) if the document has no such value, which
    /// cannot happen for a path taken from the [`ProgramSpec`] deserialized from the same text.
    fn value(&self, path: &[Seg<'_>]) -> Location {
        self.find(path).map_or_else(Location::default, |v| self.at(v.span().start))
    }

    /// Where key `key` of the table at `table` is written.
    fn key(&self, table: &[Seg<'_>], key: &str) -> Location {
        let entries = if table.is_empty() {
            Some(&self.root)
        } else {
            self.find(table).and_then(|v| v.get_ref().as_table())
        };
        entries
            .and_then(|t| t.get_key_value(key))
            .map_or_else(Location::default, |(k, _)| self.at(k.span().start))
    }

    fn error<T>(&self, location: Location, message: impl Into<String>) -> Result<T, Error> {
        Err(Error::Invalid { path: self.path.to_owned(), location, message: message.into() })
    }
}

/// The largest manifest [`Manifest::load`] reads (1 MiB: a manifest names blobs, it does not hold them).
pub const MAX_MANIFEST_BYTES: u64 = 1 << 20;

impl Manifest {
    /// How many positions the caches hold as the buffers' shapes tell, for a program whose `[generate]` names
    /// no `max_positions` (the crate docs' rule): the second to last dimension (`[heads, positions,
    /// head_dim]`, ExecuTorch's and transformers' `[batch, heads, positions, head_dim]`) when every buffer of
    /// two or more dimensions has the same one. `None` when no buffer has two dimensions or they disagree:
    /// the shapes then do not say which axis is the sequence.
    pub fn positions_from_buffers(&self) -> Option<u64> {
        let mut rows = self.buffers.values().filter_map(|b| b.shape.iter().rev().nth(1).copied());
        let first = rows.next()?;
        rows.all(|r| r == first).then_some(first)
    }

    /// Reads and checks a manifest file.
    ///
    /// Only a regular file of at most [`MAX_MANIFEST_BYTES`] is read. The file is opened once, non-blocking,
    /// and its type checked through the open descriptor: a FIFO or device is refused before a byte is read
    /// (reading one could block or never end), even one swapped in for the file meanwhile, and a larger file
    /// is refused without reading it all.
    pub fn load(path: &Path) -> Result<Manifest, Error> {
        Manifest::load_with(path, BlobPaths::WithinProgram)
    }

    /// [`Manifest::load`], with where blob paths may point.
    pub fn load_with(path: &Path, blobs: BlobPaths) -> Result<Manifest, Error> {
        use std::io::Read as _;
        let io = |source| Error::Io { path: path.to_owned(), source };
        let refuse = |message: String| io(std::io::Error::new(std::io::ErrorKind::InvalidInput, message));
        let file = open_regular(path).map_err(io)?;
        let too_large = |len: u64| {
            refuse(format!(
                "larger than {MAX_MANIFEST_BYTES} bytes, the most a manifest may be ({len} bytes)"
            ))
        };
        let len = file.metadata().map_err(io)?.len();
        if len > MAX_MANIFEST_BYTES {
            return Err(too_large(len));
        }
        let mut text = String::new();
        file.take(MAX_MANIFEST_BYTES + 1).read_to_string(&mut text).map_err(io)?;
        if text.len() as u64 > MAX_MANIFEST_BYTES {
            return Err(refuse(format!(
                "larger than {MAX_MANIFEST_BYTES} bytes, the most a manifest may be"
            )));
        }
        Manifest::parse_with(path, &text, blobs)
    }

    /// Parses and checks manifest text; `path` names it in errors and anchors relative blob paths, which must
    /// stay inside the manifest's directory ([`BlobPaths::WithinProgram`]).
    pub fn parse(path: &Path, text: &str) -> Result<Manifest, Error> {
        Manifest::parse_with(path, text, BlobPaths::WithinProgram)
    }

    /// [`Manifest::parse`], with where blob paths may point.
    pub fn parse_with(path: &Path, text: &str, blobs: BlobPaths) -> Result<Manifest, Error> {
        let src = Source::new(path, text)?;
        let spec = ProgramSpec::parse(path, text)?;
        if spec.format != FORMAT {
            return src.error(
                src.value(&[Seg::Key("format")]),
                format!("manifest format {} is not supported; this build reads format {FORMAT}", spec.format),
            );
        }
        let base = path.parent().unwrap_or(Path::new("."));

        let mut buffers = BTreeMap::new();
        for (name, buffer) in &spec.buffers {
            let field =
                |field: &'static str| src.value(&[Seg::Key("buffers"), Seg::Key(name), Seg::Key(field)]);
            let at = |f: &'static str| match f {
                "name" => src.key(&[Seg::Key("buffers")], name),
                f => field(f),
            };
            let (memory, device) = placement(&src, &at, "buffer", name, Some(&buffer.memory), buffer.device)?;
            let mut decl = tensor_decl(&src, &at, name, &buffer.dtype, &buffer.shape, memory)?;
            decl.device = device;
            buffers.insert(name.clone(), decl);
        }

        let mut methods = BTreeMap::new();
        for (name, method) in &spec.methods {
            let method = check_method(&src, base, blobs, name, method, &buffers)?;
            methods.insert(name.clone(), method);
        }

        let generate = match &spec.generate {
            None => None,
            Some(generate) => Some(check_generate(&src, generate, &methods)?),
        };
        Ok(Manifest { path: path.to_owned(), buffers, methods, generate })
    }
}

/// Checks where a tensor lives: its `memory` kind (absent is host) and its `device` ordinal (only for
/// device and managed memory); `what` is `buffer`, `input` or `output`.
fn placement(
    src: &Source<'_>,
    at: &dyn Fn(&'static str) -> Location,
    what: &str,
    name: &str,
    memory: Option<&str>,
    device: Option<i64>,
) -> Result<(MemoryKind, i32), Error> {
    let memory = match memory {
        None => MemoryKind::Host,
        Some(kind) => match MemoryKind::from_name(kind) {
            Some(memory) => memory,
            None => {
                return src.error(
                    at("memory"),
                    format!(
                        "unknown memory kind '{kind}' for {what} '{name}' (expected host, device, managed or pinned)"
                    ),
                )
            }
        },
    };
    let Some(device) = device else { return Ok((memory, 0)) };
    if !matches!(memory, MemoryKind::Device | MemoryKind::Managed) {
        return src.error(
            at("device"),
            format!("{what} '{name}' is {memory} memory; `device` applies to device and managed memory"),
        );
    }
    match i32::try_from(device) {
        Ok(ordinal) if ordinal >= 0 => Ok((memory, ordinal)),
        _ => src
            .error(at("device"), format!("device {device} of {what} '{name}' is not a CUDA device ordinal")),
    }
}

/// Checks a tensor declaration; `at` says where its `"name"`, `"dtype"` and `"shape"` are written.
fn tensor_decl(
    src: &Source<'_>,
    at: &dyn Fn(&'static str) -> Location,
    name: &str,
    dtype: &str,
    shape: &[i64],
    memory: MemoryKind,
) -> Result<TensorDecl, Error> {
    if name.is_empty() {
        return src.error(at("name"), "tensor name is empty");
    }
    let Some(parsed) = DType::from_name(dtype) else {
        return src.error(
            at("dtype"),
            format!(
                "unknown dtype '{dtype}' for '{name}' (expected one of: {})",
                DType::ALL.map(DType::name).join(", ")
            ),
        );
    };
    let mut dims = Vec::with_capacity(shape.len());
    for &dim in shape {
        match u64::try_from(dim) {
            Ok(dim) => dims.push(dim),
            Err(_) => {
                return src.error(
                    at("shape"),
                    format!("shape of '{name}' has negative extent {dim}; buffers need static shapes"),
                )
            }
        }
    }
    TensorDecl::new(name, parsed, dims, memory).or_else(|err| src.error(at("shape"), err.to_string()))
}

fn check_method(
    src: &Source<'_>,
    base: &Path,
    blobs: BlobPaths,
    name: &str,
    spec: &MethodSpec,
    buffers: &BTreeMap<String, TensorDecl>,
) -> Result<Method, Error> {
    let method = [Seg::Key("methods"), Seg::Key(name)];
    let inputs = check_tensors(src, name, "inputs", &spec.inputs)?;
    let outputs = check_tensors(src, name, "outputs", &spec.outputs)?;
    let calls_at = [method[0], method[1], Seg::Key("calls")];
    if spec.calls.is_empty() {
        return src.error(src.value(&calls_at), format!("method '{name}' makes no delegate call"));
    }
    let scope = MethodScope { src, name, inputs: &inputs, outputs: &outputs, buffers };
    let mut calls = Vec::new();
    for (index, call) in spec.calls.iter().enumerate() {
        let call_at = [calls_at[0], calls_at[1], calls_at[2], Seg::Index(index)];
        calls.push(scope.check_call(base, blobs, &call_at, call)?);
    }
    Ok(Method { name: name.to_owned(), inputs, outputs, calls })
}

/// Method `name`'s `inputs` or `outputs` (`key`): names unique within the list, each a checked declaration.
fn check_tensors(
    src: &Source<'_>,
    name: &str,
    key: &str,
    specs: &[TensorSpec],
) -> Result<Vec<TensorDecl>, Error> {
    let method = [Seg::Key("methods"), Seg::Key(name)];
    let mut list: Vec<TensorDecl> = Vec::with_capacity(specs.len());
    for (index, t) in specs.iter().enumerate() {
        let at = |field: &'static str| {
            src.value(&[&method[..], &[Seg::Key(key), Seg::Index(index), Seg::Key(field)]].concat())
        };
        if list.iter().any(|d| d.name == t.name) {
            return src.error(at("name"), format!("method '{name}' declares '{}' twice", t.name));
        }
        let what = if key == "inputs" { "input" } else { "output" };
        let (memory, device) = placement(src, &at, what, &t.name, t.memory.as_deref(), t.device)?;
        let mut decl = tensor_decl(src, &at, &t.name, &t.dtype, &t.shape, memory)?;
        decl.device = device;
        list.push(decl);
    }
    Ok(list)
}

/// What a method's calls may name: its own inputs and outputs, and the program's buffers.
struct MethodScope<'m> {
    src: &'m Source<'m>,
    name: &'m str,
    inputs: &'m [TensorDecl],
    outputs: &'m [TensorDecl],
    buffers: &'m BTreeMap<String, TensorDecl>,
}

impl MethodScope<'_> {
    /// One delegate call at `call_at`: a backend id, arguments the method can supply, a blob path allowed by
    /// `blobs`.
    fn check_call(
        &self,
        base: &Path,
        blobs: BlobPaths,
        call_at: &[Seg<'_>],
        call: &CallSpec,
    ) -> Result<Call, Error> {
        let src = self.src;
        let location = src.value(call_at);
        if call.backend.is_empty() {
            return src.error(src.value(&[call_at, &[Seg::Key("backend")]].concat()), "backend id is empty");
        }
        let mut args = Vec::with_capacity(call.args.len());
        let mut arg_locations = Vec::with_capacity(call.args.len());
        for (position, arg) in call.args.iter().enumerate() {
            let arg_at = src.value(&[call_at, &[Seg::Key("args"), Seg::Index(position)]].concat());
            args.push(self.check_arg(arg, arg_at)?);
            arg_locations.push(arg_at);
        }
        let escapes = Path::new(&call.blob)
            .components()
            .any(|c| !matches!(c, std::path::Component::Normal(_) | std::path::Component::CurDir));
        if escapes && blobs == BlobPaths::WithinProgram {
            return src.error(
                src.value(&[call_at, &[Seg::Key("blob")]].concat()),
                format!(
                    "blob '{}' is outside the program's directory (an absolute path or one through '..'); \
                     a host loads it only when told to (delegate-host --allow-outside-blobs)",
                    call.blob
                ),
            );
        }
        let root = (blobs == BlobPaths::WithinProgram).then(|| base.to_owned());
        let blob = BlobSource::File { path: base.join(&call.blob), root };
        Ok(Call { blob, backend: call.backend.clone(), args, location, arg_locations })
    }

    /// One argument, `input:NAME`, `output:NAME` or `buffer:NAME`, naming something the method has.
    fn check_arg(&self, arg: &str, arg_at: Location) -> Result<ArgRef, Error> {
        let name = self.name;
        let parsed = match arg.split_once(':') {
            Some(("input", n)) => ArgRef::Input(n.to_owned()),
            Some(("output", n)) => ArgRef::Output(n.to_owned()),
            Some(("buffer", n)) => ArgRef::Buffer(n.to_owned()),
            _ => {
                return self.src.error(
                    arg_at,
                    format!("argument '{arg}' must be 'input:NAME', 'output:NAME' or 'buffer:NAME'"),
                )
            }
        };
        let known = match &parsed {
            ArgRef::Input(n) => self.inputs.iter().any(|d| d.name == *n),
            ArgRef::Output(n) => self.outputs.iter().any(|d| d.name == *n),
            ArgRef::Buffer(n) => self.buffers.contains_key(n),
        };
        if !known {
            let what = match &parsed {
                ArgRef::Input(_) => format!("method '{name}' declares no input"),
                ArgRef::Output(_) => format!("method '{name}' declares no output"),
                ArgRef::Buffer(_) => "the program declares no buffer".to_owned(),
            };
            let n = arg.split_once(':').map_or("", |(_, n)| n);
            return self.src.error(arg_at, format!("{what} named '{n}'"));
        }
        Ok(parsed)
    }
}

fn check_generate(
    src: &Source<'_>,
    g: &GenerateSpec,
    methods: &BTreeMap<String, Method>,
) -> Result<Generate, Error> {
    let at = |field: &'static str| src.value(&[Seg::Key("generate"), Seg::Key(field)]);
    let method = |field: &'static str, m: &str| -> Result<&Method, Error> {
        methods.get(m).map_or_else(
            || src.error(at(field), format!("[generate] names method '{m}', which the program lacks")),
            Ok,
        )
    };
    for m in [method("prefill", &g.prefill)?, method("decode", &g.decode)?] {
        for (field, value, want, dtype, list) in [
            ("token_input", &g.token_input, "input", &[DType::I64][..], &m.inputs),
            ("position_input", &g.position_input, "input", &[DType::I64][..], &m.inputs),
            (
                "logits_output",
                &g.logits_output,
                "output",
                &[DType::F32, DType::F16, DType::BF16][..],
                &m.outputs,
            ),
        ] {
            match list.iter().find(|d| d.name == *value) {
                None => {
                    return src.error(at(field), format!("method '{}' has no {want} named '{value}'", m.name))
                }
                Some(decl) if !dtype.contains(&decl.dtype) => {
                    let names: Vec<&str> = dtype.iter().map(|d| d.name()).collect();
                    let want = match names.split_last() {
                        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
                        _ => names.concat(),
                    };
                    return src.error(
                        at(field),
                        format!("'{}' of method '{}' must be {want}, not {}", decl.name, m.name, decl.dtype),
                    );
                }
                Some(_) => {}
            }
        }
        if let Some(next) = &g.next_token_output {
            match m.outputs.iter().find(|d| d.name == *next) {
                None => {
                    return src.error(
                        at("next_token_output"),
                        format!("method '{}' has no output named '{next}'", m.name),
                    )
                }
                Some(decl) if decl.dtype != DType::I64 || decl.numel() != 1 => {
                    return src.error(
                        at("next_token_output"),
                        format!(
                            "'{next}' of method '{}' must be i64 [1], not {} {:?}",
                            m.name, decl.dtype, decl.shape
                        ),
                    )
                }
                Some(_) => {}
            }
        }
    }
    let prefill = method("prefill", &g.prefill)?;
    let tokens = prefill.inputs.iter().find(|d| d.name == g.token_input);
    if tokens.map(TensorDecl::numel) != Some(g.prompt.len() as u64) {
        return src.error(
            at("prompt"),
            format!(
                "prompt has {} tokens but '{}' of method '{}' takes {}",
                g.prompt.len(),
                g.token_input,
                prefill.name,
                tokens.map_or(0, TensorDecl::numel)
            ),
        );
    }
    if let Some(max) = g.max_positions {
        if max < g.prompt.len() as u64 {
            return src.error(
                at("max_positions"),
                format!("max_positions is {max} but the prompt alone has {} tokens", g.prompt.len()),
            );
        }
    }
    Ok(g.clone())
}

#[cfg(test)]
mod tests;
