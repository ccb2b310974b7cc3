//! A loaded program: caller-owned buffers, one delegate instance per call, and the argument plan of every call,
//! all checked and prepared before anything runs.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use blob_format::model::{Binding, Dim, DisplayShape, Role};
use blob_format::Blob;
use delegate_abi::host::{ArgList, Instance, Slot};
use delegate_abi::{DTypeCode, DelegateError, InitContext, MemoryKind};
use smallvec::SmallVec;

use crate::blob_file::BlobFile;
use crate::buffer::HostStorage;
use crate::manifest::{ArgRef, Location, Manifest, Method, TensorDecl};
use crate::plugins::Registry;

/// How a buffer-mutation output slot is passed to the delegate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// The output slot is the buffer's own storage: the delegate updates it in place, nothing is copied.
    #[default]
    ZeroCopy,
    /// Upstream's behaviour: a separate output slot, the delegate reflects into it, the host writes it back.
    CopyBack,
}

/// Why a program could not be loaded or run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The manifest is unreadable or wrong.
    #[error(transparent)]
    Manifest(#[from] crate::manifest::Error),
    /// A blob file could not be read.
    #[error("cannot read blob {path}: {source}")]
    BlobIo {
        /// The blob path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A blob file is not a valid blob.
    #[error("{path}: {source}")]
    Blob {
        /// The blob path.
        path: PathBuf,
        /// What is wrong with it.
        source: blob_format::Error,
    },
    /// A blob's alias table breaks the aliasing rules.
    #[error("{path}: {source}")]
    Alias {
        /// The blob path.
        path: PathBuf,
        /// The broken rule.
        source: alias_validate::Error,
    },
    /// A call's arguments do not fit its blob (count, role, dtype, shape, memory kind, aliasing).
    #[error("{manifest}:{location}: method '{method}', call {call}: {message}")]
    Arguments {
        /// The manifest path.
        manifest: PathBuf,
        /// Where the argument (or call) is declared.
        location: Location,
        /// The method.
        method: String,
        /// The call's index in the method.
        call: usize,
        /// What does not fit.
        message: String,
    },
    /// No loaded plugin serves a call's backend.
    #[error("{manifest}:{location}: no loaded plugin serves backend '{backend}' (loaded: {available}); see `delegate-host plugins`")]
    NoPlugin {
        /// The manifest path.
        manifest: PathBuf,
        /// Where the call is declared.
        location: Location,
        /// The backend asked for.
        backend: String,
        /// The backends that are served.
        available: String,
    },
    /// A delegate refused or failed a call.
    #[error("method '{method}', call {call} ({backend}): {stage} failed: {source}")]
    Delegate {
        /// The method.
        method: String,
        /// The call's index in the method.
        call: usize,
        /// The backend.
        backend: String,
        /// `init` or `execute`.
        stage: &'static str,
        /// The delegate's error, with its ExecuTorch code.
        source: DelegateError,
    },
    /// A method, input or output named by the caller does not exist or has the wrong size.
    #[error("{0}")]
    Usage(String),
}

impl et_error::HasErrorCode for Error {
    fn error_code(&self) -> et_error::ErrorCode {
        use et_error::ErrorCode;
        match self {
            Error::Manifest(err) => err.error_code(),
            Error::BlobIo { .. } => ErrorCode::AccessFailed,
            Error::Blob { source, .. } => source.error_code(),
            Error::Alias { source, .. } => source.error_code(),
            Error::Arguments { .. } => ErrorCode::InvalidArgument,
            Error::NoPlugin { .. } => ErrorCode::NotFound,
            Error::Delegate { source, .. } => source.code,
            Error::Usage(_) => ErrorCode::InvalidArgument,
        }
    }
}

/// Bytes copied during one method run, by kind of copy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CopyStats {
    /// Copies of an aliased input into a separate output slot, made by delegates.
    pub reflect_bytes: u64,
    /// Host-to-device staging made by delegates.
    pub staged_bytes: u64,
    /// Buffer-mutation write-backs from an output slot into the buffer, made by the host.
    pub writeback_bytes: u64,
}

