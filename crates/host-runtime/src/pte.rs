//! ExecuTorch programs (`.pte`) loaded onto the program machinery of [`crate::program`]: no second runner.
//!
//! [`load`] maps the file read by `pte_format` onto a [`Manifest`] and loads it with
//! [`Program`]'s own checks, argument plans and modes:
//!
//! - **buffers**: every method's mutable buffers ([`pte_format::buffers`]) become the program's caller-owned
//!   buffers, zero-filled, named by their fully qualified name (`k_cache_0`), or `mem<id>@<offset>` (their
//!   planned place) when the export wrote none. Methods that name the same buffer (or plan an unnamed one at
//!   the same place) share one storage: the two methods of a prefill + decode program share their caches.
//! - **inputs and outputs**: a method's inputs and outputs, in the method's order, named by their fully
//!   qualified name or else by their index (`"0"`, `"1"`, ...). Delegate outputs that no output or buffer
//!   takes get storage as extra outputs named `%v<value>` (internal values: [`is_internal`]).
//! - **delegate calls**: each `DelegateCall` becomes a call whose blob is the delegate's processed payload,
//!   borrowed from the file's bytes (read once by [`crate::blob_file`], never copied per call), and whose
//!   arguments are mapped by value index: a method input, a method output, a buffer, or an internal value.
//! - **write-backs**: `aten::copy_(buffer, new)` where `new` is a delegate output that the blob aliases to
//!   that buffer's input (or that the memory planner placed on the buffer's own storage) is elided: the
//!   output *is* the buffer's mutation slot, so zero-copy mode binds it to the buffer's storage and copy-back
//!   mode gives it upstream's separate slot and write-back ([`Mode`]). Any other `aten::copy_` runs as a
//!   host copy (counted as a write-back).
//! - **trivial operators**: `aten::clone.out(src, memory_format, out)` of a delegate output into a method
//!   output is elided by binding the delegate's output slot to the method output (when nothing else reads
//!   `src`), else run as a host copy; `FreeCall`s are no-ops. Every other operator or instruction refuses the
//!   program before anything is allocated, with one error naming it.
//!
//! ## Generation convention
//!
//! [`load`] with a prompt makes the program a token generator ([`crate::generate`]) when it has methods
//! `prefill` and `decode`, or one method `forward` (then used for both, the prompt fed in chunks of its
//! token count, one token at a time for `T = 1`). Each such method takes the tokens at input 0 (`i64 [T]`)
//! and the position of the first at input 1 (`i64 [1]`), and gives the logits at output 0 (`f32` or `f16`
//! `[T, vocab]`); the next token is the argmax of the last row. `max_positions` is the `max_seq_len` compile
//! spec of a delegate (an ASCII integer) when one carries it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use alias_validate::ArgLayout;
use blob_format::model::{DType, Role};
use blob_format::Blob;
use et_error::{ErrorCode, HasErrorCode};
use program_manifest::{ArgRef, Call, Generate, Location, Manifest, MemoryKind, Method, TensorDecl};
use pte_format::model::{Instruction, InstructionRef, ScalarType, Tensor};

use crate::blob_file::BlobFile;
use crate::plugins::Registry;
use crate::program::{BlobBytes, Embedded, HostCopy, Mode, Program, Slot};

/// The operator name of a write-back (any overload).
pub const COPY: &str = "aten::copy_";
/// The operator name of a clone; only its `out` overload is run.
pub const CLONE: &str = "aten::clone";

