//! The program manifest (`program.toml`): its schema, reading it with errors that name the line and column,
//! and writing it.
//!
//! A program is a few delegate blobs plus this small TOML file that says what a host must own and call:
//! caller-owned mutable **buffers** (KV caches), **methods** made of ordered delegate **calls**, what each
//! delegate argument binds to, and optionally how to **generate** tokens. The crate has two views of it:
//! - [`ProgramSpec`] (and the other `*Spec` types): the file as written, key for key, for tools that write
//!   programs (the example exporter) or edit them; [`ProgramSpec::to_toml`] writes it.
//! - [`Manifest`]: the file read and checked by [`Manifest::load`] / [`Manifest::parse`]: names resolve, dtypes
//!   and memory kinds are parsed, blob paths are resolved against the manifest's directory, and the location
//!   of every call and argument is kept so that a host can point at the line its later checks refuse.
//!
//! Every error names the file and the line and column of the offending value, and maps to an ExecuTorch code
//! ([`Error`]). This crate knows nothing of plugins: memory kinds are the workspace's one vocabulary,
//! [`MemoryKind`] (et-error's), the very type a plugin's arguments carry.
//!
//! ## Examples
//!
//! A complete manifest (the example decoder's, with one layer), read and checked:
//!
//! ```
//! use std::path::Path;
//! use program_manifest::{ArgRef, Manifest, MemoryKind};
//!
//! let text = r#"
//! format = 1
//!
//! ## Caller-owned mutable buffers, zero-initialised at load and kept across calls and methods.
//! [buffers.k_cache_0]
//! dtype = "f32"
//! shape = [2, 16, 16]
//! memory = "host"
//! [buffers.v_cache_0]
//! dtype = "f32"
//! shape = [2, 16, 16]
//! ## memory defaults to "host"
//!
//! [methods.prefill]
//! inputs = [{ name = "tokens", dtype = "i64", shape = [4] }, { name = "input_pos", dtype = "i64", shape = [1] }]
//! outputs = [{ name = "logits", dtype = "f32", shape = [4, 64] }]
//! [[methods.prefill.calls]]
//! blob = "prefill.blob"
//! backend = "ReferenceBackend"
//! args = ["input:tokens", "input:input_pos", "buffer:k_cache_0", "buffer:v_cache_0",
//!         "buffer:k_cache_0", "buffer:v_cache_0", "output:logits"]
//!
//! [methods.decode]
//! inputs = [{ name = "tokens", dtype = "i64", shape = [1] }, { name = "input_pos", dtype = "i64", shape = [1] }]
//! outputs = [{ name = "logits", dtype = "f32", shape = [1, 64] }]
//! [[methods.decode.calls]]
//! blob = "decode.blob"
//! backend = "ReferenceBackend"
//! args = ["input:tokens", "input:input_pos", "buffer:k_cache_0", "buffer:v_cache_0",
//!         "buffer:k_cache_0", "buffer:v_cache_0", "output:logits"]
//!
//! [generate]
//! prefill = "prefill"
//! decode = "decode"
//! prompt = [1, 7, 3, 12]
//! token_input = "tokens"
//! position_input = "input_pos"
//! logits_output = "logits"
//! max_positions = 16
//! "#;
//!
//! let manifest = Manifest::parse(Path::new("example/program.toml"), text)?;
//! assert_eq!(manifest.buffers["k_cache_0"].nbytes(), 4 * 2 * 16 * 16);
//! assert_eq!(manifest.buffers["v_cache_0"].memory, MemoryKind::Host);
//! let decode = &manifest.methods["decode"].calls[0];
//! assert_eq!(decode.blob.path(), Some(Path::new("example/decode.blob")));
//! assert_eq!(decode.args[4], ArgRef::Buffer("k_cache_0".into()));
//! assert_eq!(manifest.generate.as_ref().and_then(|g| g.max_decode_steps()), Some(12));
//!
//! // A mistake is reported where it is written.
//! let wrong = text.replacen("\"output:logits\"]", "\"output:logit\"]", 1);
//! let err = Manifest::parse(Path::new("example/program.toml"), &wrong).unwrap_err();
//! assert_eq!(err.to_string(), "example/program.toml:21:49: method 'prefill' declares no output named 'logit'");
//! # Ok::<(), program_manifest::Error>(())
//! ```
//!
//! Writing one: build a [`ProgramSpec`] and call [`ProgramSpec::to_toml`]; what it writes reads back equal.
//!
//! ```
//! use std::collections::BTreeMap;
//! use std::path::Path;
//! use program_manifest::{BufferSpec, CallSpec, MethodSpec, ProgramSpec, TensorSpec, FORMAT};
//!
//! let tensor = |name: &str, dtype: &str, shape: Vec<i64>| TensorSpec {
//!     name: name.into(),
//!     dtype: dtype.into(),
//!     shape,
//!     memory: None,
//!     device: None,
//! };
//! let spec = ProgramSpec {
//!     format: FORMAT,
//!     buffers: BTreeMap::from([(
//!         "cache".to_owned(),
//!         BufferSpec { dtype: "f32".into(), shape: vec![1, 8, 4], memory: "host".into(), device: None },
//!     )]),
//!     methods: BTreeMap::from([(
//!         "step".to_owned(),
//!         MethodSpec {
//!             inputs: vec![tensor("x", "f32", vec![1, 4]), tensor("pos", "i64", vec![1])],
//!             outputs: vec![tensor("y", "f32", vec![1, 4])],
//!             calls: vec![CallSpec {
//!                 blob: "step.blob".into(),
//!                 backend: "ReferenceBackend".into(),
//!                 args: ["input:x", "input:pos", "buffer:cache", "buffer:cache", "output:y"].map(String::from).into(),
//!             }],
//!         },
//!     )]),
//!     generate: None,
//! };
//! let text = spec.to_toml()?;
//! assert_eq!(ProgramSpec::parse(Path::new("program.toml"), &text)?, spec);
//! let checked = program_manifest::Manifest::parse(Path::new("program.toml"), &text)?;
//! assert_eq!(checked.methods["step"].calls[0].args.len(), 5);
//! # Ok::<(), program_manifest::Error>(())
//! ```
//!
//! ## The keys
//!
//! Unknown keys are refused everywhere (a typo is an error, not a silently ignored line).
//!
//! **Top level**
//! - `format` (integer, required): the manifest format, [`FORMAT`] (1). Another value is refused naming both.
//! - `[buffers.NAME]` (tables, optional): the program's caller-owned **mutable buffers**, ExecuTorch's
//!   mutable buffers such as KV caches. The host allocates each once at load, zero-initialised, in the memory
//!   kind it declares; every method and every call of the program sees the same storage, so one call's update
//!   is the next call's input.
//! - `[methods.NAME]` (tables, at least one): the methods a caller runs, by name.
//! - `[generate]` (table, optional): how a host generates tokens with the program.
//!
//! **`[buffers.NAME]`**
//! - `dtype` (string, required): element type, one of `f32`, `f16`, `bf16`, `f64`, `i8`, `u8`, `i32`, `i64`,
//!   `bool` (blob-format's `DType` names).
//! - `shape` (array of integers, required): static extents, none negative; the buffer's size in bytes must fit
//!   the host's address space.
//! - `memory` (string, default `"host"`): where the buffer lives, see *Memory kinds*.
//! - `device` (integer, optional, default 0): the CUDA device ordinal of a `device` or `managed` buffer; an
//!   error on `host` and `pinned` buffers.
//!
//! **`[methods.NAME]`**
//! - `inputs`, `outputs` (arrays of `{ name, dtype, shape, memory, device }`, default empty): the method's
//!   **user** inputs and outputs; the caller fills the inputs before each run and reads the outputs after it.
//!   Names are unique within each list; `dtype`, `shape`, `memory` (default `"host"`) and `device` as for
//!   buffers. Device-resident inputs and outputs let a host keep a whole generation on the GPU.
//! - `[[methods.NAME.calls]]` (array of tables, at least one): the delegate calls the method makes, in order.
//!   - `blob` (string): the delegate blob's path, relative to the manifest's directory and inside it (an
//!     absolute path or one through `..` is refused unless the host allows it: [`BlobPaths`]; a host opens
//!     the blob beneath the directory ([`BlobSource::File`]'s `root`), so a symbolic link that leads out is refused
//!     too).
//!   - `backend` (string, not empty): the ExecuTorch backend id that runs it (a loaded plugin must serve it,
//!     and the blob must name the same id).
//!   - `args` (array of strings): what each delegate argument binds to, one entry per *threaded* binding of
//!     the blob, in the blob's delegate-argument order (binding is by position here; the delegate maps each
//!     position to its engine tensor by the name the blob records). Each entry is one of ([`ArgRef`]):
//!     - `input:NAME`: user input `NAME` of this method, at an input position;
//!     - `output:NAME`: user output `NAME` of this method, at an output position, bound at most once;
//!     - `buffer:NAME`: buffer `NAME` of the program, with a meaning that depends on the position, below.
//!
//! **`buffer:` at an input position and at an output position**
//!
//! At an *input* position, `buffer:NAME` hands the buffer to the delegate as that input. If the blob aliases
//! an output to this input (a `kv_cache_update` alias: the engine updates the cache in place), the delegate
//! updates the buffer's storage; otherwise it only reads it. A buffer is bound to at most one input position of
//! a call. An aliased input must be bound to a buffer, never to a user input (the caller's input would be
//! overwritten).
//!
//! At an *output* position, `buffer:NAME` names the **buffer-mutation output slot** of that buffer, as
//! ExecuTorch lays out mutable buffers: the graph's output that carries the buffer's new value. The blob must
//! alias that output to an input, and that input must be bound to the same buffer at an earlier position. A
//! host then binds the slot either to the buffer's own storage (zero-copy: nothing is copied) or to scratch of
//! the buffer's memory kind that it writes back into the buffer after the call (copy-back, upstream's
//! `copy_`). The example's decode call therefore reads
//! `["input:tokens", "input:input_pos", "buffer:k_cache_0", "buffer:v_cache_0", "buffer:k_cache_0",
//! "buffer:v_cache_0", "output:logits"]`: caches at their input positions, then the same caches as the
//! mutation outputs, then the logits.
//!
//! These position rules need the blob and are checked by the host when it loads the program; this crate checks
//! everything the manifest alone decides (names resolve, `input:`/`output:` name this method's tensors,
//! `buffer:` names a declared buffer).
//!
//! **`[generate]`**: prefill once over the prompt, then decode steps that each feed back the argmax token.
//! `next_token_output` (optional) names an `i64 [1]` output of both methods that holds that argmax, computed
//! by the delegate; with it, a host feeds the token back without reading the logits (on the GPU:
//! device-to-device, with no host synchronisation per step).
//! - `prefill`, `decode` (strings): the methods to run; both must exist.
//! - `prompt` (array of integers): the prompt token ids; as many as the prefill method's `token_input` holds.
//! - `token_input` (string): the `i64` input of both methods that takes token ids.
//! - `position_input` (string): the `i64` input of both methods that takes the position of the first token
//!   (0 for prefill, then the prompt length, and so on).
//! - `logits_output` (string): the `f32`, `f16` or `bf16` output of both methods with the logits, `[T, vocab]`;
//!   the last row decides the next token.
//! - `max_positions` (integer, optional): how many positions the caches hold (prompt plus decode steps). At
//!   least the prompt's length; a host refuses to run more decode steps than
//!   [`Generate::max_decode_steps`] allows before it starts, instead of overflowing a cache mid-run. When it
//!   is absent, a host takes it from the buffers' shapes ([`Manifest::positions_from_buffers`]): the second
//!   to last dimension (`[heads, positions, head_dim]`, or ExecuTorch's and transformers' `[batch, heads,
//!   positions, head_dim]`) when every buffer of two or more dimensions has the same one; when none has two
//!   dimensions or they disagree, the shapes do not say which axis is the sequence and nothing is taken (only
//!   the plugins' own checks stand then: write `max_positions`).
//!
//! ## Memory kinds
//!
//! A buffer's `memory` ([`MemoryKind`]) is what its storage really is; a host never labels one kind as another,
//! and a machine that cannot provide a kind refuses the program at load.
//! - `host` (default): ordinary host memory.
//! - `device`: CUDA device memory, on the buffer's `device`.
//! - `managed`: CUDA managed (unified) memory, visible to host and device, on the buffer's `device`.
//! - `pinned`: page-locked host memory the device reads by DMA.
//!
//! A plugin announces the kinds it accepts; a call that passes a buffer of another kind is refused at load.
//! User inputs and outputs take the same kinds, with the same checks.
//!
//! ## Feature Flags
//!
//! None.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod blob_source;
pub mod file;
mod manifest;
mod spec;

