//! A loaded program: caller-owned buffers, one delegate instance per call, and the argument plan of every call,
//! all checked and prepared before anything runs.
//!
//! Buffers, and method inputs and outputs, live in the memory kind their manifest declares: host memory, or
//! CUDA device, managed or pinned memory (see [`crate::cuda`]); the kind a delegate is told is the kind the
//! storage really is. A program with host memory only never loads the CUDA driver.
//!
//! ## The program's stream
//!
//! A program that declares any CUDA memory owns one CUDA stream, created at load on the device that memory
//! lives on (one device per program). Every call whose plugin accepts device memory (a delegate that runs on
//! the GPU) gets that stream and may return with its work queued on it; copy-back write-backs of device and
//! managed buffers are queued on it too, and so are the generation loop's feedback kernel and graph replays.
//! [`Program::enqueue`] returns with the work queued, [`Program::execute`] when it is complete.
//!
//! The stream invariant, which is what the program promises every delegate it gives the stream
//! (`CudaStream::from_raw`'s contract) and what `crate::cuda`'s unsafe code relies on:
//! - the program owns every storage it queues work on; CUDA memory is freed only after its context has
//!   synchronised, and the program synchronises its stream before it drops anything (and before it drops the
//!   stream);
//! - the host touches no storage while work is queued: every access from the host (`input_mut`, `output`,
//!   `write_input`, `read_output`, `buffer`, `reset_buffers`, host copies of host and pinned write-backs)
//!   synchronises the stream first when work is pending;
//! - a call whose plugin does not accept device memory computes on the host: it gets no stream, and the
//!   program synchronises pending work before calling it.

use std::borrow::Cow;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use alias_validate::ArgLayout;
use blob_format::model::{Dim, DisplayShape, Role};
use blob_format::Blob;
use delegate_abi::host::{ArgList, Instance};
use delegate_abi::{Compatibility, DTypeCode, DelegateError, InitContext, MemoryKind};
use program_manifest::{ArgRef, Location, Manifest, Method, TensorDecl};

use crate::blob_file::BlobFile;
use crate::buffer::{AllocError, Storage};
use crate::cuda::{self, Contexts, FeedbackArgs, FeedbackKernel};
use crate::plugins::{Registry, Served};

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
    #[error("{}: method '{method}', call {call}: {message}", at(.manifest, .location))]
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
    #[error("{}: no loaded plugin serves backend '{backend}' (loaded: {available}){unavailable}; see `delegate-host plugins`", at(.manifest, .location))]
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
    /// A method's user input or output could not be allocated: no CUDA driver or device for a device,
    /// managed or pinned one (`NotSupported`), or the allocation failed (`MemoryAllocationFailed`).
    #[error("method '{method}': {role} '{tensor}' wants {memory} memory but {source}")]
    TensorMemory {
        /// The method.
        method: String,
        /// Input or output.
        role: IoRole,
        /// The input or output.
        tensor: String,
        /// The memory kind it declares.
        memory: MemoryKind,
        /// What the allocator or CUDA said.
        source: AllocError,
    },
    /// The program's CUDA memory is declared on more than one device; a program runs on one
    /// (`NotSupported`).
    #[error("{first} is on CUDA device {first_device} but {second} is on device {second_device}; this host runs a program's CUDA memory on one device")]
    Devices {
        /// The first tensor declared on a device (`buffer 'k'`, `input 'x' of method 'm'`).
        first: String,
        /// Its device.
        first_device: i32,
        /// A tensor on another device.
        second: String,
        /// Its device.
        second_device: i32,
    },
    /// The program's CUDA stream could not be created, synchronised or captured, or work queued on it
    /// failed.
    #[error("{action} the program's CUDA stream failed: {source}")]
    Stream {
        /// `creating`, `synchronising`, `queuing a copy on`, `launching the feedback kernel on`, ...
        action: &'static str,
        /// What CUDA said.
        source: cuda::Error,
    },
    /// A method's input or output was accessed in a way its memory kind does not allow: borrowing device
    /// memory in place (`input_mut`, `output`), or a device address of host memory (`InvalidArgument`).
    #[error("method '{method}': {role} '{tensor}' is in {memory} memory, {problem}")]
    Memory {
        /// The method.
        method: String,
        /// Input or output.
        role: IoRole,
        /// The input or output.
        tensor: String,
        /// The memory kind it lives in.
        memory: MemoryKind,
        /// What cannot be done and what to do instead.
        problem: &'static str,
    },
    /// Capturing a method into a CUDA graph failed: a delegate synchronised, copied synchronously, touched
    /// host memory or computed on the host, so its work cannot be replayed (`NotSupported`).
    #[error("a delegate of method '{method}' did not keep its work on the stream: {reason}")]
    Capture {
        /// The method.
        method: String,
        /// What failed.
        reason: String,
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
    /// A method reads buffers (KV caches) that an earlier call which writes them failed partway through, so
    /// they may be half-written (`InvalidState`); the method runs again once they are reset
    /// ([`Program::reset`] or [`Program::reset_buffers`]).
    #[error("method '{method}' reads {buffers}, which {failed} may have left half-written when it failed; start a new sequence with Program::reset (or zero them with Program::reset_buffers) before running it again")]
    TornBuffers {
        /// The method refused.
        method: String,
        /// The torn buffers it reads, as `buffer 'k'` or `buffers 'k', 'v'`.
        buffers: String,
        /// The call that failed first, as `method 'decode', call 0 (ReferenceBackend)`.
        failed: String,
    },
    /// A method, input, output or buffer named by the caller does not exist or has the wrong size.
    #[error("{0}")]
    Usage(String),
}

/// `path:line:column`, or `path` alone for a program with no text positions (a `.pte`, whose calls are
/// described in the path).
fn at(path: &std::path::Path, location: &Location) -> String {
    if *location == Location::default() {
        path.display().to_string()
    } else {
        format!("{}:{location}", path.display())
    }
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
            Error::TensorMemory { source, .. } => source.error_code(),
            Error::Devices { .. } | Error::Capture { .. } => ErrorCode::NotSupported,
            Error::Stream { source, .. } => source.error_code(),
            Error::Memory { .. } => ErrorCode::InvalidArgument,
            Error::BufferAccess { source, .. } => source.error_code(),
            Error::TornBuffers { .. } => ErrorCode::InvalidState,
            Error::Usage(_) => ErrorCode::InvalidArgument,
        }
    }
}

/// Which side of a method a user tensor is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoRole {
    /// A user input.
    Input,
    /// A user output.
    Output,
}

impl std::fmt::Display for IoRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            IoRole::Input => "input",
            IoRole::Output => "output",
        })
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
    /// Copies made by the trivial operators the host runs for a `.pte` program (`aten::clone.out` into a
    /// method output, a write-back no alias elides: see [`crate::pte`]).
    pub op_bytes: u64,
}

impl CopyStats {
    /// All bytes copied.
    pub fn total(&self) -> u64 {
        self.reflect_bytes + self.staged_bytes + self.writeback_bytes + self.op_bytes
    }