impl CopyStats {
    /// All bytes copied.
    pub fn total(&self) -> u64 {
        self.reflect_bytes + self.staged_bytes + self.writeback_bytes
    }

    fn add(&mut self, other: CopyStats) {
        self.reflect_bytes += other.reflect_bytes;
        self.staged_bytes += other.staged_bytes;
        self.writeback_bytes += other.writeback_bytes;
    }
}

/// What one method run cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunStats {
    /// Wall time of the delegate calls and write-backs.
    pub elapsed: Duration,
    /// Bytes copied.
    pub copies: CopyStats,
}

/// How one delegate argument is filled, decided at load.
#[derive(Debug, Clone, Copy)]
enum ArgSource {
    /// A user input of the method.
    Input(usize),
    /// A user output of the method.
    Output(usize),
    /// A buffer the delegate only reads.
    BufferRead(usize),
    /// A buffer an output aliases: the delegate updates it in place.
    BufferInOut(usize),
    /// A buffer-mutation output slot that is the buffer itself (zero-copy).
    BufferInPlace(usize),
    /// A buffer-mutation output slot in host scratch, written back into the buffer after the call (copy-back).
    BufferScratch(usize),
}

#[derive(Debug, Clone)]
struct ArgPlan {
    source: ArgSource,
    dtype: DTypeCode,
    shape: Vec<i64>,
    memory: MemoryKind,
}

struct LoadedCall {
    backend: String,
    instance: Instance,
    args: Vec<ArgPlan>,
    /// The argument list's allocation, kept between calls so `execute` allocates none.
    arg_list: ArgList<'static>,
    scratch: Vec<HostStorage>,
    /// (scratch index, buffer index) pairs copied after the call.
    writebacks: Vec<(usize, usize)>,
}

struct LoadedMethod {
    decl: Method,
    inputs: Vec<HostStorage>,
    outputs: Vec<HostStorage>,
    calls: Vec<LoadedCall>,
}

struct Buffer {
    decl: TensorDecl,
    storage: HostStorage,
}

/// A program ready to run: buffers allocated and zeroed, every call's delegate initialised.
pub struct Program {
    manifest: Manifest,
    mode: Mode,
    buffers: Vec<Buffer>,
    methods: BTreeMap<String, LoadedMethod>,
}

fn shape_fits(declared: &[Dim], actual: &[u64]) -> bool {
    declared.len() == actual.len()
        && declared.iter().zip(actual).all(|(d, &a)| matches!(d, Dim::Dynamic) || *d == Dim::Static(a))
}

impl Program {
    /// Loads `manifest`'s program: checks every call against its blob and plugin, allocates and zeroes the
    /// buffers, and initialises one delegate instance per call (methods do not share instances; they share
    /// buffers).
    pub fn load(manifest: Manifest, registry: &Registry, mode: Mode) -> Result<Program, Error> {
        let buffers: Vec<Buffer> = manifest
            .buffers
            .values()
            .map(|decl| Buffer { decl: decl.clone(), storage: HostStorage::zeroed(decl.nbytes() as usize) })
            .collect();
        let mut methods = BTreeMap::new();
        for (name, method) in &manifest.methods {
            let mut calls = Vec::with_capacity(method.calls.len());
            for index in 0..method.calls.len() {
                calls.push(load_call(&manifest, method, index, &buffers, registry, mode)?);
            }
            let storage = |decls: &[TensorDecl]| -> Vec<HostStorage> {
                decls.iter().map(|d| HostStorage::zeroed(d.nbytes() as usize)).collect()
            };
            methods.insert(
                name.clone(),
                LoadedMethod {
                    decl: method.clone(),
                    inputs: storage(&method.inputs),
                    outputs: storage(&method.outputs),
                    calls,
                },
            );
        }
        Ok(Program { manifest, mode, buffers, methods })
    }

    /// The manifest it was loaded from.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// How mutation outputs are passed.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// A buffer's bytes.
    pub fn buffer(&self, name: &str) -> Option<&[u8]> {
        self.buffers.iter().find(|b| b.decl.name == name).map(|b| b.storage.bytes())
    }

    /// Zeroes every buffer (a fresh sequence).
    pub fn reset_buffers(&mut self) {
        self.buffers.iter_mut().for_each(|b| b.storage.clear());
    }

