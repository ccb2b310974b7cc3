//! The binding plan: which engine tensor each delegate argument binds, decided once at init, and the per-call
//! decisions (residency gate, staging, scratch, reflect, synchronisation), all pure data, no TensorRT or CUDA.
//!
//! Rules (UPSTREAM.md section 3, with the review's fixes):
//! - Each delegate argument binds the engine tensor the blob names for its position; never by engine order.
//! - An aliased output is bound to its aliased input's caller pointer (the engine writes in place). When the
//!   caller passes separate storage for the output slot, one copy ("reflect") follows the engine.
//! - An aliased output the blob does not thread takes no argument; it is bound to its input's pointer.
//! - Per call, every aliased input passes alias-validate's residency gate *before* any staging or
//!   zero-byte decision, so an in-place update can never land in a delegate buffer and be lost.
//! - Ordinary inputs: zero bytes bind a 1-byte scratch; device/managed memory binds directly; host memory is
//!   staged into a reusable device buffer (one per binding). Ordinary host outputs are read back from one.
//! - Every address TensorRT binds directly must be non-null and 256-byte aligned (`setTensorAddress`).
//! - The stream is synchronised before `execute` returns when anything was staged, read back or reflected,
//!   or when the caller gave no stream; with a caller stream and all I/O device-resident, nothing blocks.

use alias_validate::residency::DirectAccess;
use alias_validate::{AliasPlan, ArgAlias, ArgLayout, ValidKind};
use blob_format::model::{DType, Dim, DisplayShape, Header, Role};
use et_error::MemoryKind;
use et_error::{ErrorCode, HasErrorCode};

use crate::introspect::EngineIo;

/// The alignment TensorRT requires of every address given to `setTensorAddress`.
pub const TENSOR_ALIGNMENT: u64 = 256;