    /// Adds `other`'s bytes, kind by kind, saturating: the counters come from plugins (and their workers),
    /// which may report anything.
    pub fn add(&mut self, other: CopyStats) {
        self.reflect_bytes = self.reflect_bytes.saturating_add(other.reflect_bytes);
        self.staged_bytes = self.staged_bytes.saturating_add(other.staged_bytes);
        self.writeback_bytes = self.writeback_bytes.saturating_add(other.writeback_bytes);
        self.op_bytes = self.op_bytes.saturating_add(other.op_bytes);
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
pub(crate) enum ArgSource {
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
pub(crate) struct ArgPlan {
    pub(crate) source: ArgSource,
    pub(crate) dtype: DTypeCode,
    pub(crate) shape: Vec<i64>,
}

/// Where a call's blob bytes are: its own mapped file (a manifest's call), or a range of a mapped file
/// other calls share (a delegate payload inside a `.pte`), borrowed, never copied.
pub(crate) enum BlobBytes {
    /// The call's own blob file.
    File(BlobFile),
    /// Bytes `range` of a shared file.
    Shared {
        /// The mapped file.
        file: std::sync::Arc<BlobFile>,
        /// The blob's extent in it (checked by the caller to lie inside it).
        range: std::ops::Range<usize>,
    },
}

impl BlobBytes {
    fn bytes(&self) -> &[u8] {
        match self {
            BlobBytes::File(file) => file.bytes(),
            BlobBytes::Shared { file, range } => file.bytes().get(range.clone()).unwrap_or_default(),
        }
    }
}

/// Where a host copy reads or writes: a method's user input or output, or a program buffer (indices into
/// the manifest's declarations, in order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    /// A user input of the method.
    Input(usize),
    /// A user output of the method.
    Output(usize),
    /// A program buffer.
    Buffer(usize),
}

/// A copy the host makes between a method's storages: the trivial operators of a `.pte` program
/// (see [`crate::pte`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HostCopy {
    /// Runs after this delegate call of the method; `None`: before the first.
    pub(crate) after: Option<usize>,
    /// Read from.
    pub(crate) from: Slot,
    /// Written to (the same size, kind and dtype).
    pub(crate) to: Slot,
}

/// What a program loaded from something other than its manifest's files brings along: blobs borrowed
/// from one mapped file, keyed by (method, call index), and host copies per method.
#[derive(Default)]
pub(crate) struct Embedded {
    pub(crate) blobs: std::collections::BTreeMap<(String, usize), BlobBytes>,
    pub(crate) copies: std::collections::BTreeMap<String, Vec<HostCopy>>,
}

/// A call checked against its blob and plugin, not yet initialised.
struct PlannedCall {
    file: BlobBytes,
    plugin: Served,
    args: Vec<ArgPlan>,
    /// The buffer each copy-back scratch slot mirrors, by scratch index.
    scratch_of: Vec<usize>,
    /// Whether the plugin accepts device memory: it runs on the GPU and gets the program's stream.
    streamed: bool,
}

/// Where a call's instance runs.
enum Runner {
    /// In this process.
    InProcess(Instance),
    /// In a worker process.
    #[cfg(target_os = "linux")]
    Isolated(Box<crate::isolate::IsolatedCall>),
    /// Bound for a worker process that starts once the call's argument list exists (at the end of
    /// `Program::load_embedded`, which leaves no call in this state): the plugin and the blob to give it.
    #[cfg(target_os = "linux")]
    Unstarted(Box<crate::isolate::IsolatedPlugin>, BlobBytes),
}

impl Runner {
    fn plugin_name(&self) -> &str {
        match self {
            Runner::InProcess(instance) => &instance.plugin().info().name,
            #[cfg(target_os = "linux")]
            Runner::Isolated(call) => call.name(),
            #[cfg(target_os = "linux")]
            Runner::Unstarted(plugin, _) => &plugin.info.name,
        }
    }
}

struct LoadedCall {
    backend: String,
    runner: Runner,
    args: Vec<ArgPlan>,
    /// The call's arguments, built once at load from the program's storages (whose addresses never change)
    /// and passed as they are to every `execute`: a step pushes nothing and allocates nothing.
    arg_list: ArgList<'static>,
    /// Copy-back output slots, each of its buffer's memory kind, size and device.
    scratch: Vec<Storage>,
    /// (scratch index, buffer index) pairs copied after the call.
    writebacks: Vec<(usize, usize)>,
    /// Whether the plugin runs on the GPU (it accepts device memory), so it gets the program's stream; a
    /// plugin that does not computes on the host and is called with pending work synchronised.
    streamed: bool,
}

struct LoadedMethod {
    decl: Method,
    inputs: Vec<Storage>,
    outputs: Vec<Storage>,
    calls: Vec<LoadedCall>,
    /// Copies the host makes between the calls (a `.pte` program's trivial operators), in order.
    copies: Vec<HostCopy>,
}

impl LoadedMethod {
    /// Whether a call or host copy of the method reads buffer `b` (as an input, in place or by a copy).
    fn reads(&self, b: usize) -> bool {
        let by_call = self.calls.iter().flat_map(|c| &c.args).any(|a| match a.source {
            ArgSource::BufferRead(x) | ArgSource::BufferInOut(x) | ArgSource::BufferInPlace(x) => x == b,
            _ => false,
        });
        by_call || self.copies.iter().any(|c| c.from == Slot::Buffer(b))
    }

    /// The buffers a run of the method may write: in place, by a write-back, or by a host copy.
    fn writes(&self) -> std::collections::BTreeSet<usize> {
        let in_place = self.calls.iter().flat_map(|c| &c.args).filter_map(|a| match a.source {
            ArgSource::BufferInOut(b) | ArgSource::BufferInPlace(b) => Some(b),
            _ => None,
        });
        let written_back = self.calls.iter().flat_map(|c| c.writebacks.iter().map(|&(_, b)| b));
        let copied = self.copies.iter().filter_map(|c| match c.to {
            Slot::Buffer(b) => Some(b),
            _ => None,
        });
        in_place.chain(written_back).chain(copied).collect()
    }

    fn input_index(&self, input: &str) -> Result<usize, Error> {
        self.decl
            .inputs
            .iter()
            .position(|d| d.name == input)
            .ok_or_else(|| Error::Usage(format!("method '{}' has no input '{input}'", self.decl.name)))
    }

    fn output_index(&self, output: &str) -> Result<usize, Error> {
        self.decl
            .outputs
            .iter()
            .position(|d| d.name == output)
            .ok_or_else(|| Error::Usage(format!("method '{}' has no output '{output}'", self.decl.name)))
    }