/// Why a `.pte` program could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The file could not be read (`AccessFailed`).
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not a `.pte` program this build reads (`pte_format`'s code).
    #[error("{path}: {source}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        source: pte_format::Error,
    },
    /// An instruction calls an operator the host does not run (`NotSupported`).
    #[error("{path}: method '{method}' instruction {at} calls operator '{operator}', which delegate-host does not run; it runs DelegateCalls, aten::copy_ write-backs and aten::clone.out only")]
    Operator {
        /// The file.
        path: PathBuf,
        /// The method.
        method: String,
        /// The instruction.
        at: At,
        /// `name.overload`.
        operator: String,
    },
    /// An instruction kind the host does not run: `MoveCall`, `JumpFalseCall` (control flow) or a newer
    /// kind (`NotSupported`).
    #[error("{path}: method '{method}' instruction {at} is a {kind}, which delegate-host does not run")]
    Instruction {
        /// The file.
        path: PathBuf,
        /// The method.
        method: String,
        /// The instruction.
        at: At,
        /// `MoveCall`, `JumpFalseCall`, ...
        kind: &'static str,
    },
    /// A `DelegateCall` names a backend id no loaded plugin serves (`NotFound`).
    #[error("{path}: method '{method}' instruction {at} calls backend '{backend}', which no loaded plugin serves (loaded: {available}); see `delegate-host plugins`")]
    NoPlugin {
        /// The file.
        path: PathBuf,
        /// The method.
        method: String,
        /// The instruction.
        at: At,
        /// The backend id.
        backend: String,
        /// The backends that are served.
        available: String,
    },
    /// A delegate's payload is not a blob this build reads (the blob reader's code).
    #[error("{path}: method '{method}' instruction {at} ({backend}): the delegate payload is not a blob: {source}")]
    Blob {
        /// The file.
        path: PathBuf,
        /// The method.
        method: String,
        /// The instruction.
        at: At,
        /// The backend id.
        backend: String,
        /// What the blob reader said.
        source: Box<blob_format::Error>,
    },
    /// A delegate's blob breaks the aliasing rules (alias-validate's code).
    #[error("{path}: method '{method}' instruction {at} ({backend}): {source}")]
    Alias {
        /// The file.
        path: PathBuf,
        /// The method.
        method: String,
        /// The instruction.
        at: At,
        /// The backend id.
        backend: String,
        /// The broken rule.
        source: Box<alias_validate::Error>,
    },
    /// The program holds something the host cannot give storage or meaning to: a non-tensor input, an
    /// element type or shape the host has no name for, a value read before anything wrote it, a buffer two
    /// methods declare differently (`NotSupported` or `InvalidProgram`, see [`Problem`]).
    #[error("{path}: method '{method}': {problem}")]
    Program {
        /// The file.
        path: PathBuf,
        /// The method.
        method: String,
        /// What is wrong.
        problem: Box<Problem>,
    },
    /// A prompt was given but the program does not follow the generation convention (`InvalidArgument`).
    #[error("{path} is not a token generator: {reason} (see host_runtime::pte's generation convention); run it without a prompt, with inputs")]
    NotGenerator {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// Loading the mapped program failed ([`crate::program::Error`]'s code).
    #[error(transparent)]
    Load(#[from] crate::program::Error),
}

impl HasErrorCode for Error {
    fn error_code(&self) -> ErrorCode {
        match self {
            Error::Io { .. } => ErrorCode::AccessFailed,
            Error::Format { source, .. } => source.error_code(),
            Error::Operator { .. } | Error::Instruction { .. } => ErrorCode::NotSupported,
            Error::NoPlugin { .. } => ErrorCode::NotFound,
            Error::Blob { source, .. } => source.error_code(),
            Error::Alias { source, .. } => source.error_code(),
            Error::Program { problem, .. } => problem.error_code(),
            Error::NotGenerator { .. } => ErrorCode::InvalidArgument,
            Error::Load(err) => err.error_code(),
        }
    }
}

/// An instruction's position, as messages name it: `3` in chain 0, `chain 1 instruction 3` otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct At(pub InstructionRef);

impl std::fmt::Display for At {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.chain == 0 {
            write!(f, "{}", self.0.instruction)
        } else {
            write!(f, "{} of chain {}", self.0.instruction, self.0.chain)
        }
    }
}