    fn method_mut(&mut self, method: &str) -> Result<&mut LoadedMethod, Error> {
        self.methods
            .get_mut(method)
            .ok_or_else(|| Error::Usage(format!("the program has no method '{method}'")))
    }

    /// A user input's bytes, to fill before [`Program::execute`].
    pub fn input_mut(&mut self, method: &str, input: &str) -> Result<&mut [u8], Error> {
        let m = self.method_mut(method)?;
        let index = m
            .decl
            .inputs
            .iter()
            .position(|d| d.name == input)
            .ok_or_else(|| Error::Usage(format!("method '{method}' has no input '{input}'")))?;
        Ok(m.inputs[index].bytes_mut())
    }

    /// A user output's bytes, as the last [`Program::execute`] of `method` left them.
    pub fn output(&self, method: &str, output: &str) -> Result<&[u8], Error> {
        let m = self
            .methods
            .get(method)
            .ok_or_else(|| Error::Usage(format!("the program has no method '{method}'")))?;
        let index = m
            .decl
            .outputs
            .iter()
            .position(|d| d.name == output)
            .ok_or_else(|| Error::Usage(format!("method '{method}' has no output '{output}'")))?;
        Ok(m.outputs[index].bytes())
    }

    /// Runs `method` once: its delegate calls in order, then the write-backs copy-back mode needs.
    pub fn execute(&mut self, method: &str) -> Result<RunStats, Error> {
        let start = Instant::now();
        let buffers = &mut self.buffers;
        let m = self
            .methods
            .get_mut(method)
            .ok_or_else(|| Error::Usage(format!("the program has no method '{method}'")))?;
        let mut copies = CopyStats::default();
        for (index, call) in m.calls.iter_mut().enumerate() {
            let stats =
                run_call(call, buffers, &m.inputs, &mut m.outputs).map_err(|source| Error::Delegate {
                    method: method.to_owned(),
                    call: index,
                    backend: call.backend.clone(),
                    stage: "execute",
                    source,
                })?;
            copies.add(CopyStats {
                reflect_bytes: stats.reflect_bytes,
                staged_bytes: stats.staged_bytes,
                writeback_bytes: 0,
            });
            for &(scratch, buffer) in &call.writebacks {
                let src = call.scratch[scratch].bytes();
                buffers[buffer].storage.bytes_mut().copy_from_slice(src);
                copies.writeback_bytes += src.len() as u64;
            }
        }
        Ok(RunStats { elapsed: start.elapsed(), copies })
    }
}

/// Per-argument mutable borrows of a call's storages, taken at most once each.
type Borrows<'a> = SmallVec<[Option<&'a mut [u8]>; 32]>;

fn run_call(
    call: &mut LoadedCall,
    buffers: &mut [Buffer],
    inputs: &[HostStorage],
    outputs: &mut [HostStorage],
) -> Result<delegate_abi::ExecStats, DelegateError> {
    // Split every storage into per-argument borrows; load-time checks guarantee each is taken at most once
    // mutably (a buffer's in-place output slot refers to its in/out slot instead of borrowing again).
    // Up to 32 of each live on the stack, so a step allocates nothing.
    let mut buffer_bytes: Borrows<'_> = buffers.iter_mut().map(|b| Some(b.storage.bytes_mut())).collect();
    let mut output_bytes: Borrows<'_> = outputs.iter_mut().map(|o| Some(o.bytes_mut())).collect();
    let mut scratch_bytes: Borrows<'_> = call.scratch.iter_mut().map(|s| Some(s.bytes_mut())).collect();
    let mut slots: SmallVec<[Option<Slot>; 32]> = smallvec::smallvec![None; buffer_bytes.len()];
    let mut args = std::mem::take(&mut call.arg_list).recycle();
    let taken =
        || DelegateError::internal("argument storage taken twice; the load-time plan is inconsistent");
    for plan in &call.args {
        let (dtype, shape, memory) = (plan.dtype, plan.shape.as_slice(), plan.memory);
        let pushed = match plan.source {
            ArgSource::Input(i) => args.push_input(inputs[i].bytes(), dtype, shape, memory),
            ArgSource::Output(i) => {
                args.push_output(output_bytes[i].take().ok_or_else(taken)?, dtype, shape, memory)
            }
            ArgSource::BufferRead(b) => {
                args.push_input(buffer_bytes[b].take().ok_or_else(taken)?, dtype, shape, memory)
            }
            ArgSource::BufferInOut(b) => args
                .push_inout(buffer_bytes[b].take().ok_or_else(taken)?, dtype, shape, memory)
                .map(|slot| slots[b] = Some(slot)),
            ArgSource::BufferInPlace(b) => {
                args.push_output_in_place(slots[b].ok_or_else(taken)?, dtype, shape)
            }
            ArgSource::BufferScratch(scratch) => {
                args.push_output(scratch_bytes[scratch].take().ok_or_else(taken)?, dtype, shape, memory)
            }
        };
        pushed.map_err(|err| DelegateError::invalid_argument(err.to_string()))?;
    }
    let result = call.instance.execute(&mut args, None);
    call.arg_list = args.recycle();
    result
}