    /// Whether every call gets the stream and every write-back is queued on it: nothing of the method runs
    /// on, or waits for, the host, so it can be captured into a CUDA graph.
    fn stays_on_stream(&self) -> Result<(), String> {
        if !self.copies.is_empty() {
            return Err(format!(
                "the method has {} copies the host makes between its calls",
                self.copies.len()
            ));
        }
        for (index, call) in self.calls.iter().enumerate() {
            #[cfg(target_os = "linux")]
            if matches!(call.runner, Runner::Isolated(_) | Runner::Unstarted(..)) {
                return Err(format!(
                    "call {index} ({}) is served by plugin '{}' in a worker process, which answers each call \
                     after synchronising its own stream",
                    call.backend,
                    call.runner.plugin_name()
                ));
            }
            if !call.streamed {
                return Err(format!(
                    "call {index} ({}) is served by plugin '{}', which computes on the host (it does not accept device memory)",
                    call.backend,
                    call.runner.plugin_name()
                ));
            }
            if let Some(&(scratch, _)) = call.writebacks.iter().find(|&&(s, _)| call.scratch[s].host_copied())
            {
                return Err(format!(
                    "call {index} ({}) writes back copy-back slot {scratch} in {} memory, which the host copies",
                    call.backend,
                    call.scratch[scratch].memory()
                ));
            }
        }
        Ok(())
    }
}

pub(crate) struct Buffer {
    decl: TensorDecl,
    pub(crate) storage: Storage,
}

/// The program's device and stream, when it declares CUDA memory.
struct Gpu {
    ctx: cuda::Context,
    stream: cuda::Stream,
    /// Whether work may be queued on the stream that the host has not waited for.
    pending: AtomicBool,
}

impl Gpu {
    fn settle(&self) -> Result<(), Error> {
        if self.pending.swap(false, Ordering::AcqRel) {
            self.stream.synchronize().map_err(|source| Error::Stream { action: "synchronising", source })?;
        }
        Ok(())
    }

    fn queued(&self) {
        self.pending.store(true, Ordering::Release);
    }
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

/// Storage for a tensor; host memory in a shared memory file when `shared` (a program with isolated calls).
fn zeroed(
    memory: MemoryKind,
    device: i32,
    len: usize,
    contexts: &mut Contexts,
    shared: bool,
) -> Result<Storage, AllocError> {
    match (memory, shared) {
        #[cfg(target_os = "linux")]
        (MemoryKind::Host, true) => Ok(Storage::Host(crate::buffer::HostStorage::shared(len)?)),
        _ => Storage::zeroed(memory, device, len, contexts),
    }
}

fn allocate(decl: &TensorDecl, contexts: &mut Contexts, shared: bool) -> Result<Storage, Error> {
    let memory = abi_memory(decl.memory);
    zeroed(memory, decl.device, host_size(decl.nbytes()), contexts, shared)
        .map_err(|source| Error::BufferMemory { buffer: decl.name.clone(), memory, source })
}

fn allocate_io(
    method: &Method,
    role: IoRole,
    decls: &[TensorDecl],
    contexts: &mut Contexts,
    shared: bool,
) -> Result<Vec<Storage>, Error> {
    decls
        .iter()
        .map(|d| {
            let memory = abi_memory(d.memory);
            zeroed(memory, d.device, host_size(d.nbytes()), contexts, shared).map_err(|source| {
                Error::TensorMemory {
                    method: method.name.clone(),
                    role,
                    tensor: d.name.clone(),
                    memory,
                    source,
                }
            })
        })
        .collect()
}

/// A size in bytes as this machine can address it; one it cannot (above `usize::MAX`) asks for `usize::MAX`,
/// which every allocator refuses with a typed error.
fn host_size(bytes: u64) -> usize {
    usize::try_from(bytes).unwrap_or(usize::MAX)
}

/// The one CUDA device of the program's CUDA memory (device and managed tensors; pinned memory is portable
/// and counts as device 0 when nothing else names one), or `None` when it declares none.
///
/// # Errors
/// [`Error::Devices`] when two tensors name different devices.
fn program_device(manifest: &Manifest) -> Result<Option<i32>, Error> {
    use program_manifest::MemoryKind as M;
    let buffers = manifest.buffers.values().map(|d| (format!("buffer '{}'", d.name), d));
    let io = manifest.methods.values().flat_map(|m| {
        let inputs = m.inputs.iter().map(move |d| (format!("input '{}' of method '{}'", d.name, m.name), d));
        let outputs =
            m.outputs.iter().map(move |d| (format!("output '{}' of method '{}'", d.name, m.name), d));
        inputs.chain(outputs)
    });
    let mut first: Option<(String, i32)> = None;
    let mut any_pinned = false;
    for (what, decl) in buffers.chain(io) {
        match decl.memory {
            M::Host => {}
            M::Pinned => any_pinned = true,
            M::Device | M::Managed => match &first {
                None => first = Some((what, decl.device)),
                Some((name, device)) if *device != decl.device => {
                    return Err(Error::Devices {
                        first: name.clone(),
                        first_device: *device,
                        second: what,
                        second_device: decl.device,
                    })
                }
                Some(_) => {}
            },
        }
    }
    Ok(first.map(|(_, device)| device).or(any_pinned.then_some(0)))
}

/// Buffers that a failed method run may have left half-written: the host cannot tell how far a call got
/// before its plugin failed or its worker was killed, so every buffer the method writes is suspect until the
/// caller resets ([`Program::reset`]).
#[derive(Debug, Clone)]
struct Torn {
    buffers: std::collections::BTreeSet<usize>,
    /// The first failed call, as `method 'decode', call 0 (ReferenceBackend)`.
    failed: String,
}

/// A program ready to run: buffers allocated and zeroed, every call's delegate initialised.
///
/// ## Torn buffers
///
/// A run that fails (a plugin error, a worker killed at its deadline or by a signal, a failed write-back or
/// host copy) may leave the buffers it writes half-written, and the host cannot tell how far it got: even a
/// call its plugin refused before writing anything counts. Those buffers are marked torn, and every later run of a method that reads one is refused with [`Error::TornBuffers`]
/// (`InvalidState`) until the caller starts a new sequence with [`Program::reset`] (or zeroes the buffers
/// with [`Program::reset_buffers`]): a program never decodes silently from a torn cache.
pub struct Program {
    /// Unique in the process: ties a [`Captured`] graph (whose addresses are this program's) to it.
    id: u64,
    manifest: Manifest,
    mode: Mode,
    buffers: Vec<Buffer>,
    methods: Vec<LoadedMethod>,
    gpu: Option<Gpu>,
    /// Buffers a failed run may have left half-written, until [`Program::reset`].
    torn: Option<Torn>,
}

fn shape_fits(declared: &[Dim], actual: &[u64]) -> bool {
    declared.len() == actual.len()
        && declared.iter().zip(actual).all(|(d, &a)| matches!(d, Dim::Dynamic) || *d == Dim::Static(a))
}

/// A method of a loaded program, looked up once ([`Program::method_id`]) so a loop does not look it up by name
/// every step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MethodId(usize);

/// A method run captured into a CUDA graph ([`Program::capture`]), replayed by [`Program::replay`].
pub struct Captured {
    graph: cuda::Graph,
    program: u64,
    method: MethodId,
    copies: CopyStats,
}

impl std::fmt::Debug for Captured {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Captured")
            .field("graph", &self.graph)
            .field("method", &self.method)
            .field("copies", &self.copies)
            .finish()
    }
}

impl Captured {
    /// The bytes one replay copies (those of the captured run: the graph replays the same copies).
    pub fn copies(&self) -> CopyStats {
        self.copies
    }

