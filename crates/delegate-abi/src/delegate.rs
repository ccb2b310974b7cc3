//! The safe trait a plugin author implements, and the safe views of what crosses the boundary.
//!
//! Everything here is plain Rust: the FFI glue that turns an implementation into an exported plugin is
//! written by [`crate::export_delegate!`], and the host drives plugins through [`crate::host`].

use std::fmt;

pub use et_error::ErrorCode;

use crate::capabilities::Capabilities;
use crate::tensor::{DTypeCode, MemoryKind, TensorArg};

/// An error a delegate returns: an ExecuTorch code and a message that names what was wrong.
///
/// Crosses the ABI as `(code, message)`; the message is allocated and freed by the same side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DelegateError {
    /// ExecuTorch's code for the failure.
    pub code: ErrorCode,
    /// What was wrong and where, for a person.
    pub message: String,
}

impl DelegateError {
    /// An error with the given code and message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> DelegateError {
        DelegateError { code, message: message.into() }
    }

    /// `InvalidArgument`: a call argument is wrong (count, dtype, shape, memory kind).
    pub fn invalid_argument(message: impl Into<String>) -> DelegateError {
        DelegateError::new(ErrorCode::InvalidArgument, message)
    }

    /// `InvalidProgram`: the blob or its alias table is wrong.
    pub fn invalid_program(message: impl Into<String>) -> DelegateError {
        DelegateError::new(ErrorCode::InvalidProgram, message)
    }

    /// `NotSupported`: this build, device or library cannot do it.
    pub fn not_supported(message: impl Into<String>) -> DelegateError {
        DelegateError::new(ErrorCode::NotSupported, message)
    }

    /// `Internal`: a bug.
    pub fn internal(message: impl Into<String>) -> DelegateError {
        DelegateError::new(ErrorCode::Internal, message)
    }
}

impl fmt::Display for DelegateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code.name(), self.message)
    }
}

impl std::error::Error for DelegateError {}

/// Any typed error with an ExecuTorch code becomes a [`DelegateError`] with that code and its message, so
/// `?` works on a plugin's own error type in `init` and `execute`.
///
/// (It replaces a `From<&E>`: both cannot coexist, since `&E` is itself an error when `E` is. For an error
/// you keep, convert a clone or build the error with [`DelegateError::new`].)
impl<E: et_error::HasErrorCode + std::error::Error> From<E> for DelegateError {
    fn from(err: E) -> DelegateError {
        DelegateError::new(err.error_code(), err.to_string())
    }
}

/// A header-only answer to "can you run this blob?", given before any `init`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Compatibility {
    /// The delegate can run it as is.
    Supported,
    /// The delegate can run it, but rebuilding the blob would serve better (e.g. an older engine version).
    RebuildRecommended {
        /// Why a rebuild is recommended.
        reason: String,
    },
    /// The delegate cannot run it.
    Unsupported {
        /// Why not, naming the format, version or backend that does not fit.
        reason: String,
    },
}

/// One compile or runtime spec: a key and opaque bytes, as ExecuTorch's `CompileSpec`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spec<'a> {
    /// The key.
    pub key: &'a str,
    /// The value's bytes.
    pub value: &'a [u8],
}

/// What `init` receives. The blob is borrowed from the host without a copy and is valid only for the call:
/// a delegate that needs its bytes later keeps what it derived from them (e.g. a deserialized engine).
#[derive(Debug, Clone, Copy)]
pub struct InitContext<'a> {
    /// The delegate blob, whole (prefix, header and payload).
    pub blob: &'a [u8],
    /// Ahead-of-time options recorded with the program.
    pub compile_specs: &'a [Spec<'a>],
    /// Options given by the application at load time.
    pub runtime_specs: &'a [Spec<'a>],
}

/// A value of `set_option` / `get_option`, as ExecuTorch's `OptionValue`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OptionValue {
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A string.
    Str(String),
}

/// Bytes a delegate copied during one `execute`, by kind of copy. The host adds these to its own counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
#[derive(abi_stable::StableAbi)]
pub struct ExecStats {
    /// Bytes copied from an aliased input's storage into a separate output slot after the engine ran.
    pub reflect_bytes: u64,
    /// Bytes staged from host memory into delegate-owned device buffers before the engine ran.
    pub staged_bytes: u64,
}

