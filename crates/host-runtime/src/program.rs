//! A loaded program: caller-owned buffers, one delegate instance per call, and the argument plan of every call,
//! all checked and prepared before anything runs.
//!
//! Buffers live in the memory kind their manifest declares: host memory, or CUDA device, managed or pinned
//! memory (see [`crate::cuda`]); the kind a delegate is told is the kind the storage really is. A program
//! with host buffers only never loads the CUDA driver.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use alias_validate::ArgLayout;
use blob_format::model::{Dim, DisplayShape, Role};
use blob_format::Blob;
use delegate_abi::host::{ArgList, Instance, Plugin, Slot};
use delegate_abi::{Compatibility, DTypeCode, DelegateError, InitContext, MemoryKind};
use program_manifest::{ArgRef, Location, Manifest, Method, TensorDecl};
use smallvec::SmallVec;

use crate::blob_file::BlobFile;
use crate::buffer::{AllocError, HostStorage, Storage, View};
use crate::cuda::{self, Access, Contexts};
use crate::plugins::Registry;

/// How a buffer-mutation output slot is passed to the delegate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// The output slot is the buffer's own storage: the delegate updates it in place, nothing is copied.
    #[default]
    ZeroCopy,
    /// Upstream's behaviour: a separate output slot, the delegate reflects into it, the host writes it back.
    CopyBack,
}

impl Mode {
    /// `"zero-copy"` or `"copy-back"`, as `delegate-host --mode` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Mode::ZeroCopy => "zero-copy",
            Mode::CopyBack => "copy-back",
        }
    }
}

/// Why a program could not be loaded or run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The manifest is unreadable or wrong.
    #[error(transparent)]
    Manifest(#[from] program_manifest::Error),
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
    #[error("{manifest}:{location}: no loaded plugin serves backend '{backend}' (loaded: {available}){unavailable}; see `delegate-host plugins`")]
    NoPlugin {
        /// The manifest path.
        manifest: PathBuf,
        /// Where the call is declared.
        location: Location,
        /// The backend asked for.
        backend: String,
        /// The backends that are served.
        available: String,
        /// Plugins that offer the backend but are unavailable, with their reasons (empty, or `; plugin ...`).
        unavailable: String,
    },
    /// The plugin serving a call says it cannot run the call's blob (its header-only compatibility answer).
    #[error("{path}: plugin {plugin} cannot run this blob: {reason}")]
    Incompatible {
        /// The blob path.
        path: PathBuf,
        /// The plugin's name.
        plugin: String,
        /// Its reason.
        reason: String,
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
        /// `compatibility`, `init` or `execute`.
        stage: &'static str,
        /// The delegate's error, with its ExecuTorch code.
        source: DelegateError,
    },
    /// A buffer's memory could not be had: no CUDA driver or device for a device, managed or pinned buffer
    /// (`NotSupported`), or the allocation failed (`MemoryAllocationFailed`).
    #[error("buffer '{buffer}' wants {memory} memory but {source}")]
    BufferMemory {
        /// The buffer.
        buffer: String,
        /// The memory kind it declares.
        memory: MemoryKind,
        /// What the allocator or CUDA said.
        source: AllocError,
    },
    /// A method's user input or output could not be allocated (`MemoryAllocationFailed`).
    #[error(
        "method '{method}': {role} '{tensor}' needs {bytes} bytes of host memory, which cannot be allocated"
    )]
    TensorMemory {
        /// The method.
        method: String,
        /// `input` or `output`.
        role: &'static str,
        /// The input or output.
        tensor: String,
        /// Its size.
        bytes: u64,
    },
    /// Reading, zeroing or writing back a device or managed buffer failed.
    #[error("{action} buffer '{buffer}' failed: {source}")]
    BufferAccess {
        /// The buffer.
        buffer: String,
        /// `reading`, `zeroing` or `writing back`.
        action: &'static str,
        /// What CUDA said.
        source: cuda::Error,
    },
    /// A method, input, output or buffer named by the caller does not exist or has the wrong size.
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
            Error::Incompatible { .. } => ErrorCode::DelegateInvalidCompatibility,
            Error::Delegate { source, .. } => source.code,
            Error::BufferMemory { source, .. } => source.error_code(),
            Error::TensorMemory { .. } => ErrorCode::MemoryAllocationFailed,
            Error::BufferAccess { source, .. } => source.error_code(),
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
    /// A buffer-mutation output slot in scratch storage of the buffer's memory kind, written back into the
    /// buffer after the call (copy-back).
    BufferScratch(usize),
}