/// What [`Error::Program`] found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Problem {
    /// A value the host must give storage is not a tensor (`NotSupported`).
    #[error("{what} (value {value}) is a {kind}, not a tensor")]
    NotTensor {
        /// `input 0`, `argument 3 of instruction 0`, ...
        what: String,
        /// The value index.
        value: usize,
        /// The value's kind.
        kind: &'static str,
    },
    /// A tensor's element type has no host name (`NotSupported`).
    #[error("{what} (value {value}) is {scalar_type}, which delegate-host does not allocate")]
    ScalarType {
        /// What the tensor is.
        what: String,
        /// The value index.
        value: usize,
        /// Its type.
        scalar_type: String,
    },
    /// A tensor has a negative size (`InvalidProgram`).
    #[error("{what} (value {value}) has sizes {sizes:?}")]
    Sizes {
        /// What the tensor is.
        what: String,
        /// The value index.
        value: usize,
        /// The sizes.
        sizes: Vec<i32>,
    },
    /// A tensor's size in bytes overflows (`InvalidProgram`): the manifest's checked product refused it.
    #[error("{what} (value {value}): {source}")]
    TooLarge {
        /// What the tensor is.
        what: String,
        /// The value index.
        value: usize,
        /// The tensor and its shape.
        source: program_manifest::TooLarge,
    },
    /// An instruction reads a value nothing wrote (a constant or a value of a skipped instruction:
    /// `NotSupported`).
    #[error(
        "instruction {at} reads value {value}, which no input, buffer or earlier delegate call provides"
    )]
    Unbound {
        /// The instruction.
        at: At,
        /// The value index.
        value: usize,
    },
    /// An operator's arguments do not match what the host runs (`NotSupported`).
    #[error("instruction {at} ({operator}): {message}")]
    Operands {
        /// The instruction.
        at: At,
        /// The operator.
        operator: String,
        /// What does not match.
        message: String,
    },
    /// A `DelegateCall` passes a different number of arguments than its blob threads (`InvalidProgram`).
    #[error("instruction {at} passes {passed} arguments, but its blob threads {threaded}")]
    ArgCount {
        /// The instruction.
        at: At,
        /// Arguments of the call.
        passed: usize,
        /// Arguments the blob threads.
        threaded: usize,
    },
    /// Two methods declare one buffer with different types or shapes (`InvalidProgram`).
    #[error("buffer '{name}' is {first} here but {second} in method '{other}'")]
    BufferMismatch {
        /// The buffer.
        name: String,
        /// As this method declares it.
        first: String,
        /// As the other method declares it.
        second: String,
        /// The other method.
        other: String,
    },
    /// Two values of the method map to the same name (`InvalidProgram`).
    #[error("two values are named '{name}'")]
    Duplicate {
        /// The name.
        name: String,
    },
}

impl HasErrorCode for Problem {
    fn error_code(&self) -> ErrorCode {
        match self {
            Problem::NotTensor { .. }
            | Problem::ScalarType { .. }
            | Problem::Unbound { .. }
            | Problem::Operands { .. } => ErrorCode::NotSupported,
            Problem::Sizes { .. }
            | Problem::TooLarge { .. }
            | Problem::ArgCount { .. }
            | Problem::BufferMismatch { .. }
            | Problem::Duplicate { .. } => ErrorCode::InvalidProgram,
        }
    }
}

/// Whether `name` is an internal value of a `.pte` method (a delegate output no method output or buffer
/// takes), not one of its outputs.
pub fn is_internal(name: &str) -> bool {
    name.starts_with('%')
}

/// Whether `bytes` look like a `.pte` program (`ET12` at byte 4).
pub fn is_pte(bytes: &[u8]) -> bool {
    pte_format::is_program(bytes)
}