    /// How many nodes (kernels, copies) the graph holds.
    pub fn nodes(&self) -> usize {
        self.graph.nodes()
    }
}

/// The generation loop's device-side feedback, between one method's run and the decode method's next one
/// ([`Program::feedback`]): where the token and position come from and go to, resolved once.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FeedbackLink {
    pub from: MethodId,
    pub next_token: usize,
    pub position_from: usize,
    pub rows: i64,
    pub to: MethodId,
    pub token_to: usize,
    pub position_to: usize,
}

/// The device-side state of a generation loop: the feedback kernel and the token history it appends to.
pub(crate) struct DeviceLoop {
    kernel: FeedbackKernel,
    history: Storage,
    length: Storage,
    capacity: u32,
}

impl DeviceLoop {
    /// The tokens the feedback kernel appended (one synchronous read of each: the loop's only host
    /// synchronisations besides the stream's).
    pub(crate) fn tokens(&self) -> Result<Vec<i64>, Error> {
        let access = |source| Error::Stream { action: "reading the token history of", source };
        let length = self.length.read().map_err(access)?;
        let length = u32::from_le_bytes([length[0], length[1], length[2], length[3]]).min(self.capacity);
        let history = self.history.read().map_err(access)?;
        Ok(history
            .chunks_exact(8)
            .take(length as usize)
            .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect())
    }
}

impl Program {
    /// Loads `manifest`'s program: checks every call against its blob and plugin, allocates and zeroes the
    /// buffers and the methods' inputs and outputs, and initialises one delegate instance per call (methods
    /// do not share instances; they share buffers).
    ///
    /// Every call is checked before any memory is allocated or any delegate initialised; then the buffers
    /// are allocated in their declared memory kinds (opening a CUDA context only for device, managed or
    /// pinned memory), then the inputs and outputs, the program's stream (when it declares CUDA memory),
    /// and each call's copy-back scratch and delegate instance.
    ///
    /// # Errors
    /// Besides the argument, plugin and allocation errors: [`Error::Devices`] when the program's CUDA memory
    /// names more than one device.
    pub fn load(manifest: Manifest, registry: &Registry, mode: Mode) -> Result<Program, Error> {
        Program::load_embedded(manifest, registry, mode, Embedded::default())
    }

    /// [`Program::load`] with blobs and host copies from `embedded` (a `.pte` program).
    pub(crate) fn load_embedded(
        manifest: Manifest,
        registry: &Registry,
        mode: Mode,
        mut embedded: Embedded,
    ) -> Result<Program, Error> {
        let device = program_device(&manifest)?;
        let decls: Vec<&TensorDecl> = manifest.buffers.values().collect();
        let mut planned = Vec::with_capacity(manifest.methods.len());
        for method in manifest.methods.values() {
            let calls = (0..method.calls.len())
                .map(|index| {
                    let blob = embedded.blobs.remove(&(method.name.clone(), index));
                    plan_call(&manifest, method, index, blob, &decls, registry, mode)
                })
                .collect::<Result<Vec<_>, Error>>()?;
            planned.push(calls);
        }
        let mut contexts = Contexts::new();
        // A worker process reads and writes the program's host memory in place: it lives in memory files.
        #[cfg(target_os = "linux")]
        let shared = planned.iter().flatten().any(|call| matches!(call.plugin, Served::Isolated(_)));
        #[cfg(not(target_os = "linux"))]
        let shared = false;
        let mut buffers = decls
            .iter()
            .map(|&decl| Ok(Buffer { decl: decl.clone(), storage: allocate(decl, &mut contexts, shared)? }))
            .collect::<Result<Vec<Buffer>, Error>>()?;
        let mut io = Vec::with_capacity(manifest.methods.len());
        for method in manifest.methods.values() {
            let inputs = allocate_io(method, IoRole::Input, &method.inputs, &mut contexts, shared)?;
            let outputs = allocate_io(method, IoRole::Output, &method.outputs, &mut contexts, shared)?;
            io.push((inputs, outputs));
        }
        let gpu = match device {
            None => None,
            Some(device) => {
                let stream_error = |source| Error::Stream { action: "creating", source };
                let ctx = contexts.get(device).map_err(stream_error)?;
                let stream = cuda::Stream::new(&ctx).map_err(stream_error)?;
                Some(Gpu { ctx, stream, pending: AtomicBool::new(false) })
            }
        };
        let mut methods = Vec::with_capacity(manifest.methods.len());
        for ((method, planned), (inputs, outputs)) in manifest.methods.values().zip(planned).zip(io) {
            let mut calls = Vec::with_capacity(planned.len());
            for (index, call) in planned.into_iter().enumerate() {
                calls.push(init_call(method, index, call, &buffers, &mut contexts, shared)?);
            }
            let copies = embedded.copies.remove(&method.name).unwrap_or_default();
            methods.push(LoadedMethod { decl: method.clone(), inputs, outputs, calls, copies });
        }
        for m in &mut methods {
            let LoadedMethod { decl, inputs, outputs, calls, .. } = m;
            for (index, call) in calls.iter_mut().enumerate() {
                call.arg_list =
                    crate::lend::arg_list(&call.args, &mut buffers, inputs, outputs, &mut call.scratch)
                        .map_err(|err| {
                            Error::Usage(format!(
                                "method '{}', call {index}: its arguments cannot be lent to the call: {err}",
                                decl.name
                            ))
                        })?;
            }
        }
        #[cfg(target_os = "linux")]
        if shared {
            start_isolated(&mut methods, &buffers)?;
        }
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        Ok(Program { id, manifest, mode, buffers, methods, gpu, torn: None })
    }

    /// The manifest it was loaded from.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// How mutation outputs are passed.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The CUDA context of the program's device, when it declares CUDA memory.
    pub fn cuda_context(&self) -> Option<&cuda::Context> {
        self.gpu.as_ref().map(|g| &g.ctx)
    }

