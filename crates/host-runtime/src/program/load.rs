//! Loading: every call planned first ([`super::plan`]), then the buffers, the methods' inputs and outputs and
//! the program's stream allocated, each call's delegate initialised, its argument list built over the
//! program's storages, and the workers of isolated calls started.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use delegate_abi::host::ArgList;
use delegate_abi::InitContext;
use program_manifest::{Manifest, Method, TensorDecl};

use super::attached::{Attached, CopySlot};
use super::plan::{plan_call, PlannedCall};
use super::{
    isolated, Buffer, CallInstance, CopyReason, Error, Gpu, IoRole, LoadedCall, LoadedMethod, Mode, Program,
};
use crate::buffer::{AllocError, Storage};
use crate::cuda::{self, Contexts};
use crate::plugins::Registry;

impl Program {
    /// Loads `manifest`'s program: checks every call against its blob and plugin, allocates and zeroes the
    /// buffers and the methods' inputs and outputs, and initialises one delegate instance per call (methods
    /// do not share instances; they share buffers).
    ///
    /// Every call is checked before any memory is allocated or any delegate initialised; then the buffers
    /// are allocated in their declared memory kinds (opening a CUDA context only for device, managed or
    /// pinned memory), then the inputs and outputs, the program's stream (when it declares CUDA memory),
    /// and each call's copy-back scratch and delegate instance. A token generator whose `[generate]` names no
    /// `max_positions` is given the one its buffers' shapes tell ([`Manifest::positions_from_buffers`]), as
    /// [`Program::manifest`] then shows.
    ///
    /// # Errors
    /// Besides the argument, plugin and allocation errors: [`Error::Devices`] when the program's CUDA memory
    /// names more than one device.
    pub fn load(manifest: Manifest, registry: &Registry, mode: Mode) -> Result<Program, Error> {
        Program::load_attached(manifest, registry, mode, Attached::default())
    }

    /// [`Program::load`] with blobs and host copies from `attached` (a `.pte` program).
    pub(crate) fn load_attached(
        mut manifest: Manifest,
        registry: &Registry,
        mode: Mode,
        mut attached: Attached,
    ) -> Result<Program, Error> {
        fill_max_positions(&mut manifest);
        let origin = attached.origin;
        let device = program_device(&manifest)?;
        let planned = plan_calls(&manifest, registry, mode, &mut attached)?;
        let blob_identity = blob_identity(&manifest, &planned);
        if mode.is_strict() {
            refuse_cache_copies(&manifest, &attached)?;
        }
        let mut contexts = Contexts::new();
        let shared = isolated::any_isolated(planned.iter().flatten());
        let mut buffers = manifest
            .buffers
            .values()
            .map(|decl| Ok(Buffer { decl: decl.clone(), storage: allocate(decl, &mut contexts, shared)? }))
            .collect::<Result<Vec<Buffer>, Error>>()?;
        let mut io = Vec::with_capacity(manifest.methods.len());
        for method in manifest.methods.values() {
            let inputs = allocate_io(method, IoRole::Input, &method.inputs, &mut contexts, shared)?;
            let outputs = allocate_io(method, IoRole::Output, &method.outputs, &mut contexts, shared)?;
            io.push((inputs, outputs));
        }
        let gpu = device.map(|device| program_stream(&mut contexts, device)).transpose()?;
        let mut methods = Vec::with_capacity(manifest.methods.len());
        for ((method, planned), (inputs, outputs)) in manifest.methods.values().zip(planned).zip(io) {
            let calls = planned
                .into_iter()
                .enumerate()
                .map(|(index, call)| init_call(method, index, call, &buffers, &mut contexts, shared))
                .collect::<Result<Vec<_>, Error>>()?;
            let copies = attached.copies.remove(&method.name).unwrap_or_default();
            methods.push(LoadedMethod { decl: method.clone(), inputs, outputs, calls, copies });
        }
        lend_arguments(&mut methods, &mut buffers)?;
        if shared {
            isolated::start(&mut methods, &buffers)?;
        }
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        Ok(Program {
            id,
            manifest,
            mode,
            buffers,
            methods,
            gpu,
            torn: None,
            blob_identity,
            position: Some(0),
            cache_epoch: 0,
            origin,
        })
    }
}

/// A token generator whose `[generate]` names no `max_positions` holds as many positions as its buffers'
/// shapes tell ([`Manifest::positions_from_buffers`]), so every check of positions (the steps a generation
/// may run, a plugin's stated limit, the caches' sequence axis) applies to it too. Set before any call is
/// planned.
fn fill_max_positions(manifest: &mut Manifest) {
    let from_buffers = manifest.positions_from_buffers();
    if let Some(g) = manifest.generate.as_mut() {
        g.max_positions = g.max_positions.or(from_buffers);
    }
}

