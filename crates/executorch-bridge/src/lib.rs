//! Runs our delegate plugins inside ExecuTorch 1.5.1's own C++ runtime: registers every backend id our plugins
//! serve in ExecuTorch's backend registry, and runs `.pte` programs on ExecuTorch's `Module` API.
//!
//! A small C++ shim (`cpp/bridge.cpp`, built by `build.rs` against the `executorch==1.5.1` wheel's headers and
//! linked to its `libexecutorch.so` and kernels) implements one `BackendInterface` per backend id, whose
//! `is_available/init/execute/destroy` call back into Rust ([`backend`]), which calls the plugin through our
//! ABI (`delegate_abi::host`), exactly as `host-runtime` does:
//!
//! - **payload**: ExecuTorch's processed buffer *is* our blob; it is lent to the plugin's `init` uncopied, and
//!   ExecuTorch keeps it alive until `destroy` (the shim never frees it).
//! - **arguments**: each DelegateCall tensor's data pointer, dtype and shape go into the plugin's argument list
//!   as they are, in the DelegateCall's order, which is the blob's binding order (the exporter binds by name).
//!   A KV output whose pointer is its buffer input's (the export's memory-planning pass placed it there) is
//!   bound in place, and the pass removed the program's `copy_` write-back for it: zero bytes move.
//!   Otherwise it is a separate output the plugin fills, and the program's `copy_` write-back copies it back.
//! - **copies, counted**: the shim loads every method with a method-scoped kernel registry that wraps each of
//!   ExecuTorch's copy kernels (`aten::copy_` and the copy/clone `out` kernels, same kernel keys) in one that
//!   runs it and counts the bytes it wrote; [`CopyStats`] adds those counts to the bytes the bridge copies
//!   itself (write-backs for plugins that do not bind in place) and the plugins' reflects. Nothing is worked
//!   out from pointers: a self-copy `copy_` counts its bytes, because its kernel copies them.
//! - **errors**: both ways as ExecuTorch's numeric codes (our [`et_error::ErrorCode`] values are ExecuTorch's);
//!   the message of a plugin failure is kept per thread ([`take_last_error`]). No C++ exception crosses the
//!   shim's boundary: each is caught there as `MemoryAllocationFailed` (`std::bad_alloc`) or `Internal`, its
//!   message kept the same way.
//! - **isolation**: [`host_runtime::plugins::Registry::served`] decides where a plugin runs. ExecuTorch runs
//!   delegates inside its own process over its planned memory, so a plugin that must run isolated (its
//!   manifest says `"isolate": true`, or the registry isolates every library plugin) is never loaded here:
//!   [`BridgeError::Isolated`] names it, the backend, and `delegate-host run PROGRAM.pte`, which isolates it.
//!
//! The runner ([`runner`], binary `et-run`) reads a `.pte` once ([`ProgramFile`]: a regular file only, opened
//! without blocking), checks those bytes and has ExecuTorch load exactly them (never the path again), with
//! `share_memory_arenas = true` (methods
//! sharing mutable buffers see each other's caches; ExecuTorch's `Module` zero-fills its arenas, so caches
//! start at zero), its planned memory in host memory or, for a program a GPU delegate runs, in CUDA managed
//! memory the bridge allocates and hands to ExecuTorch's `Module::load_method` ([`planned`]: the delegate
//! updates the caches in place on the GPU, with no copy per step), checks with `pte-format` first that every
//! DelegateCall's backend is served and that every argument a delegate writes is planned memory ([`written`]:
//! never a constant of the program), then runs prefill and greedy decode steps. [`runner::Module::execute`]
//! checks each input before the shim sees it: its slice is exactly shape x dtype bytes, and every size fits
//! ExecuTorch's 32-bit sizes. With
//! [`runner::Protocol::require_zero_copy`] (`et-run --require-zero-copy`) a program that would copy cache
//! bytes per step is refused before ExecuTorch loads it ([`strict`]).
//!
//! ## Examples
//!
//! ```no_run
//! use executorch_bridge::runner::{self, Protocol};
//! use host_runtime::plugins::{Discovery, Registry};
//!
//! // DELEGATE_PLUGIN_PATH's libraries, then the reference delegate linked into this application.
//! let registry = Registry::discover(Discovery::new().use_env(true))
//!     .with_embedded(reference_delegate::delegate_root(), &Default::default());
//! let report = runner::run(std::path::Path::new("model.pte"), &registry, &Protocol::default())?;
//! println!("{:?}", report.tokens);
//! # Ok::<(), executorch_bridge::BridgeError>(())
//! ```
//!
//! ## Building
//!
//! `build.rs` reads `EXECUTORCH_ROOT` (the wheel's unpacked `executorch/` directory, with `include/` and
//! `lib/`); `cargo xtask test` installs the wheel under `.cache/executorch/` and sets it. The crate is a
//! workspace member but not a default member, so a plain `cargo build` does not need the wheel.
//!
//! ## Unsafe code
//!
//! Only in the private `ffi` module (the C structs, entry points, callbacks and raw argument pushes), every
//! block with a `// SAFETY:` comment; the rest of the crate denies `unsafe_code`.
//!
//! ## Feature Flags
//!
//! None.
#![deny(missing_docs)]
#![deny(unsafe_code)]