fn load_call(
    manifest: &Manifest,
    method: &Method,
    index: usize,
    buffers: &[Buffer],
    registry: &Registry,
    mode: Mode,
) -> Result<LoadedCall, Error> {
    let call = &method.calls[index];
    let wrong = |location: Location, message: String| Error::Arguments {
        manifest: manifest.path.clone(),
        location,
        method: method.name.clone(),
        call: index,
        message,
    };
    let file =
        BlobFile::open(&call.blob).map_err(|source| Error::BlobIo { path: call.blob.clone(), source })?;
    let blob = Blob::parse(file.bytes()).map_err(|source| Error::Blob { path: call.blob.clone(), source })?;
    let header = &blob.header;
    if header.backend_id != call.backend {
        return Err(wrong(
            call.location,
            format!(
                "blob {} is for backend '{}', but the call names '{}'",
                call.blob.display(),
                header.backend_id,
                call.backend
            ),
        ));
    }
    let plan = alias_validate::validate_format(header)
        .map_err(|source| Error::Alias { path: call.blob.clone(), source })?;
    let plugin = registry.for_backend(&call.backend).ok_or_else(|| Error::NoPlugin {
        manifest: manifest.path.clone(),
        location: call.location,
        backend: call.backend.clone(),
        available: match registry.backends() {
            backends if backends.is_empty() => "none".to_owned(),
            backends => backends.join(", "),
        },
    })?;

    let bindings: Vec<&Binding> = header.bindings.iter().filter(|b| b.threaded).collect();
    if bindings.len() != call.args.len() {
        return Err(wrong(
            call.location,
            format!(
                "the call passes {} arguments but blob {} threads {} ({})",
                call.args.len(),
                call.blob.display(),
                bindings.len(),
                bindings.iter().map(|b| format!("{} {}", b.role, b.name)).collect::<Vec<_>>().join(", ")
            ),
        ));
    }
    let buffer_index =
        |name: &str| buffers.iter().position(|b| b.decl.name == name).expect("manifest checked buffer names");
    let mut args = Vec::with_capacity(bindings.len());
    let mut scratch = Vec::new();
    let mut writebacks = Vec::new();
    let mut used_buffers: Vec<(usize, usize)> = Vec::new(); // (buffer, arg position) of inputs
    for (pos, (binding, arg)) in bindings.iter().zip(&call.args).enumerate() {
        let at = call.arg_locations[pos];
        let (decl, source) = match (binding.role, arg) {
            (Role::Input, ArgRef::Input(name)) => {
                let i =
                    method.inputs.iter().position(|d| d.name == *name).expect("manifest checked input names");
                if plan.alias_for_input(&binding.name).is_some() {
                    return Err(wrong(at, format!(
                        "argument {pos} ('{}') is an aliased input: the delegate updates it in place, so it must be bound to a buffer, not to input '{name}'",
                        binding.name
                    )));
                }
                (&method.inputs[i], ArgSource::Input(i))
            }
            (Role::Output, ArgRef::Output(name)) => {
                let i = method
                    .outputs
                    .iter()
                    .position(|d| d.name == *name)
                    .expect("manifest checked output names");
                if args.iter().any(|a: &ArgPlan| matches!(a.source, ArgSource::Output(o) if o == i)) {
                    return Err(wrong(at, format!("output '{name}' is bound to more than one argument")));
                }
                (&method.outputs[i], ArgSource::Output(i))
            }
            (Role::Input, ArgRef::Buffer(name)) => {
                let b = buffer_index(name);
                if let Some(&(_, other)) = used_buffers.iter().find(|(u, _)| *u == b) {
                    return Err(wrong(
                        at,
                        format!("buffer '{name}' is bound to input arguments {other} and {pos}"),
                    ));
                }
                used_buffers.push((b, pos));
                let source = if plan.alias_for_input(&binding.name).is_some() {
                    ArgSource::BufferInOut(b)
                } else {
                    ArgSource::BufferRead(b)
                };
                (&buffers[b].decl, source)
            }
            (Role::Output, ArgRef::Buffer(name)) => {
                let b = buffer_index(name);
                let Some(alias) = plan.alias_for_output(&binding.name) else {
                    return Err(wrong(at, format!(
                        "argument {pos} ('{}') writes buffer '{name}', but the blob aliases no input to that output, so the buffer would not be updated in place",
                        binding.name
                    )));
                };
                let input_arg = used_buffers.iter().find(|(u, _)| *u == b).map(|&(_, p)| p);
                match input_arg {
                    Some(p) if bindings[p].name == alias.input => {}
                    _ => {
                        return Err(wrong(at, format!(
                            "argument {pos} ('{}') is the mutation output of buffer '{name}', so its aliased input '{}' must be bound to buffer '{name}' at an earlier argument",
                            binding.name, alias.input
                        )))
                    }
                }
                let source = match mode {
                    Mode::ZeroCopy => ArgSource::BufferInPlace(b),
                    Mode::CopyBack => {
                        scratch.push(HostStorage::zeroed(buffers[b].decl.nbytes() as usize));
                        writebacks.push((scratch.len() - 1, b));
                        ArgSource::BufferScratch(scratch.len() - 1)
                    }
                };
                (&buffers[b].decl, source)
            }
            (role, arg) => {
                return Err(wrong(
                    at,
                    format!(
                        "argument {pos} binds engine {role} '{}', which cannot take '{arg}'",
                        binding.name
                    ),
                ))
            }
        };
        if let Some(dtype) = binding.dtype {
            if dtype != decl.dtype {
                return Err(wrong(
                    at,
                    format!(
                        "argument {pos} ('{}') is {dtype} in the blob but '{}' is {}",
                        binding.name, decl.name, decl.dtype
                    ),
                ));
            }
        }
        if let Some(shape) = &binding.shape {
            if !shape_fits(shape, &decl.shape) {
                return Err(wrong(
                    at,
                    format!(
                        "argument {pos} ('{}') has shape {} in the blob but '{}' has shape {:?}",
                        binding.name,
                        DisplayShape(shape),
                        decl.name,
                        decl.shape
                    ),
                ));
            }
        }
        if !plugin.info().memory_kinds.contains(&decl.memory) {
            return Err(wrong(
                at,
                format!(
                    "argument {pos} ('{}') is {} memory, which plugin '{}' does not accept",
                    binding.name,
                    decl.memory,
                    plugin.info().name
                ),
            ));
        }
        let Some(dtype) = DTypeCode::from_name(decl.dtype.name()) else {
            return Err(wrong(at, format!("dtype {} cannot cross the plugin ABI", decl.dtype)));
        };
        args.push(ArgPlan {
            source,
            dtype,
            shape: decl.shape.iter().map(|&d| d as i64).collect(),
            memory: decl.memory,
        });
    }

    let ctx = InitContext { blob: file.bytes(), compile_specs: &[], runtime_specs: &[] };
    let instance = plugin.init(&ctx).map_err(|source| Error::Delegate {
        method: method.name.clone(),
        call: index,
        backend: call.backend.clone(),
        stage: "init",
        source,
    })?;
    let arg_list = ArgList::with_capacity(args.len());
    Ok(LoadedCall { backend: call.backend.clone(), instance, args, arg_list, scratch, writebacks })
}