fn dtype(scalar: ScalarType) -> Option<DType> {
    Some(match scalar {
        ScalarType::Float => DType::F32,
        ScalarType::Half => DType::F16,
        ScalarType::BFloat16 => DType::BF16,
        ScalarType::Double => DType::F64,
        ScalarType::Char => DType::I8,
        ScalarType::Byte => DType::U8,
        ScalarType::Int => DType::I32,
        ScalarType::Long => DType::I64,
        ScalarType::Bool => DType::Bool,
        _ => return None,
    })
}

/// The declarations of a method's inputs or outputs (`what`), each named by its fully qualified name or
/// else its index; a name used twice is refused.
fn io_decls(
    method: &pte_format::model::Method<'_>,
    values: &[usize],
    what: &str,
) -> Result<Vec<TensorDecl>, Problem> {
    let mut names = BTreeSet::new();
    let mut decls = Vec::with_capacity(values.len());
    for (i, &value) in values.iter().enumerate() {
        let name =
            method.tensor(value).and_then(|t| t.fully_qualified_name()).map_or(i.to_string(), str::to_owned);
        decls.push(decl(method, value, &format!("{what} {i}"), &name)?);
        if !names.insert(name.clone()) {
            return Err(Problem::Duplicate { name });
        }
    }
    Ok(decls)
}

/// A tensor's declaration under `name`.
fn decl(
    method: &pte_format::model::Method<'_>,
    value: usize,
    what: &str,
    name: &str,
) -> Result<TensorDecl, Problem> {
    let tensor: &Tensor<'_> = method.tensor(value).ok_or_else(|| Problem::NotTensor {
        what: what.to_owned(),
        value,
        kind: method.values.get(value).map_or("?", |v| v.kind()),
    })?;
    let dtype = dtype(tensor.scalar_type).ok_or_else(|| Problem::ScalarType {
        what: what.to_owned(),
        value,
        scalar_type: tensor.scalar_type.to_string(),
    })?;
    let shape = tensor
        .sizes
        .iter()
        .map(|&s| u64::try_from(s))
        .collect::<Result<Vec<u64>, _>>()
        .map_err(|_| Problem::Sizes { what: what.to_owned(), value, sizes: tensor.sizes.clone() })?;
    let too_large = |source| Problem::TooLarge { what: what.to_owned(), value, source };
    TensorDecl::new(name, dtype, shape, MemoryKind::Host).map_err(too_large)
}

fn describe(d: &TensorDecl) -> String {
    format!("{} {:?}", d.dtype, d.shape)
}

/// The buffer key of a mutable buffer: its fully qualified name, or its planned place.
fn buffer_key(b: &pte_format::model::MutableBuffer<'_>) -> String {
    match b.name {
        Some(name) => name.to_owned(),
        None => format!("mem{}@{}", b.allocation.mem_id, b.allocation.offset),
    }
}

/// A `.pte` program mapped onto a manifest: what [`Program::load_embedded`] takes.
struct Mapped {
    manifest: Manifest,
    /// (method, call index) -> payload byte range in the file.
    blobs: BTreeMap<(String, usize), std::ops::Range<usize>>,
    copies: BTreeMap<String, Vec<HostCopy>>,
    max_positions: Option<u64>,
}

/// Where a value lives once mapped.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Bound {
    Input(usize),
    Output(usize),
    Buffer(String),
}