pub mod backend;
mod ffi;
pub mod planned;
pub mod program_file;
pub mod runner;
pub mod strict;
pub mod written;

pub use backend::{
    counted_copy_kernels, is_registered, register, register_backends, take_last_error, take_stats, CopyStats,
};
pub use planned::{PlannedMemory, SyncStats};
pub use program_file::ProgramFile;

use delegate_abi::DTypeCode;
use et_error::{ErrorCode, HasErrorCode};

/// Why the bridge or the runner failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BridgeError {
    /// The `.pte` cannot be read (truncated, corrupted, not a program).
    #[error("{path}: {source}")]
    Program {
        /// The file.
        path: String,
        /// What is wrong.
        #[source]
        source: pte_format::Error,
    },
    /// The file cannot be read at all.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A DelegateCall names a backend no loaded plugin serves.
    #[error("method '{method}' calls backend '{backend}', which no loaded plugin serves (served: {served})")]
    UnservedBackend {
        /// The method.
        method: String,
        /// The backend id.
        backend: String,
        /// The ids that are served, comma-separated, or `none`.
        served: String,
    },
    /// The plugin offering a backend the program calls could not be used (failed to load, or unavailable).
    #[error("backend '{backend}' has no usable plugin: {reason}")]
    PluginUnavailable {
        /// The backend id.
        backend: String,
        /// Why, per plugin that offers it.
        reason: String,
    },
    /// The plugin serving a backend the program calls must run isolated in a worker process (its manifest says
    /// `"isolate": true`, or the registry isolates every library plugin). ExecuTorch runs delegates inside its
    /// own process over its planned memory, so the bridge never loads such a plugin;
    /// `delegate-host run PROGRAM.pte` runs the program with it isolated.
    #[error(
        "backend '{backend}' is served by plugin '{plugin}' ({library}), which must run isolated in a worker \
         process; ExecuTorch runs delegates inside this process over its own memory, so et-run never loads it: \
         run the program with `delegate-host run {}`, which isolates it",
        program.as_deref().unwrap_or("PROGRAM.pte")
    )]
    Isolated {
        /// The backend id.
        backend: String,
        /// The plugin's name (from its manifest).
        plugin: String,
        /// The plugin's library.
        library: String,
        /// The program being run, when known.
        program: Option<String>,
    },
    /// ExecuTorch refused to register a backend id.
    #[error("ExecuTorch refused to register backend '{backend}': {code}")]
    Registration {
        /// The backend id.
        backend: String,
        /// ExecuTorch's code.
        code: ErrorCode,
    },
    /// A method input that does not describe its own bytes (see [`InputProblem`]); nothing was run.
    #[error("input {index} ({dtype} {shape:?}): {problem}")]
    Input {
        /// The input's position in the method's inputs.
        index: usize,
        /// Its element type.
        dtype: DTypeCode,
        /// Its shape, as given.
        shape: Vec<i64>,
        /// What is wrong.
        problem: InputProblem,
    },
    /// Strict zero-copy ([`runner::Protocol::require_zero_copy`]): a call would copy cache bytes on every
    /// step, so the program is refused before ExecuTorch loads it (`NotSupported`; see [`strict`]).
    #[error("method '{method}', {instruction}: {argument} would be copied on every step: {reason}; strict zero-copy (--require-zero-copy) refuses it")]
    NotZeroCopy {
        /// The method.
        method: String,
        /// The instruction that copies, as `chains[0].instructions[2] (aten::copy_)`.
        instruction: String,
        /// The buffer copied, as `buffer 'k_cache_0' (value 3)`.
        argument: String,
        /// Why it is copied.
        reason: String,
    },
    /// A DelegateCall argument that the delegate writes (an output, or a buffer it updates in place) is not
    /// planned memory: a constant of the program, or memory the caller binds. The program is refused before
    /// ExecuTorch loads it (`InvalidProgram`; see [`written`]).
    #[error(
        "method '{method}', {instruction}: {argument} is {written}, but it is not planned memory: {reason}; the \
         program is refused before ExecuTorch loads it"
    )]
    UnplannedWrite {
        /// The method.
        method: String,
        /// The call, as `chains[0].instructions[0] (DelegateCall to ReferenceBackend)`.
        instruction: String,
        /// The argument, as `argument 4 ('k_cache_out_0', value 4)`: its position in the call, the payload's
        /// name for it and the program's value index.
        argument: String,
        /// What the delegate does with it: `an output the delegate writes` or `a buffer the delegate updates
        /// in place`.
        written: String,
        /// Why it is not planned memory.
        reason: String,
    },
    /// A method loaded into a Module whose managed planned memory was not sized for it (not among
    /// [`runner::Module::open_with`]'s `methods`): its planned buffers could overrun the shared allocation, so
    /// it is refused before ExecuTorch sees it (`InvalidArgument`).
    #[error(
        "method '{method}' cannot be loaded: this Module's managed planned memory was sized for {} only; list \
         every method to be loaded in Module::open_with",
        if planned_for.is_empty() { "no method".to_owned() } else { format!("{planned_for:?}") }
    )]
    MethodNotPlanned {
        /// The method refused.
        method: String,
        /// The methods the planned memory was sized for.
        planned_for: Vec<String>,
    },
    /// The planned memory was to be CUDA managed memory ([`planned`]), which cannot be had: no CUDA driver or
    /// GPU (`NotSupported`), or the driver refused the allocation (`MemoryAllocationFailed`).
    #[error("cannot place the planned memory in CUDA managed memory: {source} (--memory host keeps it in host memory)")]
    ManagedMemory {
        /// What CUDA said.
        #[source]
        source: cuda_rt::Error,
    },
    /// The program does not follow the run protocol (methods, inputs, outputs).
    #[error("{0}")]
    Protocol(String),
    /// ExecuTorch's runtime failed; `detail` is the plugin's message when a delegate failed.
    #[error("{what}: {code}{}", detail.as_ref().map(|d| format!(" ({d})")).unwrap_or_default())]
    Runtime {
        /// What was being done.
        what: String,
        /// ExecuTorch's code.
        code: ErrorCode,
        /// The plugin's message, when the failure came from one.
        detail: Option<String>,
    },
}

