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

mod attached;
mod error;
mod fork;
mod graph;
mod io;
#[cfg_attr(not(target_os = "linux"), path = "isolated_disabled.rs")]
mod isolated;
mod lifecycle;
mod load;
mod origin;
mod plan;
mod run;
mod torn;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use delegate_abi::host::{ArgList, Instance};
use program_manifest::{Manifest, Method, TensorDecl};

pub(crate) use attached::{Attached, BlobBytes, CopySlot, HostCopy};
pub use error::Error;
pub use fork::{Caches, Fork};
pub use graph::Captured;
pub use lifecycle::{CacheFileProblem, SavedCache, CACHE_FORMAT_VERSION};
pub use origin::Origin;
pub use plan::CopyReason;

use crate::buffer::Storage;
use crate::cuda;
use crate::lend::ArgPlan;
use torn::Torn;

/// How a buffer-mutation output slot is passed to the delegate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// The output slot is the buffer's own storage: the delegate updates it in place, nothing is copied.
    #[default]
    ZeroCopy,
    /// Upstream's behaviour: a separate output slot, the delegate reflects into it, the host writes it back.
    CopyBack,
    /// Strict zero-copy: [`Mode::ZeroCopy`], and the program is refused at load ([`Error::NotZeroCopy`],
    /// naming the method, call, argument and [`CopyReason`]) when any call would still copy cache bytes on
    /// every step: a buffer staged because the plugin does not update its memory kind in place, a reflect and
    /// write-back because the plugin does not bind aliases in place, a `.pte`'s host copy into or out of a
    /// buffer. Copies of method inputs and outputs (a token staged to the GPU) are not cache bytes and stay
    /// allowed; [`CopyStats`] still counts them.
    RequireZeroCopy,
}

impl Mode {
    /// `"zero-copy"` or `"copy-back"`, as `delegate-host --mode` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Mode::ZeroCopy => "zero-copy",
            Mode::CopyBack => "copy-back",
            Mode::RequireZeroCopy => "require-zero-copy",
        }
    }

    /// Whether a call that would copy cache bytes per step is refused at load ([`Mode::RequireZeroCopy`]).
    pub fn is_strict(self) -> bool {
        self == Mode::RequireZeroCopy
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

/// Where a call's delegate instance runs.
enum CallInstance {
    /// In this process.
    InProcess(Instance),
    /// In a worker process.
    Isolated(isolated::Started),
    /// Bound for a worker process that starts once the call's argument list exists (at the end of loading,
    /// which leaves no call in this state).
    Unstarted(Box<isolated::Unstarted>),
}

impl CallInstance {
    fn plugin_name(&self) -> &str {
        match self {
            CallInstance::InProcess(instance) => &instance.plugin().info().name,
            CallInstance::Isolated(call) => isolated::started_name(call),
            CallInstance::Unstarted(unstarted) => unstarted.name(),
        }
    }
}

/// A call ready to run: its delegate instance and its argument list over the program's storages.
struct LoadedCall {
    /// The backend id the call names, for messages.
    backend: String,
    instance: CallInstance,
    /// How each argument is filled, in order.
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

/// A method ready to run: its user inputs and outputs allocated, its calls loaded.
struct LoadedMethod {
    decl: Method,
    /// The user inputs' storages, in the manifest's order.
    inputs: Vec<Storage>,
    /// The user outputs' storages, in the manifest's order.
    outputs: Vec<Storage>,
    calls: Vec<LoadedCall>,
    /// Copies the host makes between the calls (a `.pte` program's trivial operators), in order.
    copies: Vec<HostCopy>,
}

impl LoadedMethod {
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
}

/// A program buffer (a KV cache): its declaration and its storage.
pub(crate) struct Buffer {
    decl: TensorDecl,
    pub(crate) storage: Storage,
}

impl AsMut<Storage> for Buffer {
    fn as_mut(&mut self) -> &mut Storage {
        &mut self.storage
    }
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

/// A program ready to run: buffers allocated and zeroed, every call's delegate initialised.
///
/// ## Torn buffers
///
/// A run that fails (a plugin error, a worker killed at its deadline or by a signal, a failed write-back or
/// host copy) may leave the buffers it writes half-written, and the host cannot tell how far it got: even a
/// call its plugin refused before writing anything counts. Those buffers are marked torn, and every later run of a method that reads one is refused with [`Error::TornBuffers`]
/// (`InvalidState`) until the caller starts a new sequence with [`Program::reset`] (or zeroes the buffers
/// with [`Program::reset_buffers`]) or restores saved caches ([`Program::restore_cache`]); a rewind does not
/// end it (the failed run may have written any row): a program never decodes silently from a torn cache.
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
    /// SHA-256 of each call's blob (`method/call index`), hashed once at load: what a cache file is tied to.
    blob_identity: BTreeMap<String, String>,
    /// The positions the caches hold, when the program knows ([`Program::position`]).
    position: Option<u64>,
    /// How many times [`Program::swap_caches`] changed the caches' addresses: ties a [`Captured`] graph to
    /// the caches it was captured with.
    cache_epoch: u64,
    /// Where the program came from ([`Program::origin`]).
    origin: Origin,
}

/// A method of a loaded program, looked up once ([`Program::method_id`]) so a loop does not look it up by name
/// every step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MethodId(usize);

impl Program {
    /// Where the program came from: a `.pte` ([`crate::pte::load`]) or a manifest ([`Program::load`]).
    pub fn origin(&self) -> Origin {
        self.origin
    }

    /// The positions the caches hold, when the program knows: `Some(0)` after load, [`Program::reset`] and
    /// [`Program::reset_buffers`]; the position given to [`Program::rewind`] (the caller's word), restored by
    /// [`Program::restore_cache`] or forked ([`Program::fork`]); the end of a successful
    /// [`crate::generate::generate_with`] or [`crate::generate::continue_from`]. `None` (unknown) after a
    /// method was run directly ([`Program::execute`], [`Program::enqueue`], [`Program::replay`]): the host
    /// does not know how many rows a method writes. [`Program::fork`] refuses an unknown position.
    pub fn position(&self) -> Option<u64> {
        self.position
    }

    /// Records the positions the caches hold (the generation loops, at their end).
    pub(crate) fn set_position(&mut self, position: Option<u64>) {
        self.position = position;
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

    /// The program's device and stream, or [`Error::NoStream`] naming `what` needed them.
    fn gpu(&self, what: &'static str) -> Result<&Gpu, Error> {
        self.gpu.as_ref().ok_or(Error::NoStream { what })
    }

    /// Unique in the process: what ties a graph or a generation loop's feedback to the program whose
    /// addresses it holds.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Queues work on the program's stream with `queue`, marking it pending; `what` names the work for
    /// [`Error::NoStream`] and `action` for the [`Error::Stream`] a failure becomes.
    pub(crate) fn queue_on_stream(
        &self,
        what: &'static str,
        action: &'static str,
        queue: impl FnOnce(&cuda::Stream) -> Result<(), cuda::Error>,
    ) -> Result<(), Error> {
        let gpu = self.gpu(what)?;
        queue(&gpu.stream).map_err(|source| Error::Stream { action, source })?;
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