/// The arguments of one `execute`: tensor views in delegate-argument order, the caller's stream, and the
/// copy counters.
///
/// Memory is reached through [`ExecuteArgs::borrow`], which hands out slices only for host-visible memory and
/// only when no written slice overlaps any other requested slice, so an input and its in-place aliased
/// output can never be borrowed at once.
pub struct ExecuteArgs<'a> {
    args: &'a [TensorArg],
    stream: Option<CudaStream>,
    stats: &'a mut ExecStats,
}

/// What [`ExecuteArgs::borrow`] hands out: `R` shared slices and `W` exclusive ones.
pub type Borrowed<'b, const R: usize, const W: usize> = ([&'b [u8]; R], [&'b mut [u8]; W]);

/// What [`ExecuteArgs::borrow_typed`] hands out: `R` shared slices and `W` exclusive ones of `T`.
pub type BorrowedTyped<'b, T, const R: usize, const W: usize> = ([&'b [T]; R], [&'b mut [T]; W]);

/// A caller's CUDA stream (`cudaStream_t`), opaque to the ABI; never null (no stream is `None`).
///
/// Made only by the `unsafe` [`CudaStream::from_raw`], because a delegate hands it to CUDA (TensorRT's
/// `enqueueV3`): safe code cannot pass an arbitrary pointer there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaStream(std::ptr::NonNull<std::ffi::c_void>);

// SAFETY: a `cudaStream_t` is a handle that CUDA allows any host thread to use.
unsafe impl Send for CudaStream {}

impl CudaStream {
    /// Wraps a `cudaStream_t`; `None` for null (the ABI's "no stream").
    ///
    /// # Safety
    /// A non-null `stream` is a CUDA stream (or a special handle such as `cudaStreamPerThread`) of the
    /// device the call's memory lives on, valid until every call given it has returned and the work they
    /// queued on it has completed; and whoever passes it to [`crate::host::Instance::execute`] obeys the
    /// completion rule of [`Delegate::execute`]: it touches no argument memory, and reuses no argument
    /// storage, before that work completes (a stream synchronisation, or later work ordered on the stream).
    pub unsafe fn from_raw(stream: *mut std::ffi::c_void) -> Option<CudaStream> {
        std::ptr::NonNull::new(stream).map(CudaStream)
    }

    /// The `cudaStream_t`.
    pub fn as_raw(self) -> *mut std::ffi::c_void {
        self.0.as_ptr()
    }
}

/// An element type a delegate can borrow typed slices of with [`ExecuteArgs::borrow_typed`]: plain old
/// data ([`bytemuck::Pod`]) with the [`DTypeCode`] an argument of it carries. Sealed.
pub trait Element: bytemuck::Pod + sealed::Sealed {
    /// The code of an argument whose elements are `Self`.
    const DTYPE: DTypeCode;
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! elements {
    ($($ty:ty => $code:ident),*) => {$(
        impl sealed::Sealed for $ty {}
        impl Element for $ty {
            const DTYPE: DTypeCode = DTypeCode::$code;
        }
    )*};
}

elements!(f32 => F32, f64 => F64, i8 => I8, u8 => U8, i32 => I32, i64 => I64);

impl<'a> ExecuteArgs<'a> {
    /// Wraps the raw argument list of one call.
    ///
    /// # Safety
    /// Every [`TensorArg`] in `args` whose memory is host-visible ([`MemoryKind::is_host_visible`]) must point
    /// to `nbytes` bytes valid for reads for `'a`, and for writes when [`TensorArg::is_writable`], with nothing
    /// outside these args accessing writable bytes during `'a`; a writable arg may share storage with another
    /// arg only when both start at the same address with the same size (an inout and its in-place output).
    /// Device pointers must be valid device allocations of `nbytes` on `device_id`. With a `stream`, all of
    /// this holds until the work the delegate queues on it completes (the completion rule of
    /// [`Delegate::execute`]), not only for `'a`.
    ///
    /// Every arg's codes must be known ([`TensorArg::check_codes`]): always true of args built in Rust (as
    /// [`crate::host::ArgList`] builds them); the export glue checks args from the other side before calling
    /// this. An unknown code is not undefined behaviour, but [`TensorArg::dtype`] would panic on it.
    pub unsafe fn new(args: &'a [TensorArg], stream: Option<CudaStream>, stats: &'a mut ExecStats) -> Self {
        ExecuteArgs { args, stream, stats }
    }

    /// Number of arguments.
    pub fn len(&self) -> usize {
        self.args.len()
    }

    /// Whether there are no arguments.
    pub fn is_empty(&self) -> bool {
        self.args.is_empty()
    }

    /// The metadata (and raw data pointer) of argument `index`.
    pub fn arg(&self, index: usize) -> Result<&TensorArg, DelegateError> {
        self.args.get(index).ok_or_else(|| {
            DelegateError::invalid_argument(format!(
                "argument {index} requested but the call has {} arguments",
                self.args.len()
            ))
        })
    }

    /// All arguments' metadata.
    pub fn args(&self) -> &[TensorArg] {
        self.args
    }

    /// The caller's CUDA stream, if one was given.
    ///
    /// With a stream, the delegate may return before its work completes, as long as all of that work (every
    /// read and write of argument memory, its staging and reflects included) is ordered on this stream:
    /// results are complete when the stream reaches the point after this `execute`, and the caller touches
    /// no argument memory before then (see [`Delegate::execute`]). Without one, everything is complete when
    /// `execute` returns.
    pub fn stream(&self) -> Option<CudaStream> {
        self.stream
    }

    /// Adds bytes copied from an aliased input into its output slot.
    pub fn record_reflect(&mut self, bytes: u64) {
        self.stats.reflect_bytes += bytes;
    }

    /// Adds bytes staged from host into delegate-owned device memory.
    pub fn record_staging(&mut self, bytes: u64) {
        self.stats.staged_bytes += bytes;
    }

    /// Borrows host-visible memory: `reads` shared, `writes` exclusive.
    ///
    /// Fails with `InvalidArgument` when an index is out of range, an arg is not host-visible, a written arg is
    /// not writable, or a written arg overlaps any other requested arg (an input and its in-place output
    /// included). Zero-byte args give empty slices.
    pub fn borrow<const R: usize, const W: usize>(
        &mut self,
        reads: [usize; R],
        writes: [usize; W],
    ) -> Result<Borrowed<'_, R, W>, DelegateError> {
        for &index in reads.iter().chain(writes.iter()) {
            let arg = self.arg(index)?;
            if arg.nbytes > 0 && !arg.memory().is_host_visible() {
                return Err(DelegateError::invalid_argument(format!(
                    "argument {index} is {} memory, which this delegate cannot read on the host",
                    arg.memory()
                )));
            }
        }
        for (n, &w) in writes.iter().enumerate() {
            let arg = self.arg(w)?;
            if !arg.is_writable() {
                return Err(DelegateError::invalid_argument(format!("argument {w} is read-only")));
            }
            let others =
                reads.iter().chain(writes.iter().enumerate().filter(|(m, _)| *m != n).map(|(_, i)| i));
            for &other in others {
                if self.args[other].overlaps(arg) {
                    return Err(DelegateError::invalid_argument(format!(
                        "argument {w} is written while argument {other} shares its storage"
                    )));
                }
            }
        }
        // SAFETY: `new`'s contract makes every host-visible arg valid for reads (and writes when writable) for
        // 'a; we checked above that each arg is host-visible, that written args are writable, and that no
        // written range overlaps any other requested range, so the exclusive slices alias nothing else handed
        // out here, and `&mut self` keeps further borrows out until these end.
        let read_slices = reads.map(|i| unsafe { self.args[i].host_bytes() });
        // SAFETY: as above.
        let write_slices = writes.map(|i| unsafe { self.args[i].host_bytes_mut() });
        Ok((read_slices, write_slices))
    }
}

impl ExecuteArgs<'_> {
    /// [`ExecuteArgs::borrow`] as slices of `T` (`f32`, `i64`, ...): `reads` shared, `writes` exclusive.
    ///
    /// Fails with `InvalidArgument`, naming the argument, in every case `borrow` does, and when an
    /// argument's dtype is not `T`'s ([`Element::DTYPE`]) or its address is not aligned for `T`. Borrow
    /// arguments of different element types with one call each:
    ///
    /// ```
    /// # use delegate_abi::{DelegateError, ExecuteArgs};
    /// fn scale(args: &mut ExecuteArgs<'_>) -> Result<(), DelegateError> {
    ///     let factor = args.borrow_typed::<i64, 1, 0>([0], [])?.0[0].first().copied().unwrap_or(1);
    ///     let ([input], [output]) = args.borrow_typed::<f32, 1, 1>([1], [2])?;
    ///     for (o, i) in output.iter_mut().zip(input) {
    ///         *o = i * factor as f32;
    ///     }
    ///     Ok(())
    /// }
    /// ```
    pub fn borrow_typed<T: Element, const R: usize, const W: usize>(
        &mut self,
        reads: [usize; R],
        writes: [usize; W],
    ) -> Result<BorrowedTyped<'_, T, R, W>, DelegateError> {
        for &index in reads.iter().chain(writes.iter()) {
            let arg = self.arg(index)?;
            if arg.dtype() != T::DTYPE {
                return Err(DelegateError::invalid_argument(format!(
                    "argument {index} is {}, borrowed as {}",
                    arg.dtype(),
                    T::DTYPE
                )));
            }
        }
        let (reads_bytes, writes_bytes) = self.borrow(reads, writes)?;
        let misaligned = |index: usize| {
            DelegateError::invalid_argument(format!(
                "argument {index} is not {}-byte aligned, which {} elements need",
                std::mem::align_of::<T>(),
                T::DTYPE
            ))
        };
        let mut read_slices: [&[T]; R] = [&[]; R];
        for ((slot, bytes), &index) in read_slices.iter_mut().zip(reads_bytes).zip(&reads) {
            *slot = bytemuck::try_cast_slice(bytes).map_err(|_| misaligned(index))?;
        }
        let mut write_slices: [&mut [T]; W] = std::array::from_fn(|_| <&mut [T]>::default());
        for ((slot, bytes), &index) in write_slices.iter_mut().zip(writes_bytes).zip(&writes) {
            *slot = bytemuck::try_cast_slice_mut(bytes).map_err(|_| misaligned(index))?;
        }
        Ok((read_slices, write_slices))
    }
}