    /// The program's CUDA stream, when it declares CUDA memory: GPU delegates and the program's own copies
    /// queue their work on it (for timing events, or to order an application's own work after a step).
    pub fn cuda_stream(&self) -> Option<cuda::StreamRef<'_>> {
        self.gpu.as_ref().map(|g| g.stream.as_ref())
    }

    /// Waits for the work queued on the program's stream ([`Program::enqueue`]); a no-op when none is
    /// pending or the program has no stream.
    ///
    /// # Errors
    /// [`Error::Stream`] when queued work failed.
    pub fn synchronize(&self) -> Result<(), Error> {
        self.gpu.as_ref().map_or(Ok(()), Gpu::settle)
    }

    /// A buffer's bytes: borrowed for host-visible memory (managed memory after a context
    /// synchronisation), copied to the host for device memory. Waits for queued work first.
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
        self.synchronize()?;
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

    /// Zeroes every buffer, of every memory kind (a fresh sequence), which also clears the torn mark
    /// ([`Program::reset`]). Waits for queued work first.
    pub fn reset_buffers(&mut self) -> Result<(), Error> {
        self.synchronize()?;
        for buffer in &mut self.buffers {
            buffer.storage.clear().map_err(|source| Error::BufferAccess {
                buffer: buffer.decl.name.clone(),
                action: "zeroing",
                source,
            })?;
        }
        self.torn = None;
        Ok(())
    }

    /// Starts a new sequence: clears the torn mark a failed run left ([`Error::TornBuffers`]) and, for a
    /// token generator, zeroes the `[generate]` position input of its prefill and decode methods, so the next
    /// token is at position 0. Waits for queued work first.
    ///
    /// The buffers themselves are not touched, and need not be: a causal decoder run from position 0 writes
    /// each cache row before it reads it, and rows past the current position are masked from attention, so
    /// whatever a failed call left there is never read (no cache traffic; [`Program::reset_buffers`] zeroes
    /// them when wanted). The caller's part: the next run starts at position 0 ([`crate::generate`] does).
    ///
    /// # Errors
    /// [`Error::Stream`] when waiting for queued work or zeroing a device position input fails.
    pub fn reset(&mut self) -> Result<(), Error> {
        self.synchronize()?;
        if let Some(g) = &self.manifest.generate {
            for method in [&g.prefill, &g.decode] {
                let Some(m) = self.methods.iter_mut().find(|m| &m.decl.name == method) else { continue };
                if let Ok(index) = m.input_index(&g.position_input) {
                    m.inputs[index].clear().map_err(|source| Error::Stream {
                        action: "zeroing a position input through",
                        source,
                    })?;
                }
            }
        }
        self.torn = None;
        Ok(())
    }

    /// The buffers a failed run may have left half-written, by name (empty unless a run failed since the last
    /// [`Program::reset`] or [`Program::reset_buffers`]).
    pub fn torn_buffers(&self) -> Vec<&str> {
        self.torn.iter().flat_map(|t| &t.buffers).map(|&b| self.buffers[b].decl.name.as_str()).collect()
    }

    /// Refuses a run of `method` that would read a torn buffer.
    fn refuse_torn(&self, method: MethodId) -> Result<(), Error> {
        let (Some(torn), Some(m)) = (&self.torn, self.methods.get(method.0)) else { return Ok(()) };
        let read: Vec<String> = torn
            .buffers
            .iter()
            .filter(|&&b| m.reads(b))
            .map(|&b| format!("'{}'", self.buffers[b].decl.name))
            .collect();
        if read.is_empty() {
            return Ok(());
        }
        Err(Error::TornBuffers {
            method: m.decl.name.clone(),
            buffers: format!("{} {}", if read.len() == 1 { "buffer" } else { "buffers" }, read.join(", ")),
            failed: torn.failed.clone(),
        })
    }

    /// Marks the buffers `method` writes as torn after a run of it failed at call `at` (`None`: before its
    /// first call).
    fn tear(&mut self, method: MethodId, at: Option<usize>) {
        let Some(m) = self.methods.get(method.0) else { return };
        let written = m.writes();
        if written.is_empty() {
            return;
        }
        let name = &m.decl.name;
        let failed = match at.and_then(|i| m.calls.get(i).map(|c| (i, c))) {
            Some((i, call)) => format!("method '{name}', call {i} ({})", call.backend),
            None => format!("method '{name}'"),
        };
        match &mut self.torn {
            Some(torn) => torn.buffers.extend(written),
            None => self.torn = Some(Torn { buffers: written, failed }),
        }
    }

    /// The method `name`, for the `_id` variants of the run and I/O functions.
    ///
    /// # Errors
    /// [`Error::Usage`] when the program has no such method.
    pub fn method_id(&self, method: &str) -> Result<MethodId, Error> {
        self.methods
            .iter()
            .position(|m| m.decl.name == method)
            .map(MethodId)
            .ok_or_else(|| Error::Usage(format!("the program has no method '{method}'")))
    }

    fn method(&self, method: &str) -> Result<&LoadedMethod, Error> {
        self.method_id(method).map(|id| &self.methods[id.0])
    }

    /// The memory kind a method's input really lives in.
    pub fn input_memory(&self, method: &str, input: &str) -> Result<MemoryKind, Error> {
        let m = self.method(method)?;
        Ok(m.inputs[m.input_index(input)?].memory())
    }

    /// The memory kind a method's output really lives in.
    pub fn output_memory(&self, method: &str, output: &str) -> Result<MemoryKind, Error> {
        let m = self.method(method)?;
        Ok(m.outputs[m.output_index(output)?].memory())
    }

    /// A user input's bytes in place, to fill before [`Program::execute`]: host, pinned or managed memory
    /// (device memory is written with [`Program::write_input`]). Waits for queued work first.
    ///
    /// # Errors
    /// [`Error::Usage`] for an unknown method or input, [`Error::Memory`] for device memory,
    /// [`Error::Stream`] when waiting fails.
    pub fn input_mut(&mut self, method: &str, input: &str) -> Result<&mut [u8], Error> {
        let id = self.method_id(method)?;
        self.synchronize()?;
        let m = &mut self.methods[id.0];
        let index = m.input_index(input)?;
        let (name, memory) = (&m.decl.name, m.inputs[index].memory());
        let not_visible = || Error::Memory {
            method: name.clone(),
            role: IoRole::Input,
            tensor: input.to_owned(),
            memory,
            problem: "which the host cannot borrow in place; write it with write_input",
        };
        match m.inputs[index].host_slice_mut() {
            Ok(Some(bytes)) => Ok(bytes),
            Ok(None) => Err(not_visible()),
            Err(source) => Err(Error::Stream { action: "synchronising", source }),
        }
    }

    /// A user output's bytes in place, as the last run of `method` left them: host, pinned or managed memory
    /// (device memory is read with [`Program::read_output`]). Waits for queued work first.
    ///
    /// # Errors
    /// As [`Program::input_mut`].
    pub fn output(&self, method: &str, output: &str) -> Result<&[u8], Error> {
        let m = self.method(method)?;
        let index = m.output_index(output)?;
        self.synchronize()?;
        match m.outputs[index].host_slice() {
            Ok(Some(bytes)) => Ok(bytes),
            Ok(None) => Err(Error::Memory {
                method: method.to_owned(),
                role: IoRole::Output,
                tensor: output.to_owned(),
                memory: m.outputs[index].memory(),
                problem: "which the host cannot borrow in place; read it with read_output",
            }),
            Err(source) => Err(Error::Stream { action: "synchronising", source }),
        }
    }

    /// Overwrites a user input with `data` (exactly its size), in any memory kind: a host copy, or a
    /// synchronous copy to device memory. Waits for queued work first.
    ///
    /// # Errors
    /// [`Error::Usage`] for an unknown method or input or a wrong size; [`Error::Stream`] when CUDA fails.
    pub fn write_input(&mut self, method: &str, input: &str, data: &[u8]) -> Result<(), Error> {
        let id = self.method_id(method)?;
        self.synchronize()?;
        let m = &mut self.methods[id.0];
        let index = m.input_index(input)?;
        let storage = &mut m.inputs[index];
        if storage.len() != data.len() {
            return Err(Error::Usage(format!(
                "method '{method}': input '{input}' holds {} bytes, {} were given",
                storage.len(),
                data.len()
            )));
        }
        storage.write(data).map_err(|source| Error::Stream { action: "writing an input through", source })
    }

    /// A user output's bytes, in any memory kind: borrowed for host-visible memory, copied from device
    /// memory. Waits for queued work first.
    ///
    /// # Errors
    /// [`Error::Usage`] for an unknown method or output; [`Error::Stream`] when CUDA fails.
    pub fn read_output(&self, method: &str, output: &str) -> Result<Cow<'_, [u8]>, Error> {
        let m = self.method(method)?;
        let index = m.output_index(output)?;
        self.synchronize()?;
        m.outputs[index]
            .read()
            .map_err(|source| Error::Stream { action: "reading an output through", source })
    }

    /// The device address of a method's input in device or managed memory (for kernels an application
    /// queues on [`Program::cuda_stream`]).
    ///
    /// # Errors
    /// [`Error::Usage`] for an unknown method or input, [`Error::Memory`] for host or pinned memory.
    pub fn input_ptr(&self, method: &str, input: &str) -> Result<cuda::DevicePtr, Error> {
        let m = self.method(method)?;
        let storage = &m.inputs[m.input_index(input)?];
        storage.device_ptr().ok_or_else(|| Error::Memory {
            method: method.to_owned(),
            role: IoRole::Input,
            tensor: input.to_owned(),
            memory: storage.memory(),
            problem: "which has no device address",
        })
    }

    /// The device address of a method's output in device or managed memory.
    ///
    /// # Errors
    /// As [`Program::input_ptr`].
    pub fn output_ptr(&self, method: &str, output: &str) -> Result<cuda::DevicePtr, Error> {
        let m = self.method(method)?;
        let storage = &m.outputs[m.output_index(output)?];
        storage.device_ptr().ok_or_else(|| Error::Memory {
            method: method.to_owned(),
            role: IoRole::Output,
            tensor: output.to_owned(),
            memory: storage.memory(),
            problem: "which has no device address",
        })
    }

    /// Runs `method` once, complete on return: [`Program::enqueue`], then [`Program::synchronize`].
    ///
    /// # Errors
    /// As [`Program::enqueue_id`]; work that fails on the stream after it was queued tears the buffers the
    /// method writes too.
    pub fn execute(&mut self, method: &str) -> Result<RunStats, Error> {
        let start = Instant::now();
        let id = self.method_id(method)?;
        let copies = self.enqueue_id(id)?.copies;
        if let Err(err) = self.synchronize() {
            self.tear(id, None);
            return Err(err);
        }
        Ok(RunStats { elapsed: start.elapsed(), copies })
    }

    /// Queues `method` once: its delegate calls in order, then the write-backs copy-back mode needs. GPU
    /// delegates and device write-backs may still be running on the program's stream when this returns (a
    /// program without CUDA memory is complete on return); every host access of the program's memory waits
    /// for them, and so does [`Program::synchronize`]. `elapsed` is the host time of queuing.
    pub fn enqueue(&mut self, method: &str) -> Result<RunStats, Error> {
        let id = self.method_id(method)?;
        self.enqueue_id(id)
    }

    /// [`Program::enqueue`] of a method looked up once.
    ///
    /// # Errors
    /// [`Error::TornBuffers`] when the method reads a buffer a failed run left torn (see [`Program`]); a
    /// run that fails itself marks the buffers the method writes as torn.
    pub fn enqueue_id(&mut self, method: MethodId) -> Result<RunStats, Error> {
        self.refuse_torn(method)?;
        let mut at = None;
        let run = self.run_method(method, &mut at);
        if run.is_err() {
            self.tear(method, at);
        }
        run
    }

    /// Queues the method's calls, write-backs and host copies; `at` is the call reached.
    fn run_method(&mut self, method: MethodId, at: &mut Option<usize>) -> Result<RunStats, Error> {
        let start = Instant::now();
        let buffers = &mut self.buffers;
        let gpu = self.gpu.as_ref();
        let m = self.methods.get_mut(method.0).ok_or_else(|| Error::Usage("no such method".into()))?;
        let mut copies = CopyStats::default();
        let LoadedMethod { decl, inputs, outputs, calls, copies: host_copies } = m;
        run_host_copies(host_copies, None, buffers, inputs, outputs, gpu, &mut copies)?;
        for (index, call) in calls.iter_mut().enumerate() {
            *at = Some(index);
            let stream = match gpu {
                Some(gpu) if call.streamed => Some(cuda::abi_stream(&gpu.stream)),
                Some(gpu) => {
                    gpu.settle()?;
                    None
                }
                None => None,
            };
            // The list was built at load from these storages; `&mut self` keeps every other access off them.
            let result = match &mut call.runner {
                Runner::InProcess(instance) => instance.execute(&mut call.arg_list, stream),
                #[cfg(target_os = "linux")]
                Runner::Isolated(worker) => worker.execute(),
                #[cfg(target_os = "linux")]
                Runner::Unstarted(..) => Err(DelegateError::internal("the isolated call was never started")),
            };
            if let (Some(gpu), Some(_)) = (gpu, stream) {
                gpu.queued();
            }
            let stats = result.map_err(|source| Error::Delegate {
                method: decl.name.clone(),
                call: index,
                backend: call.backend.clone(),
                stage: "execute",
                source,
            })?;
            copies.add(CopyStats {
                reflect_bytes: stats.reflect_bytes,
                staged_bytes: stats.staged_bytes,
                writeback_bytes: 0,
                op_bytes: 0,
            });
            for &(scratch, buffer) in &call.writebacks {
                let buffer = &mut buffers[buffer];
                let copied = match gpu {
                    Some(gpu) if !buffer.storage.host_copied() => {
                        let copied = buffer.storage.copy_from_on(&call.scratch[scratch], &gpu.stream);
                        gpu.queued();
                        copied
                    }
                    Some(gpu) => {
                        gpu.settle()?;
                        buffer.storage.copy_from(&call.scratch[scratch])
                    }
                    None => buffer.storage.copy_from(&call.scratch[scratch]),
                };
                copies.writeback_bytes += copied.map_err(|source| Error::BufferAccess {
                    buffer: buffer.decl.name.clone(),
                    action: "writing back",
                    source,
                })?;
            }
            run_host_copies(host_copies, Some(index), buffers, inputs, outputs, gpu, &mut copies)?;
        }
        Ok(RunStats { elapsed: start.elapsed(), copies })
    }

    fn gpu(&self, what: &str) -> Result<&Gpu, Error> {
        self.gpu
            .as_ref()
            .ok_or_else(|| Error::Usage(format!("{what} needs CUDA memory, but the program declares none")))
    }

    /// Captures one [`Program::enqueue`] of `method` into a CUDA graph, without running it; replay it with
    /// [`Program::replay`]. Every call of the method must run on the GPU and keep all its work on the
    /// program's stream (no synchronisation, no synchronous copy, no host memory).
    ///
    /// # Errors
    /// [`Error::Capture`] naming what did not stay on the stream; [`Error::Usage`] without CUDA memory.
    pub fn capture(&mut self, method: &str) -> Result<Captured, Error> {
        let id = self.method_id(method)?;
        self.capture_with(id, None)
    }

    /// Why `method` cannot be captured into a CUDA graph (a call that computes on the host or in a worker
    /// process, or copies the host makes), or `None` when it can.
    ///
    /// # Errors
    /// [`Error::Usage`] for an unknown method.
    pub fn capture_refusal(&self, method: &str) -> Result<Option<String>, Error> {
        Ok(self.method(method)?.stays_on_stream().err())
    }

    /// Captures `method` and, when given, the feedback after it, into one graph.
    pub(crate) fn capture_with(
        &mut self,
        method: MethodId,
        feedback: Option<(&FeedbackLink, &DeviceLoop)>,
    ) -> Result<Captured, Error> {
        let name = self.methods[method.0].decl.name.clone();
        let capture_error = |reason: String| Error::Capture { method: name.clone(), reason };
        let gpu = self.gpu("capturing a CUDA graph")?;
        self.methods[method.0].stays_on_stream().map_err(capture_error)?;
        self.refuse_torn(method)?;
        gpu.stream
            .begin_capture()
            .map_err(|source| Error::Stream { action: "beginning a capture on", source })?;
        // Captured, not run: a failure here writes nothing, so it tears nothing.
        let mut run = self.run_method(method, &mut None);
        if let (Ok(_), Some((link, device))) = (&run, feedback) {
            if let Err(err) = self.feedback(link, device) {
                run = Err(err);
            }
        }
        let gpu = self.gpu("capturing a CUDA graph")?;
        let ended = gpu.stream.end_capture();
        match (run, ended) {
            (Ok(stats), Ok(graph)) => Ok(Captured { graph, program: self.id, method, copies: stats.copies }),
            (Err(err), _) => Err(capture_error(err.to_string())),
            (Ok(_), Err(err)) => Err(capture_error(err.to_string())),
        }
    }

    /// Queues one replay of a captured method run on the program's stream: one driver call.
    ///
    /// # Errors
    /// [`Error::Usage`] for a graph another program captured (its addresses are that program's memory);
    /// [`Error::Stream`] when the driver refuses.
    pub fn replay(&mut self, captured: &Captured) -> Result<CopyStats, Error> {
        if captured.program != self.id {
            return Err(Error::Usage(
                "the graph was captured by another program, whose memory it uses".into(),
            ));
        }
        self.refuse_torn(captured.method)?;
        let gpu = self.gpu("replaying a CUDA graph")?;
        cuda::replay(&captured.graph, &gpu.stream)
            .map_err(|source| Error::Stream { action: "replaying a graph on", source })?;
        gpu.queued();
        Ok(captured.copies)
    }

    /// The generation loop's device state: the feedback kernel (compiled once per process) and a token
    /// history of `capacity` tokens, zeroed.
    pub(crate) fn device_loop(&mut self, capacity: u32) -> Result<DeviceLoop, Error> {
        let gpu = self.gpu("generating on the device")?;
        let failed = |source| Error::Stream { action: "preparing the device loop for", source };
        let kernel = FeedbackKernel::new(&gpu.ctx).map_err(failed)?;
        let mut contexts = Contexts::new();
        let device = gpu.ctx.ordinal();
        let zeroed = |bytes: usize, contexts: &mut Contexts| {
            Storage::zeroed(MemoryKind::Device, device, bytes, contexts).map_err(|err| match err {
                AllocError::Cuda(source) => failed(source),
                AllocError::Host { bytes } => Error::Usage(format!("cannot allocate {bytes} bytes")),
            })
        };
        let history = zeroed(capacity as usize * 8, &mut contexts)?;
        let length = zeroed(4, &mut contexts)?;
        Ok(DeviceLoop { kernel, history, length, capacity })
    }

    /// Resolves a feedback link between `from`'s next-token output and position input and `to`'s token and
    /// position inputs, checking that all four are device or managed memory.
    pub(crate) fn feedback_link(
        &self,
        from: &str,
        next_token: &str,
        rows: i64,
        to: &str,
        token_input: &str,
        position_input: &str,
    ) -> Result<FeedbackLink, Error> {
        let (from_id, to_id) = (self.method_id(from)?, self.method_id(to)?);
        let (f, t) = (&self.methods[from_id.0], &self.methods[to_id.0]);
        let link = FeedbackLink {
            from: from_id,
            next_token: f.output_index(next_token)?,
            position_from: f.input_index(position_input)?,
            rows,
            to: to_id,
            token_to: t.input_index(token_input)?,
            position_to: t.input_index(position_input)?,
        };
        self.output_ptr(from, next_token)?;
        self.input_ptr(from, position_input)?;
        self.input_ptr(to, token_input)?;
        self.input_ptr(to, position_input)?;
        Ok(link)
    }

    /// Queues the feedback kernel for `link` on the program's stream.
    pub(crate) fn feedback(&mut self, link: &FeedbackLink, device: &DeviceLoop) -> Result<(), Error> {
        let gpu = self.gpu("generating on the device")?;
        let (f, t) = (&self.methods[link.from.0], &self.methods[link.to.0]);
        let address = |storage: &Storage| {
            storage
                .device_ptr()
                .ok_or_else(|| Error::Usage("a feedback tensor lost its device memory".into()))
        };
        let args = FeedbackArgs {
            next_token: address(&f.outputs[link.next_token])?,
            position_from: address(&f.inputs[link.position_from])?,
            rows: link.rows,
            token_to: address(&t.inputs[link.token_to])?,
            position_to: address(&t.inputs[link.position_to])?,
            history: address(&device.history)?,
            length: address(&device.length)?,
            capacity: device.capacity,
        };
        device
            .kernel
            .launch(&gpu.stream, args)
            .map_err(|source| Error::Stream { action: "launching the feedback kernel on", source })?;
        gpu.queued();
        Ok(())
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        // The stream invariant: nothing is freed while work queued on the stream may still use it.
        if let Err(err) = self.synchronize() {
            tracing::warn!("{err}");
        }
    }
}