fn map_program(
    path: &Path,
    file: &[u8],
    pte: &pte_format::Program<'_>,
    registry: &Registry,
) -> Result<Mapped, Error> {
    let program_error = |method: &str, problem: Problem| Error::Program {
        path: path.to_owned(),
        method: method.to_owned(),
        problem: Box::new(problem),
    };
    // Refuse every operator and instruction the host does not run, and every backend no plugin serves,
    // before anything else.
    for method in &pte.methods {
        for (at, instruction) in method.instructions() {
            match instruction {
                Instruction::Kernel(k) => {
                    let supported = k.name == COPY || (k.name == CLONE && k.overload == "out");
                    if !supported {
                        return Err(Error::Operator {
                            path: path.to_owned(),
                            method: method.name.to_owned(),
                            at: At(at),
                            operator: method.operators[k.operator].to_string(),
                        });
                    }
                }
                Instruction::Delegate(call) => {
                    let backend = method.delegates[call.delegate].id;
                    if registry.served(backend).is_none() {
                        return Err(Error::NoPlugin {
                            path: path.to_owned(),
                            method: method.name.to_owned(),
                            at: At(at),
                            backend: backend.to_owned(),
                            available: match registry.backends() {
                                b if b.is_empty() => "none".to_owned(),
                                b => b.join(", "),
                            },
                        });
                    }
                }
                Instruction::Free { .. } => {}
                other => {
                    return Err(Error::Instruction {
                        path: path.to_owned(),
                        method: method.name.to_owned(),
                        at: At(at),
                        kind: other.kind(),
                    })
                }
            }
        }
    }

    // Buffers of every method, shared by name.
    let mut buffers: BTreeMap<String, (TensorDecl, String)> = BTreeMap::new();
    for method in &pte.methods {
        for b in method.mutable_buffers() {
            let key = buffer_key(&b);
            let d = decl(method, b.value, &format!("buffer '{key}'"), &key)
                .map_err(|p| program_error(method.name, p))?;
            match buffers.get(&key) {
                Some((other, in_method)) if other != &d => {
                    return Err(program_error(
                        method.name,
                        Problem::BufferMismatch {
                            name: key,
                            first: describe(&d),
                            second: describe(other),
                            other: in_method.clone(),
                        },
                    ))
                }
                Some(_) => {}
                None => {
                    buffers.insert(key, (d, method.name.to_owned()));
                }
            }
        }
    }
    let buffer_index: BTreeMap<String, usize> =
        buffers.keys().enumerate().map(|(i, k)| (k.clone(), i)).collect();

    let mut methods = BTreeMap::new();
    let mut blobs = BTreeMap::new();
    let mut copies = BTreeMap::new();
    let mut max_positions = None;
    for method in &pte.methods {
        let name = method.name;
        let fail = |p: Problem| program_error(name, p);
        let mut bound: BTreeMap<usize, Bound> = BTreeMap::new();
        // Inputs and outputs are named apart (input "0" and output "0" are two tensors).
        let inputs = io_decls(method, &method.inputs, "input").map_err(fail)?;
        for (i, &value) in method.inputs.iter().enumerate() {
            bound.insert(value, Bound::Input(i));
        }
        let mut outputs = io_decls(method, &method.outputs, "output").map_err(fail)?;
        for (i, &value) in method.outputs.iter().enumerate() {
            bound.entry(value).or_insert(Bound::Output(i));
        }
        let method_buffers = method.mutable_buffers();
        for b in &method_buffers {
            bound.insert(b.value, Bound::Buffer(buffer_key(b)));
        }
        // Which values instructions read (to elide a clone only when nothing else reads its source).
        let mut reads: BTreeMap<usize, usize> = BTreeMap::new();
        for (_, instruction) in method.instructions() {
            let args: &[usize] = match instruction {
                Instruction::Kernel(k) => &k.args,
                Instruction::Delegate(c) => &c.args,
                _ => &[],
            };
            for &a in args {
                *reads.entry(a).or_default() += 1;
            }
        }
        // clone.out(src, _, out) into a method output: src may be bound to the output directly.
        let mut clone_into: BTreeMap<usize, usize> = BTreeMap::new();
        for (_, k) in method.kernel_calls() {
            if k.name == CLONE {
                if let (Some(&src), Some(&out)) = (k.args.first(), k.args.last()) {
                    if let Some(Bound::Output(o)) = bound.get(&out) {
                        if !bound.contains_key(&src) && reads.get(&src) == Some(&2) {
                            clone_into.insert(src, *o);
                        }
                    }
                }
            }
        }
        // copy_(buffer, src) write-backs by source.
        let mut writes_back: BTreeMap<usize, String> = BTreeMap::new();
        for b in &method_buffers {
            for w in &b.write_backs {
                if let Some(src) = w.src {
                    writes_back.insert(src, buffer_key(b));
                }
            }
        }

        let mut calls = Vec::new();
        let mut method_copies = Vec::new();
        let slot_of = |b: &Bound| match b {
            Bound::Input(i) => Slot::Input(*i),
            Bound::Output(i) => Slot::Output(*i),
            Bound::Buffer(k) => Slot::Buffer(buffer_index[k]),
        };
        for (at, instruction) in method.instructions() {
            match instruction {
                Instruction::Delegate(call) => {
                    let delegate = &method.delegates[call.delegate];
                    let backend = delegate.id;
                    for spec in &delegate.compile_specs {
                        if spec.key == "max_seq_len" {
                            if let Some(n) =
                                std::str::from_utf8(spec.value).ok().and_then(|s| s.trim().parse().ok())
                            {
                                max_positions = Some(n);
                            }
                        }
                    }
                    let blob = Blob::parse(delegate.processed.data).map_err(|source| Error::Blob {
                        path: path.to_owned(),
                        method: name.to_owned(),
                        at: At(at),
                        backend: backend.to_owned(),
                        source: Box::new(source),
                    })?;
                    let alias = |source| Error::Alias {
                        path: path.to_owned(),
                        method: name.to_owned(),
                        at: At(at),
                        backend: backend.to_owned(),
                        source: Box::new(source),
                    };
                    let plan = alias_validate::validate_format(&blob.header).map_err(alias)?;
                    let layout = ArgLayout::new(&blob.header, &plan).map_err(alias)?;
                    if layout.len() != call.args.len() {
                        return Err(fail(Problem::ArgCount {
                            at: At(at),
                            passed: call.args.len(),
                            threaded: layout.len(),
                        }));
                    }
                    let mut args = Vec::with_capacity(call.args.len());
                    for (pos, (slot, &value)) in layout.slots().iter().zip(&call.args).enumerate() {
                        let what = format!("argument {pos} of instruction {}", At(at));
                        let b = match bound.get(&value) {
                            Some(b) => b.clone(),
                            None if !matches!(slot.role, Role::Output) => {
                                return Err(fail(Problem::Unbound { at: At(at), value }));
                            }
                            None => {
                                // A mutation output of the buffer its aliased input is bound to.
                                let aliased_buffer =
                                    slot.in_place_of().and_then(|input| match bound.get(&call.args[input]) {
                                        Some(Bound::Buffer(k)) => Some(k.clone()),
                                        _ => None,
                                    });
                                let same_place = |k: &String| {
                                    let planned = method.tensor(value).and_then(|t| t.allocation);
                                    method_buffers
                                        .iter()
                                        .any(|b| &buffer_key(b) == k && Some(b.allocation) == planned)
                                };
                                match aliased_buffer {
                                    Some(k) if writes_back.get(&value) == Some(&k) || same_place(&k) => {
                                        Bound::Buffer(k)
                                    }
                                    _ => match clone_into.get(&value) {
                                        Some(&o) => Bound::Output(o),
                                        None => {
                                            let n = format!("%v{value}");
                                            outputs.push(decl(method, value, &what, &n).map_err(fail)?);
                                            Bound::Output(outputs.len() - 1)
                                        }
                                    },
                                }
                            }
                        };
                        bound.insert(value, b.clone());
                        args.push(match &b {
                            Bound::Input(i) => ArgRef::Input(inputs[*i].name.clone()),
                            Bound::Output(i) => ArgRef::Output(outputs[*i].name.clone()),
                            Bound::Buffer(k) => ArgRef::Buffer(k.clone()),
                        });
                    }
                    let data = delegate.processed.data;
                    let start = (data.as_ptr() as usize).wrapping_sub(file.as_ptr() as usize);
                    blobs.insert((name.to_owned(), calls.len()), start..start + data.len());
                    let n = args.len();
                    calls.push(Call {
                        blob: PathBuf::from(format!(
                            "{}: method '{name}' instruction {} ({backend})",
                            path.display(),
                            At(at)
                        )),
                        blob_root: None,
                        backend: backend.to_owned(),
                        args,
                        location: Location::default(),
                        arg_locations: vec![Location::default(); n],
                    });
                }
                Instruction::Kernel(k) => {
                    let operator = method.operators[k.operator].to_string();
                    let operands = |message: String| {
                        fail(Problem::Operands { at: At(at), operator: operator.clone(), message })
                    };
                    let (src, dst) = if k.name == COPY {
                        match (k.args.first(), k.args.get(1)) {
                            (Some(&dst), Some(&src)) => (src, dst),
                            _ => return Err(operands("expects (self, src, ...)".into())),
                        }
                    } else {
                        match (k.args.first(), k.args.last()) {
                            (Some(&src), Some(&out)) if k.args.len() == 3 => (src, out),
                            _ => return Err(operands("expects (self, memory_format, out)".into())),
                        }
                    };
                    let from = bound
                        .get(&src)
                        .cloned()
                        .ok_or(Problem::Unbound { at: At(at), value: src })
                        .map_err(fail)?;
                    let to = match bound.get(&dst) {
                        Some(b) => b.clone(),
                        None => {
                            let n = format!("%v{dst}");
                            outputs.push(
                                decl(method, dst, &format!("argument of instruction {}", At(at)), &n)
                                    .map_err(fail)?,
                            );
                            let b = Bound::Output(outputs.len() - 1);
                            bound.insert(dst, b.clone());
                            b
                        }
                    };
                    // The out argument of an `out` overload (and copy_'s fourth) is the same value.
                    if from == to {
                        continue;
                    }
                    let (fs, ts) = (slot_of(&from), slot_of(&to));
                    let size = |s: Slot| match s {
                        Slot::Input(i) => (inputs[i].dtype, inputs[i].shape.clone()),
                        Slot::Output(i) => (outputs[i].dtype, outputs[i].shape.clone()),
                        Slot::Buffer(i) => {
                            buffers.values().nth(i).map(|(d, _)| (d.dtype, d.shape.clone())).expect("indexed")
                        }
                    };
                    let (a, b) = (size(fs), size(ts));
                    if a != b {
                        return Err(operands(format!(
                            "copies {} {:?} into {} {:?}; the host copies equal types and shapes only",
                            a.0, a.1, b.0, b.1
                        )));
                    }
                    let after = calls.len().checked_sub(1);
                    method_copies.push(HostCopy { after, from: fs, to: ts });
                }
                _ => {}
            }
        }
        methods.insert(name.to_owned(), Method { name: name.to_owned(), inputs, outputs, calls });
        copies.insert(name.to_owned(), method_copies);
    }
    let manifest = Manifest {
        path: path.to_owned(),
        buffers: buffers.into_iter().map(|(k, (d, _))| (k, d)).collect(),
        methods,
        generate: None,
    };
    Ok(Mapped { manifest, blobs, copies, max_positions })
}