#[derive(Debug, Clone)]
struct ArgPlan {
    source: ArgSource,
    dtype: DTypeCode,
    shape: Vec<i64>,
    memory: MemoryKind,
}

/// A call checked against its blob and plugin, not yet initialised.
struct PlannedCall {
    file: BlobFile,
    plugin: std::sync::Arc<Plugin>,
    args: Vec<ArgPlan>,
    /// The buffer each copy-back scratch slot mirrors, by scratch index.
    scratch_of: Vec<usize>,
}

struct LoadedCall {
    backend: String,
    instance: Instance,
    args: Vec<ArgPlan>,
    /// The argument list's allocation, kept between calls so `execute` allocates none.
    arg_list: ArgList<'static>,
    /// Copy-back output slots, each of its buffer's memory kind, size and device.
    scratch: Vec<Storage>,
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
    storage: Storage,
}

/// The ABI's memory kind for a manifest's: the one place where the manifest's vocabulary meets the ABI's.
fn abi_memory(kind: program_manifest::MemoryKind) -> MemoryKind {
    match kind {
        program_manifest::MemoryKind::Host => MemoryKind::Host,
        program_manifest::MemoryKind::Device => MemoryKind::Device,
        program_manifest::MemoryKind::Managed => MemoryKind::Managed,
        program_manifest::MemoryKind::Pinned => MemoryKind::Pinned,
    }
}

fn allocate(decl: &TensorDecl, contexts: &mut Contexts) -> Result<Storage, Error> {
    let memory = abi_memory(decl.memory);
    Storage::zeroed(memory, decl.device, host_size(decl.nbytes()), contexts)
        .map_err(|source| Error::BufferMemory { buffer: decl.name.clone(), memory, source })
}