impl fmt::Debug for ExecuteArgs<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExecuteArgs").field("args", &self.args).field("stream", &self.stream).finish()
    }
}

/// What a plugin says about itself before any `init`. Built with [`PluginInfo::new`] and its `with_*` methods
/// (`#[non_exhaustive]`: a field appended later breaks no plugin).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PluginInfo {
    /// Plugin name, e.g. `"reference-delegate"`.
    pub name: String,
    /// Plugin version (semver).
    pub version: String,
    /// ExecuTorch backend ids it serves, e.g. `["ReferenceBackend"]`.
    pub backends: Vec<String>,
    /// Blob wire formats it reads, each as a format name and a semver range of its versions.
    pub wire_formats: Vec<WireFormatSupport>,
    /// Memory kinds its args may live in.
    pub memory_kinds: Vec<MemoryKind>,
    /// Whether it binds aliased outputs in place (zero-copy aliasing): an output arg that shares its aliased
    /// input's storage costs no copy.
    pub binds_aliases_in_place: bool,
    /// What the host must know before it runs anything (a plugin built before these were stated gets
    /// [`Capabilities::default`], see [`crate::capabilities`]).
    pub capabilities: Capabilities,
}

/// One blob wire format a plugin reads ([`WireFormatSupport::new`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WireFormatSupport {
    /// `"native"`, `"tr01"` or `"tr02"`.
    pub format: String,
    /// A semver requirement over the format's versions, e.g. `">=1.0, <2"`.
    pub versions: String,
}