/// The generation section for `manifest` under the generation convention (module docs), or why it does
/// not follow it.
fn generator(manifest: &Manifest, prompt: &[i64], max_positions: Option<u64>) -> Result<Generate, String> {
    let (prefill, decode) =
        if manifest.methods.contains_key("prefill") && manifest.methods.contains_key("decode") {
            ("prefill", "decode")
        } else if manifest.methods.contains_key("forward") {
            ("forward", "forward")
        } else {
            return Err("it has neither methods 'prefill' and 'decode' nor a method 'forward'".into());
        };
    if prompt.is_empty() {
        return Err("the prompt is empty".into());
    }
    let mut names = None;
    for m in [prefill, decode] {
        let method = &manifest.methods[m];
        let (Some(tokens), Some(pos), Some(logits)) =
            (method.inputs.first(), method.inputs.get(1), method.outputs.first())
        else {
            return Err(format!(
                "method '{m}' needs inputs 0 (tokens) and 1 (input_pos) and output 0 (logits)"
            ));
        };
        if tokens.dtype != DType::I64 || tokens.shape.len() != 1 {
            return Err(format!("input 0 of method '{m}' is {}, not i64 [T]", describe(tokens)));
        }
        if pos.dtype != DType::I64 || pos.shape != [1] {
            return Err(format!("input 1 of method '{m}' is {}, not i64 [1]", describe(pos)));
        }
        let rows = tokens.shape[0];
        if !matches!(logits.dtype, DType::F32 | DType::F16)
            || logits.shape.len() != 2
            || logits.shape[0] != rows
        {
            return Err(format!(
                "output 0 of method '{m}' is {}, not f32 or f16 [{rows}, vocab]",
                describe(logits)
            ));
        }
        if m == prefill && (rows == 0 || prompt.len() as u64 % rows != 0) {
            return Err(format!(
                "method '{m}' takes {rows} tokens, which does not divide the prompt of {}",
                prompt.len()
            ));
        }
        if m == decode && rows != 1 {
            return Err(format!("method '{m}' takes {rows} tokens per call; decoding feeds one"));
        }
        let these = (tokens.name.clone(), pos.name.clone(), logits.name.clone());
        match &names {
            None => names = Some(these),
            Some(n) if *n != these => {
                return Err("methods 'prefill' and 'decode' name their inputs and outputs differently".into())
            }
            Some(_) => {}
        }
    }
    let (token_input, position_input, logits_output) = names.expect("two methods checked");
    if let Some(max) = max_positions {
        if prompt.len() as u64 > max {
            return Err(format!(
                "the prompt of {} tokens is longer than the {max} positions the caches hold",
                prompt.len()
            ));
        }
    }
    Ok(Generate {
        prefill: prefill.to_owned(),
        decode: decode.to_owned(),
        prompt: prompt.to_vec(),
        token_input,
        position_input,
        logits_output,
        next_token_output: None,
        max_positions,
    })
}