/// A size in bytes as this machine can address it; one it cannot (above `usize::MAX`) asks for `usize::MAX`,
/// which every allocator refuses with a typed error.
fn host_size(bytes: u64) -> usize {
    usize::try_from(bytes).unwrap_or(usize::MAX)
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
    ///
    /// Every call is checked before any memory is allocated or any delegate initialised; then the buffers
    /// are allocated in their declared memory kinds (opening a CUDA context only for device, managed or
    /// pinned buffers), then each call's copy-back scratch and delegate instance.
    pub fn load(manifest: Manifest, registry: &Registry, mode: Mode) -> Result<Program, Error> {
        for method in manifest.methods.values() {
            let io = method.inputs.iter().chain(&method.outputs);
            if let Some(decl) = io.into_iter().find(|d| d.memory != program_manifest::MemoryKind::Host) {
                return Err(Error::Usage(format!(
                    "method '{}': '{}' is declared in {} memory; this host keeps method inputs and outputs in host memory",
                    method.name, decl.name, decl.memory
                )));
            }
        }
        let decls: Vec<&TensorDecl> = manifest.buffers.values().collect();
        let mut planned = Vec::with_capacity(manifest.methods.len());
        for method in manifest.methods.values() {
            let calls = (0..method.calls.len())
                .map(|index| plan_call(&manifest, method, index, &decls, registry, mode))
                .collect::<Result<Vec<_>, Error>>()?;
            planned.push(calls);
        }
        let mut contexts = Contexts::new();
        let buffers = decls
            .iter()
            .map(|&decl| Ok(Buffer { decl: decl.clone(), storage: allocate(decl, &mut contexts)? }))
            .collect::<Result<Vec<Buffer>, Error>>()?;
        let mut methods = BTreeMap::new();
        for ((name, method), planned) in manifest.methods.iter().zip(planned) {
            let mut calls = Vec::with_capacity(planned.len());
            for (index, call) in planned.into_iter().enumerate() {
                calls.push(init_call(method, index, call, &buffers, &mut contexts)?);
            }
            let storage = |decls: &[TensorDecl], role: &'static str| -> Result<Vec<HostStorage>, Error> {
                decls
                    .iter()
                    .map(|d| {
                        HostStorage::zeroed(host_size(d.nbytes())).map_err(|_| Error::TensorMemory {
                            method: name.clone(),
                            role,
                            tensor: d.name.clone(),
                            bytes: d.nbytes(),
                        })
                    })
                    .collect()
            };
            methods.insert(
                name.clone(),
                LoadedMethod {
                    decl: method.clone(),
                    inputs: storage(&method.inputs, "input")?,
                    outputs: storage(&method.outputs, "output")?,
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

    /// A buffer's bytes: borrowed for host-visible memory (managed memory after a context
    /// synchronisation), copied to the host for device memory.
    ///
    /// # Errors
    /// [`Error::Usage`] when the program has no such buffer, [`Error::BufferAccess`] when reading device
    /// memory fails.
    pub fn buffer(&self, name: &str) -> Result<Cow<'_, [u8]>, Error> {
        let buffer = self
            .buffers
            .iter()
            .find(|b| b.decl.name == name)
            .ok_or_else(|| Error::Usage(format!("the program has no buffer '{name}'")))?;
        buffer.storage.read().map_err(|source| Error::BufferAccess {
            buffer: buffer.decl.name.clone(),
            action: "reading",
            source,
        })
    }

    /// The memory kind a buffer really lives in, or `None` when the program has no such buffer.
    pub fn buffer_memory(&self, name: &str) -> Option<MemoryKind> {
        self.buffers.iter().find(|b| b.decl.name == name).map(|b| b.storage.memory())
    }

    /// Zeroes every buffer, of every memory kind (a fresh sequence).
    pub fn reset_buffers(&mut self) -> Result<(), Error> {
        for buffer in &mut self.buffers {
            buffer.storage.clear().map_err(|source| Error::BufferAccess {
                buffer: buffer.decl.name.clone(),
                action: "zeroing",
                source,
            })?;
        }
        Ok(())
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
                let buffer = &mut buffers[buffer];
                copies.writeback_bytes +=
                    buffer.storage.copy_from(&call.scratch[scratch]).map_err(|source| {
                        Error::BufferAccess {
                            buffer: buffer.decl.name.clone(),
                            action: "writing back",
                            source,
                        }
                    })?;
            }
        }
        Ok(RunStats { elapsed: start.elapsed(), copies })
    }
}

/// Per-argument mutable borrows of user outputs, taken at most once each.
type Borrows<'a> = SmallVec<[Option<&'a mut [u8]>; 32]>;

/// Per-argument mutable views of buffers and scratch storages, taken at most once each.
type Views<'a> = SmallVec<[Option<View<'a>>; 32]>;

/// Pushes a buffer or scratch view: host-visible slices through `ArgList`'s safe pushes, device and managed
/// memory through [`cuda::push_raw`] with the same flags.
fn push_view<'a>(
    args: &mut ArgList<'a>,
    view: View<'a>,
    plan: &ArgPlan,
    access: Access,
) -> Result<Option<Slot>, delegate_abi::host::ArgError> {
    let (dtype, shape, memory) = (plan.dtype, plan.shape.as_slice(), plan.memory);
    match (view, access) {
        (View::Host(bytes), Access::Read) => args.push_input(bytes, dtype, shape, memory).map(|()| None),
        (View::Host(bytes), Access::InOut) => args.push_inout(bytes, dtype, shape, memory).map(Some),
        (View::Host(bytes), Access::Write) => args.push_output(bytes, dtype, shape, memory).map(|()| None),
        (View::Raw(raw), access) => cuda::push_raw(args, raw, dtype, shape, access).map(Some),
    }
}