/// Why a binding plan could not be made (init) or a call does not fit it (execute).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BindingError {
    /// The blob binds a tensor the engine does not have.
    #[error("binding '{name}' names no tensor of the engine (engine tensors: {engine}); re-export the blob")]
    NotInEngine {
        /// The binding's name.
        name: String,
        /// The engine's tensor names, comma-separated.
        engine: String,
    },
    /// The blob's role for a tensor disagrees with the engine's I/O mode.
    #[error("binding '{name}' is an {blob} in the blob but an {engine} of the engine")]
    RoleMismatch {
        /// The tensor.
        name: String,
        /// The blob's role.
        blob: Role,
        /// The engine's mode.
        engine: Role,
    },
    /// The engine's element type for a tensor is one this build cannot bind.
    #[error("engine tensor '{name}' has element type {dtype}, which this delegate cannot bind")]
    UnsupportedDType {
        /// The tensor.
        name: String,
        /// TensorRT's type.
        dtype: String,
    },
    /// An engine tensor is bound by nothing: no argument and no alias.
    #[error(
        "engine tensor '{name}' ({role}) has no delegate argument and aliases no input; re-export the blob"
    )]
    Unbound {
        /// The tensor.
        name: String,
        /// Its mode.
        role: Role,
    },
    /// An aliased output's input is not threaded as a delegate argument, so there is no caller storage to
    /// write into.
    #[error("aliased output '{output}' writes into input '{input}', which takes no delegate argument")]
    AliasInputNotThreaded {
        /// The output.
        output: String,
        /// The input.
        input: String,
    },
    /// A call passed the wrong number of arguments.
    #[error("the call passes {got} arguments but the blob binds {expected} ({names})")]
    ArgCount {
        /// Arguments the plan expects.
        expected: usize,
        /// Arguments given.
        got: usize,
        /// The expected tensor names in argument order.
        names: String,
    },
    /// An argument's element type differs from the engine tensor's.
    #[error("argument {index} ('{name}') is {got} but the engine tensor is {expected}")]
    ArgDType {
        /// Argument position.
        index: usize,
        /// Engine tensor.
        name: String,
        /// Engine dtype.
        expected: DType,
        /// Given dtype.
        got: DType,
    },
    /// An argument's shape does not fit the engine tensor's.
    #[error("argument {index} ('{name}') has shape {got:?} but the engine tensor is {}", DisplayShape(.expected))]
    ArgShape {
        /// Argument position.
        index: usize,
        /// Engine tensor.
        name: String,
        /// Engine shape.
        expected: Vec<Dim>,
        /// Given shape.
        got: Vec<i64>,
    },
    /// An argument's byte size does not match its shape and dtype.
    #[error("argument {index} ('{name}') has {got} bytes but shape and dtype need {expected}")]
    ArgSize {
        /// Argument position.
        index: usize,
        /// Engine tensor.
        name: String,
        /// Bytes the shape needs.
        expected: u64,
        /// Bytes given.
        got: u64,
    },
    /// An aliased output slot that is other storage than its input has a different size.
    #[error("aliased output '{output}' slot has {got} bytes but its input '{input}' has {expected}")]
    ReflectSize {
        /// The output.
        output: String,
        /// The input.
        input: String,
        /// The input's bytes.
        expected: u64,
        /// The output slot's bytes.
        got: u64,
    },
    /// An argument's element type is not one this delegate knows.
    #[error("argument {index} has element type {dtype}, which this delegate cannot bind")]
    UnknownArgDType {
        /// Argument position.
        index: usize,
        /// The type's name.
        dtype: String,
    },
    /// An argument of a dynamic-shape input is outside the engine's optimisation profile.
    #[error("argument {index} ('{name}') has shape {got:?}, outside the engine's profile {min:?}..={max:?}")]
    OutsideProfile {
        /// Argument position.
        index: usize,
        /// Engine tensor.
        name: String,
        /// Given shape.
        got: Vec<i64>,
        /// The profile's minimum.
        min: Vec<i64>,
        /// The profile's maximum.
        max: Vec<i64>,
    },
    /// A device or managed argument lives on another CUDA device than the engine.
    #[error("argument {index} is memory of CUDA device {device}, but the engine runs on device {expected}")]
    WrongDevice {
        /// Argument position.
        index: usize,
        /// The argument's device.
        device: i32,
        /// The engine's device.
        expected: i32,
    },
    /// An argument with bytes has a null address.
    #[error("argument {index} ('{name}') has {nbytes} bytes at a null address")]
    NullAddress {
        /// Argument position.
        index: usize,
        /// Engine tensor.
        name: String,
        /// Its size.
        nbytes: u64,
    },
    /// An argument bound to the engine directly is not aligned as TensorRT requires (`setTensorAddress`: at
    /// least 256 bytes; `cudaMalloc` always is, an offset into a larger allocation may not be).
    #[error(
        "argument {index} ('{name}') at {address:#x} is not {align}-byte aligned, as TensorRT requires of bound \
         tensors"
    )]
    Misaligned {
        /// Argument position.
        index: usize,
        /// Engine tensor.
        name: String,
        /// Its address.
        address: u64,
        /// The alignment TensorRT requires.
        align: u64,
    },
    /// The residency gate refused an aliased input (upstream: "aliased input '`<name>`' must be on GPU or
    /// unified memory").
    #[error(transparent)]
    Residency(#[from] alias_validate::Error),
}

impl HasErrorCode for BindingError {
    fn error_code(&self) -> ErrorCode {
        match self {
            BindingError::NotInEngine { .. }
            | BindingError::RoleMismatch { .. }
            | BindingError::Unbound { .. }
            | BindingError::AliasInputNotThreaded { .. } => ErrorCode::InvalidProgram,
            BindingError::UnsupportedDType { .. } => ErrorCode::NotSupported,
            BindingError::ArgCount { .. }
            | BindingError::ArgDType { .. }
            | BindingError::ArgShape { .. }
            | BindingError::ArgSize { .. }
            | BindingError::ReflectSize { .. }
            | BindingError::NullAddress { .. }
            | BindingError::UnknownArgDType { .. }
            | BindingError::WrongDevice { .. }
            | BindingError::OutsideProfile { .. }
            | BindingError::Misaligned { .. } => ErrorCode::InvalidArgument,
            BindingError::Residency(err) => err.error_code(),
        }
    }
}