/// Loads the `.pte` program at `path` (read once into host memory, every delegate payload borrowed from it)
/// with the plugins of `registry` in `mode`; with a
/// `prompt`, as a token generator under the generation convention (module docs).
///
/// Every operator, instruction and backend is checked before any memory is allocated or any delegate
/// initialised; then [`Program::load`]'s checks and initialisation run over the mapped program.
///
/// # Errors
/// [`Error`]: one error naming the file, the method and the instruction where one is at fault.
pub fn load(path: &Path, registry: &Registry, mode: Mode, prompt: Option<&[i64]>) -> Result<Program, Error> {
    let file = Arc::new(BlobFile::open(path).map_err(|source| Error::Io { path: path.to_owned(), source })?);
    let bytes = file.bytes();
    let pte = pte_format::Program::parse(bytes)
        .map_err(|source| Error::Format { path: path.to_owned(), source })?;
    let Mapped { mut manifest, blobs, copies, max_positions } = map_program(path, bytes, &pte, registry)?;
    if let Some(prompt) = prompt {
        let generate = generator(&manifest, prompt, max_positions)
            .map_err(|reason| Error::NotGenerator { path: path.to_owned(), reason })?;
        manifest.generate = Some(generate);
    }
    let embedded = Embedded {
        blobs: blobs
            .into_iter()
            .map(|(key, range)| (key, BlobBytes::Shared { file: Arc::clone(&file), range }))
            .collect(),
        copies,
    };
    Ok(Program::load_embedded(manifest, registry, mode, embedded)?)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_error_stays_small_enough_to_return_everywhere() {
        // clippy's `result_large_err` threshold is 128 bytes.
        assert!(std::mem::size_of::<super::Error>() < 128, "{} bytes", std::mem::size_of::<super::Error>());
    }
}