fn run_call(
    call: &mut LoadedCall,
    buffers: &mut [Buffer],
    inputs: &[HostStorage],
    outputs: &mut [HostStorage],
) -> Result<delegate_abi::ExecStats, DelegateError> {
    // Split every storage into per-argument borrows; load-time checks guarantee each is taken at most once
    // mutably (a buffer's in-place output slot refers to its in/out slot instead of borrowing again).
    // Up to 32 of each live on the stack, so a step allocates nothing.
    let mut buffer_views: Views<'_> = buffers.iter_mut().map(|b| Some(b.storage.view())).collect();
    let mut output_bytes: Borrows<'_> = outputs.iter_mut().map(|o| Some(o.bytes_mut())).collect();
    let mut scratch_views: Views<'_> = call.scratch.iter_mut().map(|s| Some(s.view())).collect();
    let mut slots: SmallVec<[Option<Slot>; 32]> = smallvec::smallvec![None; buffer_views.len()];
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
                push_view(&mut args, buffer_views[b].take().ok_or_else(taken)?, plan, Access::Read).map(drop)
            }
            ArgSource::BufferInOut(b) => {
                push_view(&mut args, buffer_views[b].take().ok_or_else(taken)?, plan, Access::InOut)
                    .map(|slot| slots[b] = slot)
            }
            ArgSource::BufferInPlace(b) => {
                args.push_output_in_place(slots[b].ok_or_else(taken)?, dtype, shape)
            }
            ArgSource::BufferScratch(scratch) => {
                let view = scratch_views[scratch].take().ok_or_else(taken)?;
                push_view(&mut args, view, plan, Access::Write).map(drop)
            }
        };
        pushed.map_err(|err| DelegateError::invalid_argument(err.to_string()))?;
    }
    let result = call.instance.execute(&mut args, None);
    call.arg_list = args.recycle();
    result
}