/// One storage read and another written, of the same method's slots or the program's buffers.
fn copy_between(
    buffers: &mut [Buffer],
    inputs: &mut [Storage],
    outputs: &mut [Storage],
    from: Slot,
    to: Slot,
) -> Result<u64, cuda::Error> {
    fn pair<T>(items: &mut [T], from: usize, to: usize) -> (&T, &mut T) {
        if from < to {
            let (low, high) = items.split_at_mut(to);
            (&low[from], &mut high[0])
        } else {
            let (low, high) = items.split_at_mut(from);
            (&high[0], &mut low[to])
        }
    }
    if from == to {
        return Ok(0);
    }
    match (from, to) {
        (Slot::Input(a), Slot::Input(b)) => {
            let (src, dst) = pair(inputs, a, b);
            dst.copy_from(src)
        }
        (Slot::Output(a), Slot::Output(b)) => {
            let (src, dst) = pair(outputs, a, b);
            dst.copy_from(src)
        }
        (Slot::Buffer(a), Slot::Buffer(b)) => {
            let (src, dst) = pair(buffers, a, b);
            dst.storage.copy_from(&src.storage)
        }
        (Slot::Input(a), Slot::Output(b)) => outputs[b].copy_from(&inputs[a]),
        (Slot::Input(a), Slot::Buffer(b)) => buffers[b].storage.copy_from(&inputs[a]),
        (Slot::Output(a), Slot::Input(b)) => inputs[b].copy_from(&outputs[a]),
        (Slot::Output(a), Slot::Buffer(b)) => buffers[b].storage.copy_from(&outputs[a]),
        (Slot::Buffer(a), Slot::Input(b)) => inputs[b].copy_from(&buffers[a].storage),
        (Slot::Buffer(a), Slot::Output(b)) => outputs[b].copy_from(&buffers[a].storage),
    }
}