use std::fmt;
use std::path::PathBuf;

pub use blob_source::{BlobSource, Payload};
pub use manifest::{
    checked_nbytes, ArgRef, BlobPaths, Call, Generate, Manifest, Method, TensorDecl, TooLarge,
    MAX_MANIFEST_BYTES,
};
pub use spec::{BufferSpec, CallSpec, GenerateSpec, MethodSpec, ProgramSpec, TensorSpec};

/// The manifest format version this build reads and writes.
pub const FORMAT: u32 = 1;

/// Where a buffer lives (a buffer's `memory` key): the workspace's one memory-kind vocabulary,
/// [`et_error::MemoryKind`].
pub use et_error::MemoryKind;

/// A line and column (1-based) in the manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Location {
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
}

impl Location {
    /// The line and column of byte `offset` of `text` (columns count characters).
    fn of_offset(text: &str, offset: usize) -> Location {
        let before = text.get(..offset.min(text.len())).unwrap_or(text);
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        Location { line, column }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// A manifest that cannot be read, does not make sense, or cannot be written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The file could not be read. `AccessFailed`.
    #[error("cannot read manifest {path}: {source}")]
    Io {
        /// The manifest path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid TOML of the manifest's shape, or a value is wrong. `InvalidProgram`.
    #[error("{path}:{location}: {message}")]
    Invalid {
        /// The manifest path.
        path: PathBuf,
        /// Where.
        location: Location,
        /// What is wrong.
        message: String,
    },
    /// A [`ProgramSpec`] holds a value TOML cannot hold (an integer above `i64::MAX`). `InvalidArgument`.
    #[error("cannot write the manifest as TOML: {source}")]
    Write {
        /// The serializer's error.
        source: toml::ser::Error,
    },
}

impl et_error::HasErrorCode for Error {
    fn error_code(&self) -> et_error::ErrorCode {
        match self {
            Error::Io { .. } => et_error::ErrorCode::AccessFailed,
            Error::Invalid { .. } => et_error::ErrorCode::InvalidProgram,
            Error::Write { .. } => et_error::ErrorCode::InvalidArgument,
        }
    }
}