/// Checks call `index` of `method` against its blob and the plugin serving it, and plans its arguments.
/// Allocates no buffer memory and initialises no delegate.
fn plan_call(
    manifest: &Manifest,
    method: &Method,
    index: usize,
    buffers: &[&TensorDecl],
    registry: &Registry,
    mode: Mode,
) -> Result<PlannedCall, Error> {
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
        unavailable: registry
            .unavailable_for(&call.backend)
            .map(|(name, reason)| format!("; plugin {name} offers it but is unavailable: {reason}"))
            .collect(),
    })?;
    // The plugin's own header-only answer, before anything is allocated or initialised.
    match plugin.compatibility(file.bytes()) {
        Ok(Compatibility::Supported) => {}
        Ok(Compatibility::RebuildRecommended { reason }) => {
            tracing::warn!(blob = %call.blob.display(), plugin = %plugin.info().name, "rebuild recommended: {reason}");
        }
        Ok(Compatibility::Unsupported { reason }) => {
            return Err(Error::Incompatible {
                path: call.blob.clone(),
                plugin: plugin.info().name.clone(),
                reason,
            })
        }
        Err(source) => {
            return Err(Error::Delegate {
                method: method.name.clone(),
                call: index,
                backend: call.backend.clone(),
                stage: "compatibility",
                source,
            })
        }
    }
    // A plugin that does not bind aliased outputs in place gets a separate output slot that the host writes
    // back (copy-back), whatever the program's mode: an in-place slot would hand it one storage twice.
    let mode = if plugin.info().binds_aliases_in_place { mode } else { Mode::CopyBack };

    let layout =
        ArgLayout::new(header, &plan).map_err(|source| Error::Alias { path: call.blob.clone(), source })?;
    if layout.len() != call.args.len() {
        return Err(wrong(
            call.location,
            format!(
                "the call passes {} arguments but blob {} threads {} ({})",
                call.args.len(),
                call.blob.display(),
                layout.len(),
                layout
                    .slots()
                    .iter()
                    .map(|s| format!("{} {}", s.role, s.name))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    let buffer_index =
        |name: &str| buffers.iter().position(|b| b.name == name).expect("manifest checked buffer names");
    let mut args = Vec::with_capacity(layout.len());
    let mut scratch_of = Vec::new();
    let mut used_buffers: Vec<(usize, usize)> = Vec::new(); // (buffer, arg position) of inputs
    for (pos, (slot, arg)) in layout.slots().iter().zip(&call.args).enumerate() {
        let at = call.arg_locations[pos];
        let binding = &header.bindings[slot.binding];
        let (decl, source) = match (slot.role, arg) {
            (Role::Input, ArgRef::Input(name)) => {
                let i =
                    method.inputs.iter().position(|d| d.name == *name).expect("manifest checked input names");
                if slot.is_alias_target() {
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
                let source =
                    if slot.is_alias_target() { ArgSource::BufferInOut(b) } else { ArgSource::BufferRead(b) };
                (buffers[b], source)
            }
            (Role::Output, ArgRef::Buffer(name)) => {
                let b = buffer_index(name);
                let Some(input_arg) = slot.in_place_of() else {
                    return Err(wrong(at, format!(
                        "argument {pos} ('{}') writes buffer '{name}', but the blob aliases no input to that output, so the buffer would not be updated in place",
                        binding.name
                    )));
                };
                // The in-place slot refers to its input's argument, so the input must be pushed first.
                let bound_there = input_arg < pos
                    && matches!(&call.args[input_arg], ArgRef::Buffer(other) if other == name);
                if !bound_there {
                    return Err(wrong(at, format!(
                        "argument {pos} ('{}') is the mutation output of buffer '{name}', so its aliased input '{}' must be bound to buffer '{name}' at an earlier argument",
                        binding.name, layout.slots()[input_arg].name
                    )));
                }
                let source = match mode {
                    Mode::ZeroCopy => ArgSource::BufferInPlace(b),
                    Mode::CopyBack => {
                        scratch_of.push(b);
                        ArgSource::BufferScratch(scratch_of.len() - 1)
                    }
                };
                (buffers[b], source)
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
        let memory = abi_memory(decl.memory);
        let accepted = &plugin.info().memory_kinds;
        if !accepted.contains(&memory) {
            let what = if binding.name == decl.name {
                format!("argument {pos} ('{}')", binding.name)
            } else {
                format!("argument {pos} ('{}', bound to '{}')", binding.name, decl.name)
            };
            return Err(wrong(
                at,
                format!(
                    "{what} is in {memory} memory, but plugin '{}' does not accept {memory} memory (it accepts {})",
                    plugin.info().name,
                    accepted.iter().map(|m| m.name()).collect::<Vec<_>>().join(", ")
                ),
            ));
        }
        let dtype = DTypeCode::try_from(decl.dtype).map_err(|err| wrong(at, err.to_string()))?;
        args.push(ArgPlan { source, dtype, shape: decl.shape.iter().map(|&d| d as i64).collect(), memory });
    }

    Ok(PlannedCall { file, plugin, args, scratch_of })
}

/// Allocates a planned call's copy-back scratch (each of its buffer's memory kind, size and device) and
/// initialises its delegate instance.
fn init_call(
    method: &Method,
    index: usize,
    planned: PlannedCall,
    buffers: &[Buffer],
    contexts: &mut Contexts,
) -> Result<LoadedCall, Error> {
    let PlannedCall { file, plugin, args, scratch_of } = planned;
    let backend = method.calls[index].backend.clone();
    let scratch = scratch_of
        .iter()
        .map(|&b| allocate(&buffers[b].decl, contexts))
        .collect::<Result<Vec<Storage>, Error>>()?;
    let writebacks = scratch_of.iter().copied().enumerate().collect();
    let ctx = InitContext { blob: file.bytes(), compile_specs: &[], runtime_specs: &[] };
    let instance = plugin.init(&ctx).map_err(|source| Error::Delegate {
        method: method.name.clone(),
        call: index,
        backend: backend.clone(),
        stage: "init",
        source,
    })?;
    let arg_list = ArgList::with_capacity(args.len());
    Ok(LoadedCall { backend, instance, args, arg_list, scratch, writebacks })
}