/// Runs the host copies placed after call `after`, counting a copy into a buffer as a write-back and any
/// other as an operator's copy. Pending GPU work is waited for first (the host touches the memory).
fn run_host_copies(
    host_copies: &[HostCopy],
    after: Option<usize>,
    buffers: &mut [Buffer],
    inputs: &mut [Storage],
    outputs: &mut [Storage],
    gpu: Option<&Gpu>,
    copies: &mut CopyStats,
) -> Result<(), Error> {
    for copy in host_copies.iter().filter(|c| c.after == after) {
        if let Some(gpu) = gpu {
            gpu.settle()?;
        }
        let copied = copy_between(buffers, inputs, outputs, copy.from, copy.to)
            .map_err(|source| Error::Stream { action: "copying between storages through", source })?;
        match copy.to {
            Slot::Buffer(_) => copies.writeback_bytes += copied,
            _ => copies.op_bytes += copied,
        }
    }
    Ok(())
}

/// Checks call `index` of `method` against its blob and the plugin serving it, and plans its arguments.
/// Allocates no buffer memory and initialises no delegate.
fn plan_call(
    manifest: &Manifest,
    method: &Method,
    index: usize,
    blob: Option<BlobBytes>,
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
    let file = match blob {
        Some(bytes) => bytes,
        None => match &call.blob_root {
            Some(root) => BlobFile::open_beneath(root, &call.blob),
            None => BlobFile::open(&call.blob),
        }
        .map(BlobBytes::File)
        .map_err(|source| Error::BlobIo { path: call.blob.clone(), source })?,
    };
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
    let plugin = registry.served(&call.backend).ok_or_else(|| Error::NoPlugin {
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
    // The plugin's own header-only answer, before anything is allocated or initialised (an isolated plugin
    // gives it in its worker, before its init).
    let compatibility = match &plugin {
        Served::InProcess(plugin) => plugin.compatibility(file.bytes()),
        #[cfg(target_os = "linux")]
        Served::Isolated(_) => Ok(Compatibility::Supported),
    };
    match compatibility {
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
        #[cfg(target_os = "linux")]
        if matches!(plugin, Served::Isolated(_)) && !matches!(memory, MemoryKind::Host | MemoryKind::Device) {
            return Err(wrong(
                at,
                format!(
                    "argument {pos} ('{}') is in {memory} memory, but plugin '{}' runs isolated in a worker \
                     process, which shares host and device memory only",
                    binding.name,
                    plugin.info().name
                ),
            ));
        }
        let dtype = DTypeCode::try_from(decl.dtype).map_err(|err| wrong(at, err.to_string()))?;
        args.push(ArgPlan { source, dtype, shape: decl.shape.iter().map(|&d| d as i64).collect() });
    }

    let streamed = match &plugin {
        Served::InProcess(plugin) => plugin.info().memory_kinds.contains(&MemoryKind::Device),
        #[cfg(target_os = "linux")]
        Served::Isolated(_) => false,
    };
    Ok(PlannedCall { file, plugin, args, scratch_of, streamed })
}

/// Starts the worker of every isolated call, now that its argument list exists: the worker gets the list's
/// memory files and rebuilds the list over them.
#[cfg(target_os = "linux")]
fn start_isolated(methods: &mut [LoadedMethod], buffers: &[Buffer]) -> Result<(), Error> {
    use crate::isolate::{IsolatedCall, Region};
    let mut regions = Vec::new();
    {
        let storages = buffers.iter().map(|b| &b.storage).chain(methods.iter().flat_map(|m| {
            m.inputs.iter().chain(&m.outputs).chain(m.calls.iter().flat_map(|c| c.scratch.iter()))
        }));
        for storage in storages {
            if let Some(region) = Region::of(storage) {
                regions
                    .push(region.map_err(|err| {
                        Error::Usage(format!("cannot share a buffer with a worker: {err}"))
                    })?);
            }
        }
    }
    for m in methods {
        for (index, call) in m.calls.iter_mut().enumerate() {
            let Runner::Unstarted(plugin, blob) = &call.runner else { continue };
            let started = IsolatedCall::start((**plugin).clone(), blob.bytes(), &call.arg_list, &regions);
            call.runner = Runner::Isolated(Box::new(started.map_err(|source| Error::Delegate {
                method: m.decl.name.clone(),
                call: index,
                backend: call.backend.clone(),
                stage: "init",
                source,
            })?));
        }
    }
    Ok(())
}

/// Allocates a planned call's copy-back scratch (each of its buffer's memory kind, size and device) and
/// initialises its delegate instance.
fn init_call(
    method: &Method,
    index: usize,
    planned: PlannedCall,
    buffers: &[Buffer],
    contexts: &mut Contexts,
    shared: bool,
) -> Result<LoadedCall, Error> {
    let PlannedCall { file, plugin, args, scratch_of, streamed } = planned;
    let backend = method.calls[index].backend.clone();
    let scratch = scratch_of
        .iter()
        .map(|&b| allocate(&buffers[b].decl, contexts, shared))
        .collect::<Result<Vec<Storage>, Error>>()?;
    let writebacks = scratch_of.iter().copied().enumerate().collect();
    let arg_list = ArgList::with_capacity(args.len());
    let plugin = match plugin {
        Served::InProcess(plugin) => plugin,
        #[cfg(target_os = "linux")]
        Served::Isolated(plugin) => {
            let runner = Runner::Unstarted(Box::new(plugin), file);
            return Ok(LoadedCall { backend, runner, args, arg_list, scratch, writebacks, streamed });
        }
    };
    let ctx = InitContext { blob: file.bytes(), compile_specs: &[], runtime_specs: &[] };
    let instance = plugin.init(&ctx).map_err(|source| Error::Delegate {
        method: method.name.clone(),
        call: index,
        backend: backend.clone(),
        stage: "init",
        source,
    })?;
    Ok(LoadedCall {
        backend,
        runner: Runner::InProcess(instance),
        args,
        arg_list,
        scratch,
        writebacks,
        streamed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_stays_small_enough_to_return_everywhere() {
        // clippy's `result_large_err` threshold is 128 bytes.
        assert!(std::mem::size_of::<Error>() < 128, "{} bytes", std::mem::size_of::<Error>());
    }
}