/// What one delegate argument is to the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArgRole {
    /// An ordinary input: bound directly, staged, or bound to scratch.
    Input {
        /// Its reusable staging buffer.
        staging_slot: usize,
    },
    /// An input some output writes in place: bound directly, never staged; the residency gate applies.
    AliasedInput {
        /// The outputs that write into it.
        outputs: Vec<String>,
    },
    /// An ordinary output: bound directly, or read back through a staging buffer.
    Output {
        /// Its reusable staging buffer.
        staging_slot: usize,
    },
    /// An output bound to its input's caller pointer.
    AliasedOutput {
        /// The aliased input's tensor name.
        input: String,
        /// The aliased input's argument position.
        input_arg: usize,
        /// Why they alias.
        kind: ValidKind,
    },
}

/// One delegate argument's binding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgBinding {
    /// The engine tensor it binds (by name).
    pub tensor: String,
    /// Element type.
    pub dtype: DType,
    /// Engine shape.
    pub shape: Vec<Dim>,
    /// What it is.
    pub role: ArgRole,
}

/// An aliased engine output that takes no argument: bound to its input's caller pointer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnthreadedOutput {
    /// The output tensor.
    pub tensor: String,
    /// The input whose storage it writes.
    pub input: String,
    /// The input's argument position.
    pub input_arg: usize,
}

/// The binding plan, computed once at init.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindingPlan {
    args: Vec<ArgBinding>,
    unthreaded: Vec<UnthreadedOutput>,
    staging_slots: usize,
}

impl BindingPlan {
    /// Decides every binding from the blob header, the engine's introspection and the validated alias plan.
    ///
    /// # Errors
    /// [`BindingError`] (`InvalidProgram`) when the blob and the engine disagree on names or roles, an engine
    /// tensor is left unbound, or an aliased input takes no argument; `NotSupported` for engine dtypes this
    /// build cannot bind.
    pub fn new(header: &Header, engine: &EngineIo, aliases: &AliasPlan) -> Result<BindingPlan, BindingError> {
        let engine_names = || engine.tensors.iter().map(|t| t.name.as_str()).collect::<Vec<_>>().join(", ");
        // Positions, aliased inputs, in-place slots and unthreaded aliased outputs come from the shared layout;
        // this plan adds what only the engine knows (modes, dtypes, shapes) and where each tensor is bound.
        let layout = ArgLayout::new(header, aliases).map_err(|err| match err {
            alias_validate::Error::AliasInputNotThreaded { output, input } => {
                BindingError::AliasInputNotThreaded { output, input }
            }
            other => BindingError::Residency(other),
        })?;
        let mut args = Vec::with_capacity(layout.len());
        let mut staging_slots = 0;
        for slot in layout.slots() {
            let tensor = engine.tensor(&slot.name).ok_or_else(|| BindingError::NotInEngine {
                name: slot.name.clone(),
                engine: engine_names(),
            })?;
            let engine_role: Role = tensor.mode.into();
            if engine_role != slot.role {
                return Err(BindingError::RoleMismatch {
                    name: slot.name.clone(),
                    blob: slot.role,
                    engine: engine_role,
                });
            }
            let dtype = tensor.dtype().ok_or_else(|| BindingError::UnsupportedDType {
                name: tensor.name.clone(),
                dtype: tensor.dtype.clone(),
            })?;
            let role = match slot.alias {
                ArgAlias::InPlace { alias, input_arg, kind } => {
                    ArgRole::AliasedOutput { input: aliases.aliases()[alias].input.clone(), input_arg, kind }
                }
                ArgAlias::Target { alias, .. } => {
                    ArgRole::AliasedInput { outputs: vec![aliases.aliases()[alias].output.clone()] }
                }
                ArgAlias::None => {
                    staging_slots += 1;
                    match slot.role {
                        Role::Input => ArgRole::Input { staging_slot: staging_slots - 1 },
                        Role::Output => ArgRole::Output { staging_slot: staging_slots - 1 },
                    }
                }
            };
            args.push(ArgBinding { tensor: slot.name.clone(), dtype, shape: tensor.dims(), role });
        }
        let mut unthreaded = Vec::new();
        for tensor in &engine.tensors {
            if layout.position(&tensor.name).is_some() {
                continue;
            }
            let role: Role = tensor.mode.into();
            match layout.unthreaded().iter().find(|u| u.output == tensor.name) {
                Some(alias) if role == Role::Output => unthreaded.push(UnthreadedOutput {
                    tensor: tensor.name.clone(),
                    input: aliases.aliases()[alias.alias].input.clone(),
                    input_arg: alias.input_arg,
                }),
                _ => return Err(BindingError::Unbound { name: tensor.name.clone(), role }),
            }
        }
        Ok(BindingPlan { args, unthreaded, staging_slots })
    }