/// The delegate interface, shaped like ExecuTorch's `BackendInterface`.
///
/// Implement it for a type, then export it with [`crate::export_delegate!`]. Every method may be called from
/// any thread; panics are caught at the boundary and poison the plugin.
pub trait Delegate: Send + Sync + 'static {
    /// What one `init` returns and every `execute` on it receives.
    type Handle: Send + 'static;

    /// Builds the delegate once, when the plugin is first used.
    fn new() -> Self
    where
        Self: Sized;

    /// Metadata, readable before `new` is called.
    fn info() -> PluginInfo
    where
        Self: Sized;

    /// Whether the delegate can run on this machine at all (libraries, devices), and if not, why: an error
    /// (usually `NotSupported`) whose message a person can act on, e.g. "TensorRT-RTX library not found
    /// (tried ...); set KV_TENSORRT_LIB". A host lists an unavailable plugin with that reason and never
    /// initialises it. Cheap and without side effects; the default is available.
    fn availability(&self) -> Result<(), DelegateError> {
        Ok(())
    }

    /// A header-only answer about `blob`, cheap and without side effects.
    fn compatibility(&self, blob: &[u8]) -> Compatibility;

    /// Prepares a blob for execution.
    fn init(&self, ctx: InitContext<'_>) -> Result<Self::Handle, DelegateError>;

    /// Runs one call.
    ///
    /// # When results are complete
    ///
    /// One rule, for both sides of the ABI:
    /// - **without a caller stream** ([`ExecuteArgs::stream`] is `None`): everything the call writes is
    ///   complete when `execute` returns, and the delegate uses no argument memory afterwards;
    /// - **with a caller stream**: the delegate may return first, provided every use of argument memory it
    ///   has not finished (engine work, staging copies, reflects, read-backs) is queued on that stream.
    ///   Results are complete when the stream reaches the point after this call. Until then the caller must
    ///   not read or write any argument's memory nor free or reuse its storage (device buffers, host
    ///   buffers a copy still reads or writes, the inputs included): it synchronises the stream, or orders
    ///   its own later work on the same stream. Prefill and decode calls sharing one cache and one stream
    ///   are ordered by the stream itself.
    ///
    /// A delegate that computes on the host (the reference delegate) is complete on return either way. A
    /// delegate that cannot keep all its work on the caller's stream synchronises before returning. On an
    /// error, nothing the call queued may still be running.
    ///
    /// Hosts: [`crate::host::Instance::execute`] passes the stream through; the `unsafe`
    /// [`CudaStream::from_raw`] is where a host takes on its half of the rule. `host-runtime` passes its
    /// program's stream to every plugin that accepts device memory, and none to the others.
    fn execute(&self, handle: &mut Self::Handle, args: &mut ExecuteArgs<'_>) -> Result<(), DelegateError>;

    /// Whether this initialised instance keeps sequence state of its own: state its later calls read that is
    /// not in the caller's caches (e.g. caches the delegate holds itself, reference-graph payload 1.2's
    /// `state`). A host moves a sequence by moving the caller's caches only: it rewinds them, restores them
    /// from a file, or forks them into a second set. With state of its own the instance would then run on
    /// state of another position or another sequence, so a host refuses those (host-runtime's
    /// `Program::rewind`, `Program::restore_cache`, `Program::fork`) for a program holding such an instance.
    ///
    /// Answered per instance, since it may depend on the blob (the reference delegate keeps state for a graph
    /// with `state` and none otherwise). The default answers what [`Delegate::info`] states for every instance:
    /// `!capabilities.rewind_fork_without_reinit` (see [`crate::capabilities`]). Cheap and without side
    /// effects; a host may ask any number of times.
    fn keeps_sequence_state(&self, handle: &Self::Handle) -> bool
    where
        Self: Sized,
    {
        let _ = handle;
        !Self::info().capabilities.rewind_fork_without_reinit
    }

    /// Releases a handle. The default drops it.
    fn destroy(&self, handle: Self::Handle) {
        drop(handle);
    }

    /// Sets a backend option; the default refuses every key.
    fn set_option(&self, key: &str, value: OptionValue) -> Result<(), DelegateError> {
        let _ = value;
        Err(DelegateError::new(ErrorCode::NotFound, format!("unknown option '{key}'")))
    }

    /// Reads a backend option; the default knows no key.
    fn get_option(&self, key: &str) -> Result<OptionValue, DelegateError> {
        Err(DelegateError::new(ErrorCode::NotFound, format!("unknown option '{key}'")))
    }
}