impl HasErrorCode for BridgeError {
    fn error_code(&self) -> ErrorCode {
        match self {
            BridgeError::Program { source, .. } => source.error_code(),
            BridgeError::Io { .. } => ErrorCode::AccessFailed,
            BridgeError::UnservedBackend { .. } => ErrorCode::NotFound,
            BridgeError::PluginUnavailable { .. } | BridgeError::Isolated { .. } => ErrorCode::NotSupported,
            BridgeError::NotZeroCopy { .. } => ErrorCode::NotSupported,
            BridgeError::Input { .. } | BridgeError::MethodNotPlanned { .. } => ErrorCode::InvalidArgument,
            BridgeError::UnplannedWrite { .. } => ErrorCode::InvalidProgram,
            BridgeError::Registration { code, .. } | BridgeError::Runtime { code, .. } => *code,
            BridgeError::ManagedMemory { source } => source.error_code(),
            BridgeError::Protocol(_) => ErrorCode::InvalidProgram,
        }
    }
}

/// What is wrong with a method input ([`BridgeError::Input`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InputProblem {
    /// More dimensions than ExecuTorch's tensors carry.
    #[error("rank {rank} is more than ExecuTorch's {max}")]
    Rank {
        /// The input's rank.
        rank: usize,
        /// ExecuTorch's limit.
        max: usize,
    },
    /// A dimension that ExecuTorch's sizes (`SizesType`, 32-bit) cannot carry, or a negative one.
    #[error("dimension {dim} is {size}, outside ExecuTorch's sizes (0 to {max})")]
    Size {
        /// Which dimension.
        dim: usize,
        /// Its size, as given.
        size: i64,
        /// The largest size ExecuTorch carries.
        max: i64,
    },
    /// The slice's length is not the shape's element count times the dtype's size (or that product does not
    /// fit 64 bits: `expected` is `None`).
    #[error(
        "its shape x dtype is {} bytes, but the slice holds {actual}",
        expected.map_or_else(|| "more than 2^64".to_owned(), |e| e.to_string())
    )]
    Length {
        /// Bytes the shape and dtype need, when that fits 64 bits.
        expected: Option<u64>,
        /// Bytes the slice holds.
        actual: u64,
    },
}