    /// Bindings in delegate-argument order.
    pub fn args(&self) -> &[ArgBinding] {
        &self.args
    }

    /// Aliased outputs that take no argument.
    pub fn unthreaded(&self) -> &[UnthreadedOutput] {
        &self.unthreaded
    }

    /// Number of reusable staging buffers the executor keeps (allocated at init, one per ordinary input or
    /// output; used when the caller's storage is host memory).
    pub fn staging_slots(&self) -> usize {
        self.staging_slots
    }

    /// Decides one call: checks every argument against the plan (residency gate first), then where each engine
    /// tensor is bound and which copies run before and after the engine.
    ///
    /// `integrated_gpu`: host memory is device-visible (one physical memory). `caller_stream`: whether the
    /// caller gave a CUDA stream. Allocates a new [`CallPlan`]; the execute path uses
    /// [`BindingPlan::prepare_into`] with one made by [`BindingPlan::new_call`] at init instead.
    ///
    /// # Errors
    /// [`BindingError`] (`InvalidArgument`): wrong count, dtype, shape or size, a null or misaligned address,
    /// or an aliased input refused by the residency gate. Nothing has been staged or launched when this fails.
    pub fn prepare(
        &self,
        args: &[ArgView<'_>],
        integrated_gpu: bool,
        caller_stream: bool,
    ) -> Result<CallPlan, BindingError> {
        let mut call = self.new_call();
        self.prepare_into(args, integrated_gpu, caller_stream, &mut call)?;
        Ok(call)
    }

    /// A [`CallPlan`] with every binding's tensor name filled in (threaded arguments in order, then the
    /// unthreaded aliased outputs) and room for every copy, so that [`BindingPlan::prepare_into`] never
    /// allocates.
    pub fn new_call(&self) -> CallPlan {
        let mut bindings: Vec<TensorAddress> = self
            .args
            .iter()
            .map(|a| TensorAddress { tensor: a.tensor.clone(), address: Address::Scratch })
            .collect();
        bindings.extend(
            self.unthreaded
                .iter()
                .map(|u| TensorAddress { tensor: u.tensor.clone(), address: Address::Arg(u.input_arg) }),
        );
        CallPlan {
            bindings,
            before: Vec::with_capacity(self.args.len()),
            after: Vec::with_capacity(self.args.len()),
            ..CallPlan::default()
        }
    }

    /// [`BindingPlan::prepare`] into `call`, reusing its storage: with a `call` from
    /// [`BindingPlan::new_call`] of this plan, nothing is allocated. On error `call` is left cleared of
    /// copies (its bindings are meaningless until the next success).
    ///
    /// # Errors
    /// As [`BindingPlan::prepare`].
    pub fn prepare_into(
        &self,
        args: &[ArgView<'_>],
        integrated_gpu: bool,
        caller_stream: bool,
        call: &mut CallPlan,
    ) -> Result<(), BindingError> {
        call.before.clear();
        call.after.clear();
        call.staged_bytes = 0;
        call.reflect_bytes = 0;
        call.synchronize = true;
        self.check_args(args, integrated_gpu)?;
        let expected_len = self.args.len() + self.unthreaded.len();
        if call.bindings.len() != expected_len
            || call.bindings.iter().zip(&self.args).any(|(b, a)| b.tensor != a.tensor)
        {
            *call = CallPlan { synchronize: true, ..self.new_call() };
        }
        if let Err(err) = self.bind_args(args, integrated_gpu, call) {
            call.after.clear();
            call.before.clear();
            return Err(err);
        }
        for (slot, out) in call.bindings[self.args.len()..].iter_mut().zip(&self.unthreaded) {
            slot.address = Address::Arg(out.input_arg);
        }
        call.synchronize = !caller_stream || !call.before.is_empty() || !call.after.is_empty();
        Ok(())
    }

    /// The argument count, the residency gate for aliased inputs (before any staging or zero-byte decision),
    /// then each argument against its binding.
    fn check_args(&self, args: &[ArgView<'_>], integrated_gpu: bool) -> Result<(), BindingError> {
        if args.len() != self.args.len() {
            return Err(BindingError::ArgCount {
                expected: self.args.len(),
                got: args.len(),
                names: self.args.iter().map(|a| a.tensor.as_str()).collect::<Vec<_>>().join(", "),
            });
        }
        for (binding, arg) in self.args.iter().zip(args) {
            if let ArgRole::AliasedInput { .. } = binding.role {
                DirectAccess::gpu(integrated_gpu).check(&binding.tensor, arg.residency, arg.nbytes)?;
            }
        }
        for (index, (binding, arg)) in self.args.iter().zip(args).enumerate() {
            check_arg(index, binding, arg)?;
        }
        Ok(())
    }

    /// Every threaded argument's address, with the copies it needs; each address bound to an argument is
    /// checked for alignment.
    fn bind_args(
        &self,
        args: &[ArgView<'_>],
        integrated_gpu: bool,
        call: &mut CallPlan,
    ) -> Result<(), BindingError> {
        let device_visible = |memory: MemoryKind| DirectAccess::gpu(integrated_gpu).includes(memory);
        for (index, (binding, arg)) in self.args.iter().zip(args).enumerate() {
            let direct = device_visible(arg.residency);
            let address = match &binding.role {
                ArgRole::AliasedInput { .. } => Address::Arg(index),
                ArgRole::Input { staging_slot } => stage_input(index, arg, *staging_slot, direct, call),
                ArgRole::Output { staging_slot } => read_back_output(index, arg, *staging_slot, direct, call),
                ArgRole::AliasedOutput { input, input_arg, .. } => {
                    reflect_aliased_output(index, &binding.tensor, input, (*input_arg, args), call)?
                }
            };
            if let Address::Arg(bound) = address {
                self.check_aligned(bound, &args[bound])?;
            }
            call.bindings[index].address = address;
        }
        Ok(())
    }

    /// The engine reads and writes argument `index` at its own address: it must be [`TENSOR_ALIGNMENT`]-aligned.
    fn check_aligned(&self, index: usize, target: &ArgView<'_>) -> Result<(), BindingError> {
        if target.address % TENSOR_ALIGNMENT != 0 {
            return Err(BindingError::Misaligned {
                index,
                name: self.args[index].tensor.clone(),
                address: target.address,
                align: TENSOR_ALIGNMENT,
            });
        }
        Ok(())
    }
}

/// An ordinary input: the scratch when empty, its own storage when the engine can use it (`direct`), else
/// staged into its buffer before the engine runs.
fn stage_input(index: usize, arg: &ArgView<'_>, slot: usize, direct: bool, call: &mut CallPlan) -> Address {
    if arg.nbytes == 0 {
        Address::Scratch
    } else if direct {
        Address::Arg(index)
    } else {
        call.before.push(Copy::Stage { arg: index, slot, bytes: arg.nbytes });
        call.staged_bytes += arg.nbytes;
        Address::Staging(slot)
    }
}

/// An ordinary output: the scratch when empty, its own storage when the engine can use it (`direct`), else
/// written to its buffer and read back after the engine runs.
fn read_back_output(
    index: usize,
    arg: &ArgView<'_>,
    slot: usize,
    direct: bool,
    call: &mut CallPlan,
) -> Address {
    if arg.nbytes == 0 {
        Address::Scratch
    } else if direct {
        Address::Arg(index)
    } else {
        call.after.push(Copy::ReadBack { slot, arg: index, bytes: arg.nbytes });
        Address::Staging(slot)
    }
}

/// An aliased output `output` (argument `index`) is bound to its input's storage (`input_arg` of `args`);
/// a separate slot gets the input's bytes reflected into it after the engine runs, and must be as large.
fn reflect_aliased_output(
    index: usize,
    output: &str,
    input: &str,
    (input_arg, args): (usize, &[ArgView<'_>]),
    call: &mut CallPlan,
) -> Result<Address, BindingError> {
    let (arg, source) = (&args[index], &args[input_arg]);
    if !arg.same_storage(source) {
        if arg.nbytes != source.nbytes {
            return Err(BindingError::ReflectSize {
                output: output.to_owned(),
                input: input.to_owned(),
                expected: source.nbytes,
                got: arg.nbytes,
            });
        }
        call.after.push(Copy::Reflect { from_arg: input_arg, to_arg: index, bytes: arg.nbytes });
        call.reflect_bytes += arg.nbytes;
    }
    Ok(Address::Arg(input_arg))
}

fn check_arg(index: usize, binding: &ArgBinding, arg: &ArgView<'_>) -> Result<(), BindingError> {
    if arg.address == 0 && arg.nbytes > 0 {
        return Err(BindingError::NullAddress { index, name: binding.tensor.clone(), nbytes: arg.nbytes });
    }
    if arg.dtype != binding.dtype {
        return Err(BindingError::ArgDType {
            index,
            name: binding.tensor.clone(),
            expected: binding.dtype,
            got: arg.dtype,
        });
    }
    let fits = arg.shape.len() == binding.shape.len()
        && arg.shape.iter().zip(&binding.shape).all(|(&got, want)| match want {
            Dim::Static(n) => u64::try_from(got).is_ok_and(|g| g == *n),
            Dim::Dynamic => got >= 0,
        });
    if !fits {
        return Err(BindingError::ArgShape {
            index,
            name: binding.tensor.clone(),
            expected: binding.shape.clone(),
            got: arg.shape.to_vec(),
        });
    }
    let expected = arg.shape.iter().try_fold(binding.dtype.size_bytes() as u64, |acc, &d| {
        u64::try_from(d).ok().and_then(|d| acc.checked_mul(d))
    });
    if expected != Some(arg.nbytes) {
        return Err(BindingError::ArgSize {
            index,
            name: binding.tensor.clone(),
            expected: expected.unwrap_or(u64::MAX),
            got: arg.nbytes,
        });
    }
    Ok(())
}

/// One call argument as the plan sees it: where it lives, not what it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArgView<'a> {
    /// Address of the first byte (host or device).
    pub address: u64,
    /// Size in bytes.
    pub nbytes: u64,
    /// Where the storage lives.
    pub residency: MemoryKind,
    /// Element type.
    pub dtype: DType,
    /// Extents.
    pub shape: &'a [i64],
}

impl ArgView<'_> {
    /// Same address and size: the caller passed one storage for an input and its aliased output.
    pub fn same_storage(&self, other: &ArgView<'_>) -> bool {
        self.address == other.address && self.nbytes == other.nbytes
    }
}

/// Where an engine tensor is bound for one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Address {
    /// The caller's storage of argument `n`.
    Arg(usize),
    /// The delegate's reusable device buffer `n`.
    Staging(usize),
    /// The delegate's 1-byte scratch (zero-byte tensors).
    Scratch,
}

/// A copy the executor queues on the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Copy {
    /// Host argument -> staging buffer, before the engine.
    Stage {
        /// Argument.
        arg: usize,
        /// Staging buffer.
        slot: usize,
        /// Bytes.
        bytes: u64,
    },
    /// Staging buffer -> host argument, after the engine.
    ReadBack {
        /// Staging buffer.
        slot: usize,
        /// Argument.
        arg: usize,
        /// Bytes.
        bytes: u64,
    },
    /// Aliased input's storage -> the separate output slot, after the engine.
    Reflect {
        /// The aliased input's argument.
        from_arg: usize,
        /// The output slot's argument.
        to_arg: usize,
        /// Bytes.
        bytes: u64,
    },
}

/// Engine tensor -> address, for `setTensorAddress`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorAddress {
    /// Engine tensor name.
    pub tensor: String,
    /// Where it is bound.
    pub address: Address,
}

/// Everything one call does, decided before anything runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallPlan {
    /// Every engine tensor's address (threaded args in order, then unthreaded aliased outputs).
    pub bindings: Vec<TensorAddress>,
    /// Copies queued before `enqueueV3`.
    pub before: Vec<Copy>,
    /// Copies queued after `enqueueV3`.
    pub after: Vec<Copy>,
    /// Whether the stream must be synchronised before `execute` returns.
    pub synchronize: bool,
    /// Bytes staged host -> device.
    pub staged_bytes: u64,
    /// Bytes reflected from aliased inputs into separate output slots.
    pub reflect_bytes: u64,
}
