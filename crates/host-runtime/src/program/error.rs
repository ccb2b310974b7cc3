//! Why a program could not be loaded or run: one variant per cause, each with its ExecuTorch code.

use std::path::PathBuf;

use delegate_abi::host::ArgError;
use delegate_abi::{DelegateError, MemoryKind};
use program_manifest::{BlobSource, Location};

use super::{CopyReason, IoRole};
use crate::buffer::AllocError;
use crate::cuda;

/// Why a program could not be loaded or run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The manifest is unreadable or wrong.
    #[error(transparent)]
    Manifest(#[from] program_manifest::Error),
    /// A blob file could not be read.
    #[error("cannot read blob {blob}: {source}")]
    BlobIo {
        /// Where the blob's bytes are: its file, or a payload inside a program file.
        blob: Box<BlobSource>,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// A blob file is not a valid blob.
    #[error("{blob}: {source}")]
    Blob {
        /// Where the blob's bytes are: its file, or a payload inside a program file.
        blob: Box<BlobSource>,
        /// What is wrong with it.
        source: blob_format::Error,
    },
    /// A blob's alias table breaks the aliasing rules.
    #[error("{blob}: {source}")]
    Alias {
        /// Where the blob's bytes are: its file, or a payload inside a program file.
        blob: Box<BlobSource>,
        /// The broken rule.
        source: alias_validate::Error,
    },
    /// A call's arguments do not fit its blob (count, role, dtype, shape, memory kind, aliasing).
    #[error("{}: method '{method}', call {call}: {message}", at(.manifest, .location))]
    Arguments {
        /// The manifest file the program was read from.
        manifest: PathBuf,
        /// Where the argument (or call) is declared.
        location: Location,
        /// The method's name.
        method: String,
        /// The call's index in the method.
        call: usize,
        /// What does not fit.
        message: String,
    },
    /// No loaded plugin serves a call's backend.
    #[error("{}: no loaded plugin serves backend '{backend}' (loaded: {available}){unavailable}; see `delegate-host plugins`", at(.manifest, .location))]
    NoPlugin {
        /// The manifest file the program was read from.
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
    #[error("{blob}: plugin {plugin} cannot run this blob: {reason}")]
    Incompatible {
        /// Where the blob's bytes are: its file, or a payload inside a program file.
        blob: Box<BlobSource>,
        /// The name the plugin gives itself.
        plugin: String,
        /// The plugin's own explanation.
        reason: String,
    },
    /// A delegate refused or failed a call.
    #[error("method '{method}', call {call} ({backend}): {stage} failed: {source}")]
    Delegate {
        /// The method's name.
        method: String,
        /// The call's index in the method.
        call: usize,
        /// The backend id the call names.
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
        /// The buffer's name in the manifest.
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
        /// The method's name.
        method: String,
        /// Input or output.
        role: IoRole,
        /// Its name in the method's declaration.
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
        /// Its CUDA device ordinal.
        first_device: i32,
        /// A tensor on another device.
        second: String,
        /// Its CUDA device ordinal.
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
        /// The method's name.
        method: String,
        /// Input or output.
        role: IoRole,
        /// Its name in the method's declaration.
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
        /// The method's name.
        method: String,
        /// The run's or the driver's error, as text.
        reason: String,
    },
    /// Reading, zeroing or writing back a device or managed buffer failed.
    #[error("{action} buffer '{buffer}' failed: {source}")]
    BufferAccess {
        /// The buffer's name in the manifest.
        buffer: String,
        /// `reading`, `zeroing` or `writing back`.
        action: &'static str,
        /// What CUDA said.
        source: cuda::Error,
    },
    /// A method reads buffers (KV caches) that an earlier call which writes them failed partway through, so
    /// they may be half-written (`InvalidState`); the method runs again once they are reset
    /// ([`Program::reset`](super::Program::reset) or
    /// [`Program::reset_buffers`](super::Program::reset_buffers)).
    #[error("method '{method}' reads {buffers}, which {failed} may have left half-written when it failed; start a new sequence with Program::reset (or zero them with Program::reset_buffers) before running it again")]
    TornBuffers {
        /// The method refused.
        method: String,
        /// The torn buffers it reads, as `buffer 'k'` or `buffers 'k', 'v'`.
        buffers: String,
        /// The call that failed first, as `method 'decode', call 0 (ReferenceBackend)`.
        failed: String,
    },
    /// A call's argument list could not be built over the program's storages at load (a rank above the
    /// ABI's maximum, a shape that overflows: `InvalidProgram`).
    #[error("method '{method}', call {call}: its arguments cannot be lent to the call: {source}")]
    Lend {
        /// The method's name.
        method: String,
        /// The call's index in the method.
        call: usize,
        /// What the argument list refused.
        source: Box<ArgError>,
    },
    /// A storage of a program with isolated calls could not be shared with the workers: its memory file
    /// could not be duplicated or its device allocation exported (`AccessFailed`).
    #[error("cannot share a buffer with a worker process: {reason}")]
    Share {
        /// What the system or CUDA said.
        reason: String,
    },
    /// Something that needs the program's CUDA stream (a graph, the device loop) was asked of a program that
    /// declares no CUDA memory, so has no stream (`NotSupported`).
    #[error("{what} needs CUDA memory, but the program declares none")]
    NoStream {
        /// What was asked, as `capturing a CUDA graph`.
        what: &'static str,
    },
    /// The generation loop's device state could not be allocated (`MemoryAllocationFailed`, or CUDA's code).
    #[error("allocating the device loop's {what} failed: {source}")]
    LoopMemory {
        /// `token history` or `token count`.
        what: &'static str,
        /// What the allocator or CUDA said.
        source: AllocError,
    },
    /// A tensor the feedback kernel reads or writes has no device address (`Internal`: the link was checked
    /// when it was made).
    #[error("the feedback kernel's {what} has no device address")]
    FeedbackAddress {
        /// The tensor, as `decode method's token input`.
        what: &'static str,
    },
    /// The device loop read back fewer (or more) tokens than it ran steps: a feedback launch was lost
    /// (`Internal`).
    #[error("the device loop produced {tokens} tokens for {steps} steps; a feedback launch was lost")]
    LostFeedback {
        /// Tokens read back (the prefill's included).
        tokens: usize,
        /// Steps run (the prefill's included).
        steps: usize,
    },
    /// A program without a `[generate]` section was asked to generate (`InvalidArgument`).
    #[error("the program has no [generate] section, so `run` cannot drive it")]
    NotAGenerator,
    /// The program's generation convention cannot be followed: its next-token output holds no `i64`, or its
    /// prefill takes the prompt in chunks that do not divide it (`InvalidProgram`).
    #[error("{0}")]
    Generation(String),
    /// The program's caches hold more positions than a plugin serving one of its calls states it supports
    /// (`Capabilities::max_positions`), refused at load before the plugin is initialised (`NotSupported`).
    #[error("method '{method}', {call}: plugin '{plugin}' states the capability max_positions = {most}, but the program's caches hold {needs} positions ([generate] max_positions)")]
    TooManyPositions {
        /// The method's name.
        method: String,
        /// `call N (BACKEND)`.
        call: String,
        /// The plugin's name.
        plugin: String,
        /// The most positions the plugin supports.
        most: u64,
        /// The positions the program's caches hold.
        needs: u64,
    },
    /// A CUDA graph was asked of a method that cannot be captured, refused before anything runs
    /// ([`Program::require_capturable`](super::Program::require_capturable)): a plugin that does not state
    /// the capability, or a call that cannot keep its work on the stream (`NotSupported`).
    #[error("a CUDA graph (--cuda-graph) of method '{method}' is refused at load: {reason}")]
    NotCapturable {
        /// The method's name.
        method: String,
        /// The call, its plugin and why.
        reason: String,
    },
    /// A CUDA graph was asked of a generation the device loop cannot run (`NotSupported`).
    #[error("a CUDA graph needs the device loop, which cannot run: {why}")]
    GraphNeedsDeviceLoop {
        /// Why the device loop cannot run.
        why: String,
    },
    /// Strict zero-copy ([`Mode::RequireZeroCopy`](super::Mode::RequireZeroCopy)): a call would copy cache
    /// bytes on every step, so the program is refused at load (`NotSupported`).
    #[error("method '{method}', {call}: {argument} would be copied on every step: {reason}; strict zero-copy (--require-zero-copy) refuses it")]
    NotZeroCopy {
        /// The method's name.
        method: String,
        /// The call, as `call 0 (ReferenceBackend)`, or the host copy, as `the host copy after call 0`.
        call: String,
        /// The argument, as `argument 4 ('k_cache_out', bound to buffer 'k_cache')`, or the buffer a host
        /// copy reads or writes.
        argument: String,
        /// Why it copies.
        reason: Box<CopyReason>,
    },
    /// The caller's own mistake: a method, input, output or buffer that does not exist, data of the wrong
    /// size, a graph or method id of another program, decode steps that do not fit the caches.
    #[error("{0}")]
    Usage(String),
    /// [`Program::fork`](super::Program::fork) of a program whose calls cannot serve a second sequence
    /// through the same instances: a call in a worker process (its memory was shared once, at start), or an
    /// instance that keeps sequence state of its own, or may (a plugin that does not state
    /// `rewind_fork_without_reinit` and cannot be asked per instance) (`NotSupported`).
    #[error("the program cannot fork its caches: {reason}")]
    NotForkable {
        /// Which call and why.
        reason: String,
    },
    /// [`Program::rewind`](super::Program::rewind), [`Program::restore_cache`](super::Program::restore_cache)
    /// or [`Program::save_cache`](super::Program::save_cache) of a program with a call whose instance keeps sequence state of its own, or may, or runs in a worker
    /// process that cannot be asked: the caches alone do not hold its sequence (`NotSupported`).
    #[error("cannot {action}: {reason}")]
    NotRewindable {
        /// What was asked, as `rewind to position 5` or `restore cache file x.safetensors`.
        action: String,
        /// Which call and why.
        reason: String,
    },
    /// A fork of more positions than the caches hold (`InvalidArgument`).
    #[error("cannot fork the first {prefix} positions: the caches hold {position}")]
    ForkPastPosition {
        /// The positions asked for.
        prefix: u64,
        /// The positions the caches hold ([`Program::position`](super::Program::position)).
        position: u64,
    },
    /// A fork of caches whose position the program does not know: a method ran outside the generation
    /// loops, so the host cannot tell how many rows are valid (`InvalidState`).
    #[error("cannot fork: the program does not know how many positions its caches hold (a method was run directly); declare it with Program::rewind first")]
    PositionUnknown,
    /// A fork of caches a failed run left torn (`InvalidState`).
    #[error("cannot fork {buffers}, which {failed} may have left half-written when it failed; start a new sequence with Program::reset or restore caches first")]
    TornFork {
        /// The torn buffers, as `buffer 'k'` or `buffers 'k', 'v'`.
        buffers: String,
        /// The first failed call.
        failed: String,
    },
    /// A cache file could not be written or read, or was refused ([`Program::save_cache`](super::Program::save_cache),
    /// [`Program::restore_cache`](super::Program::restore_cache)): the causes and their codes are
    /// [`CacheFileProblem`](super::CacheFileProblem)'s.
    #[error("cache file {}: {problem}", path.display())]
    CacheFile {
        /// The file.
        path: Box<std::path::Path>,
        /// What was wrong.
        problem: Box<super::CacheFileProblem>,
    },
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
            Error::Lend { .. } | Error::Generation(_) => ErrorCode::InvalidProgram,
            Error::Share { .. } => ErrorCode::AccessFailed,
            Error::NoStream { .. } | Error::GraphNeedsDeviceLoop { .. } => ErrorCode::NotSupported,
            Error::NotZeroCopy { .. } | Error::NotCapturable { .. } | Error::TooManyPositions { .. } => {
                ErrorCode::NotSupported
            }
            Error::LoopMemory { source, .. } => source.error_code(),
            Error::FeedbackAddress { .. } | Error::LostFeedback { .. } => ErrorCode::Internal,
            Error::NotAGenerator | Error::Usage(_) => ErrorCode::InvalidArgument,
            Error::NotForkable { .. } | Error::NotRewindable { .. } => ErrorCode::NotSupported,
            Error::ForkPastPosition { .. } => ErrorCode::InvalidArgument,
            Error::PositionUnknown | Error::TornFork { .. } => ErrorCode::InvalidState,
            Error::CacheFile { problem, .. } => problem.error_code(),
        }
    }
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