/// Every call of every method planned, method by method, before anything is allocated.
fn plan_calls(
    manifest: &Manifest,
    registry: &Registry,
    mode: Mode,
    attached: &mut Attached,
) -> Result<Vec<Vec<PlannedCall>>, Error> {
    let decls: Vec<&TensorDecl> = manifest.buffers.values().collect();
    manifest
        .methods
        .values()
        .map(|method| {
            (0..method.calls.len())
                .map(|index| {
                    let blob = attached.blobs.remove(&(method.name.clone(), index));
                    plan_call(manifest, method, index, blob, &decls, registry, mode)
                })
                .collect()
        })
        .collect()
}

/// Each call's blob hash, keyed `method/call index`, taken from the bytes the call was planned and initialised
/// with (not read again later, so a blob file replaced after load cannot change the program's identity).
fn blob_identity(manifest: &Manifest, planned: &[Vec<PlannedCall>]) -> BTreeMap<String, String> {
    manifest
        .methods
        .keys()
        .zip(planned)
        .flat_map(|(name, calls)| {
            calls
                .iter()
                .enumerate()
                .map(move |(index, call)| (format!("{name}/{index}"), call.blob_sha256.clone()))
        })
        .collect()
}

/// Strict zero-copy's check of a `.pte` program's host copies: one that reads or writes a buffer copies
/// cache bytes on every step ([`CopyReason::HostCopy`]).
fn refuse_cache_copies(manifest: &Manifest, attached: &Attached) -> Result<(), Error> {
    for (method, copies) in &attached.copies {
        for copy in copies {
            let buffer = [copy.to, copy.from].into_iter().find_map(|slot| match slot {
                CopySlot::Buffer(b) => manifest.buffers.values().nth(b),
                _ => None,
            });
            if let Some(buffer) = buffer {
                let call = match copy.after {
                    Some(index) => format!("the host copy after call {index}"),
                    None => "the host copy before the first call".to_owned(),
                };
                return Err(Error::NotZeroCopy {
                    method: method.clone(),
                    call,
                    argument: format!("buffer '{}'", buffer.name),
                    reason: Box::new(CopyReason::HostCopy),
                });
            }
        }
    }
    Ok(())
}

/// The program's stream, on its one device.
fn program_stream(contexts: &mut Contexts, device: i32) -> Result<Gpu, Error> {
    let stream_error = |source| Error::Stream { action: "creating", source };
    let ctx = contexts.get(device).map_err(stream_error)?;
    let stream = cuda::Stream::new(&ctx).map_err(stream_error)?;
    Ok(Gpu { ctx, stream, pending: AtomicBool::new(false) })
}

/// Builds every call's argument list over the program's storages, once (see [`crate::lend`]).
pub(super) fn lend_arguments(methods: &mut [LoadedMethod], buffers: &mut [Buffer]) -> Result<(), Error> {
    for m in methods {
        let LoadedMethod { decl, inputs, outputs, calls, .. } = m;
        for (index, call) in calls.iter_mut().enumerate() {
            let storages =
                crate::lend::Storages { buffers: &mut *buffers, inputs, outputs, scratch: &mut call.scratch };
            call.arg_list = crate::lend::arg_list(&call.args, storages).map_err(|source| Error::Lend {
                method: decl.name.clone(),
                call: index,
                source: Box::new(source),
            })?;
        }
    }
    Ok(())
}

fn allocate(decl: &TensorDecl, contexts: &mut Contexts, shared: bool) -> Result<Storage, Error> {
    let memory = decl.memory;
    isolated::zeroed(memory, decl.device, host_size(decl.nbytes()), contexts, shared)
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
            let memory = d.memory;
            isolated::zeroed(memory, d.device, host_size(d.nbytes()), contexts, shared).map_err(
                |source: AllocError| Error::TensorMemory {
                    method: method.name.clone(),
                    role,
                    tensor: d.name.clone(),
                    memory,
                    source,
                },
            )
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

/// Allocates a planned call's copy-back scratch (each of its buffer's memory kind, size and device) and
/// initialises its delegate instance; an isolated call's worker starts later ([`isolated::start`]).
fn init_call(
    method: &Method,
    index: usize,
    planned: PlannedCall,
    buffers: &[Buffer],
    contexts: &mut Contexts,
    shared: bool,
) -> Result<LoadedCall, Error> {
    let PlannedCall { file, plugin, args, scratch_of, streamed, .. } = planned;
    let backend = method.calls[index].backend.clone();
    let scratch = scratch_of
        .iter()
        .map(|&b| allocate(&buffers[b].decl, contexts, shared))
        .collect::<Result<Vec<Storage>, Error>>()?;
    let writebacks = scratch_of.iter().copied().enumerate().collect();
    let arg_list = ArgList::with_capacity(args.len());
    let instance = match isolated::in_process(plugin, file) {
        Ok((plugin, file)) => {
            let ctx = InitContext { blob: file.bytes(), compile_specs: &[], runtime_specs: &[] };
            let instance = plugin.init(&ctx).map_err(|source| Error::Delegate {
                method: method.name.clone(),
                call: index,
                backend: backend.clone(),
                stage: "init",
                source,
            })?;
            CallInstance::InProcess(instance)
        }
        Err(unstarted) => CallInstance::Unstarted(Box::new(unstarted)),
    };
    Ok(LoadedCall { backend, instance, args, arg_list, scratch, writebacks, streamed })
}
