//! Our plugins as ExecuTorch backends: one `BackendSlot` per backend id, registered once per process in
//! ExecuTorch's registry, and the per-handle logic of `init` and `execute` (safe code; the raw pointers are
//! `ffi`'s).

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use alias_validate::ArgLayout;
use blob_format::model::Role;
use blob_format::Blob;
use delegate_abi::host::{ArgList, Instance, Plugin, Slot};
use delegate_abi::{
    DTypeCode, DelegateError, InitContext, MemoryKind, Spec, TensorArg, ARG_INOUT, ARG_WRITABLE,
};
use et_error::ErrorCode;
use host_runtime::plugins::{Registry, Served};

use crate::ffi::{self, KvdArg};
use crate::BridgeError;

/// Bytes copied on this thread, counted where each copy is made (ExecuTorch runs delegates and kernels on the
/// thread that executes the method, so a caller reads exactly its own calls). Method inputs copied into
/// their planned tensors and outputs copied out to the caller are not counted: they are the run's I/O.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CopyStats {
    /// DelegateCalls executed.
    pub executes: u64,
    /// `aten::copy_` kernel calls ExecuTorch ran: the program's buffer write-backs.
    pub write_back_calls: u64,
    /// Bytes those `aten::copy_` kernels wrote, counted by the shim's wrapper of ExecuTorch's kernel as it
    /// ran: a write-back whose source is the buffer's own memory (a self-copy) still counts, because the
    /// kernel still copies. Zero when the program has no write-back left (the export's planning pass removes
    /// the self-copies) and for delegate-owned caches.
    pub write_back_bytes: u64,
    /// Bytes the bridge wrote back itself: a plugin that does not bind aliased outputs in place fills a
    /// scratch output, which the bridge copies into the buffer after the call.
    pub bridge_write_back_bytes: u64,
    /// Bytes ExecuTorch's other copy kernels wrote (`aten::copy.out`, `aten::clone.out`, `aten::_to_copy.out`
    /// and their dim-order variants), counted as they ran.
    pub op_bytes: u64,
    /// Bytes the plugins reported copying into separate KV output slots (`ExecStats::reflect_bytes`).
    pub reflect_bytes: u64,
}

impl CopyStats {
    /// Every byte copied: write-back kernels, the bridge's write-backs, other copy kernels and reflects.
    pub fn total(&self) -> u64 {
        self.write_back_bytes
            .saturating_add(self.bridge_write_back_bytes)
            .saturating_add(self.op_bytes)
            .saturating_add(self.reflect_bytes)
    }

    /// Adds `other`'s counts, field by field, saturating (plugins report reflects, which may be anything).
    pub fn add(&mut self, other: CopyStats) {
        self.executes = self.executes.saturating_add(other.executes);
        self.write_back_calls = self.write_back_calls.saturating_add(other.write_back_calls);
        self.write_back_bytes = self.write_back_bytes.saturating_add(other.write_back_bytes);
        self.bridge_write_back_bytes =
            self.bridge_write_back_bytes.saturating_add(other.bridge_write_back_bytes);
        self.op_bytes = self.op_bytes.saturating_add(other.op_bytes);
        self.reflect_bytes = self.reflect_bytes.saturating_add(other.reflect_bytes);
    }
}

/// A [`CopyStats`] with every count zero (`const`, for the thread-local).
const NO_COPIES: CopyStats = CopyStats {
    executes: 0,
    write_back_calls: 0,
    write_back_bytes: 0,
    bridge_write_back_bytes: 0,
    op_bytes: 0,
    reflect_bytes: 0,
};

thread_local! {
    static STATS: Cell<CopyStats> = const { Cell::new(NO_COPIES) };
    static LAST_ERROR: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Returns and resets this thread's [`CopyStats`]: the bridge's own counts and those of the copy kernels
/// ExecuTorch ran (the shim's counting wrappers).
pub fn take_stats() -> CopyStats {
    let mut stats = STATS.with(|s| s.replace(NO_COPIES));
    let kernels = ffi::take_copy_counts();
    stats.write_back_calls = stats.write_back_calls.saturating_add(kernels.write_back_calls);
    stats.write_back_bytes = stats.write_back_bytes.saturating_add(kernels.write_back_bytes);
    stats.op_bytes = stats.op_bytes.saturating_add(kernels.op_bytes);
    stats
}

/// How many of ExecuTorch's registered copy kernels the bridge counts (every kernel of `aten::copy_`,
/// `aten::copy.out`, `aten::clone.out`, `aten::_to_copy.out` and their dim-order variants), and how many of
/// those are `aten::copy_`'s (the write-back; at least one, or write-backs would go uncounted).
pub fn counted_copy_kernels() -> (usize, usize) {
    ffi::counting_kernels()
}

/// Returns and clears the message of the last `init`/`execute` failure on this thread (ExecuTorch itself
/// only carries the numeric code).
pub fn take_last_error() -> Option<String> {
    LAST_ERROR.with(|e| e.borrow_mut().take())
}

pub(crate) fn record_error(message: String) {
    tracing::error!(target: "executorch_bridge", "{message}");
    LAST_ERROR.with(|e| *e.borrow_mut() = Some(message));
}

fn fail(backend: &str, stage: &str, err: DelegateError) -> ErrorCode {
    record_error(format!("backend '{backend}': {stage} failed: {} [{}]", err.message, err.code.name()));
    err.code
}

/// The ExecuTorch-side entry for one backend id: which plugin serves it now. Registered once per process
/// (ExecuTorch's registry cannot unregister); [`register`] again swaps the plugin for later `init`s.
pub(crate) struct BackendSlot {
    pub(crate) id: String,
    plugin: RwLock<Option<Arc<Plugin>>>,
}

fn slots() -> &'static Mutex<BTreeMap<String, &'static BackendSlot>> {
    static SLOTS: OnceLock<Mutex<BTreeMap<String, &'static BackendSlot>>> = OnceLock::new();
    SLOTS.get_or_init(|| Mutex::new(BTreeMap::new()))
}

/// Registers in ExecuTorch's backend registry every backend id that `registry` serves, each forwarding to
/// its plugin. Returns the ids. Calling it again (another registry) points the ids at the new plugins.
///
/// # Errors
/// [`BridgeError::Isolated`] when a plugin serving an id must run isolated (the bridge never loads it);
/// [`BridgeError::Registration`] when ExecuTorch refuses an id (taken by a backend that is not ours, or its
/// table is full).
pub fn register(registry: &Registry) -> Result<Vec<String>, BridgeError> {
    let ids: Vec<String> = registry
        .backends()
        .into_iter()
        .filter(|id| registry.served(id).is_some() || asks_isolation(registry, id).is_some())
        .collect();
    register_backends(registry, &ids)
}

/// Registers the backend ids `ids` only (what a program calls), loading a plugin listed from its manifest
/// only when one of them needs it. Returns the ids.
///
/// # Errors
/// [`BridgeError::Isolated`] when the plugin serving an id must run isolated: its manifest asks for it, or the
/// registry isolates every library plugin ([`Registry::served`] decides). ExecuTorch runs delegates in this
/// process over its own planned memory, so such a plugin is never loaded here.
/// [`BridgeError::PluginUnavailable`] when no usable plugin serves an id (none offers it, or the one that
/// does failed to load or is unavailable, with its reason); [`BridgeError::Registration`] when ExecuTorch
/// refuses an id.
pub fn register_backends(registry: &Registry, ids: &[String]) -> Result<Vec<String>, BridgeError> {
    let mut registered = Vec::new();
    let mut table = slots().lock().unwrap_or_else(|e| e.into_inner());
    for id in ids {
        let id = id.clone();
        let plugin = in_process(registry, &id)?;
        match table.get(&id) {
            Some(slot) => *slot.plugin.write().unwrap_or_else(|e| e.into_inner()) = Some(plugin),
            None => {
                let slot: &'static BackendSlot =
                    Box::leak(Box::new(BackendSlot { id: id.clone(), plugin: RwLock::new(Some(plugin)) }));
                ffi::register(slot)
                    .map_err(|code| BridgeError::Registration { backend: id.clone(), code })?;
                table.insert(id.clone(), slot);
            }
        }
        registered.push(id);
    }
    Ok(registered)
}

/// The plugin that serves `id` in this process, as [`Registry::served`] decides; anything else is an error:
/// a plugin that must run isolated (never loaded here), or none usable.
pub(crate) fn in_process(registry: &Registry, id: &str) -> Result<Arc<Plugin>, BridgeError> {
    match registry.served(id) {
        Some(Served::InProcess(plugin)) => Ok(plugin),
        Some(isolated) => {
            let library = registry.candidate_for_backend(id).map_or_else(|| "?".to_owned(), |c| c.location());
            Err(isolated_error(id, &isolated.info().name, &library))
        }
        // A host without isolation settings serves a plugin whose manifest asks for it nowhere.
        None => Err(asks_isolation(registry, id).unwrap_or_else(|| unavailable(registry, id))),
    }
}

/// [`BridgeError::Isolated`] when a library offering `id` asks to be isolated (`"isolate": true`) and was
/// passed over for it: a registry without isolation settings serves `id` with another plugin or none, never
/// loading that one here. Asked after [`Registry::served`].
fn asks_isolation(registry: &Registry, id: &str) -> Option<BridgeError> {
    let candidate = registry.candidates().iter().find(|c| {
        c.path.is_some()
            && c.plugin().is_none()
            && c.load_failure().is_some()
            && c.manifest.as_ref().is_some_and(|m| m.isolate)
            && c.info.as_ref().is_some_and(|i| i.backends.iter().any(|b| b == id))
    })?;
    Some(isolated_error(id, &candidate.info.as_ref()?.name, &candidate.location()))
}

fn isolated_error(id: &str, plugin: &str, library: &str) -> BridgeError {
    BridgeError::Isolated {
        backend: id.to_owned(),
        plugin: plugin.to_owned(),
        library: library.to_owned(),
        program: None,
    }
}

/// Why no plugin serves `id`: each offering plugin's reason, or that none offers it.
pub(crate) fn unavailable(registry: &Registry, id: &str) -> BridgeError {
    let reasons: Vec<String> =
        registry.unavailable_for(id).map(|(name, why)| format!("plugin {name}: {why}")).collect();
    let failed: Vec<String> = registry
        .candidates()
        .iter()
        .filter(|c| c.info.as_ref().is_some_and(|i| i.backends.iter().any(|b| b == id)))
        .filter_map(|c| c.load_failure().map(|why| format!("{}: {why}", c.location())))
        .collect();
    let reason = match [reasons, failed].concat() {
        r if r.is_empty() => "no plugin offers it".to_owned(),
        r => r.join("; "),
    };
    BridgeError::PluginUnavailable { backend: id.to_owned(), reason }
}

/// Whether ExecuTorch's registry has a backend called `id` (ours or not).
pub fn is_registered(id: &str) -> bool {
    ffi::is_registered(id)
}

/// What an argument position is, from the blob's bindings and aliases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ArgKind {
    /// Read only.
    Input,
    /// A buffer input some output updates in place (our `ARG_INOUT`).
    InOut,
    /// A plain output.
    Output,
    /// The KV output of the input at this position.
    KvOutput { input: usize },
}

impl ArgKind {
    /// What the delegate does with an argument of this kind that it writes (`None`: it only reads it).
    pub(crate) fn written_as(self) -> Option<&'static str> {
        match self {
            ArgKind::Input => None,
            ArgKind::InOut => Some("a buffer the delegate updates in place"),
            ArgKind::Output | ArgKind::KvOutput { .. } => Some("an output the delegate writes"),
        }
    }
}

/// Per argument position of the DelegateCall whose payload is the blob with `header`, what it is and the
/// blob's name for it: the one reading of a blob's argument layout, for `init` and for the pre-flight check
/// of what delegates write ([`crate::written`]).
pub(crate) fn arg_kinds(
    header: &blob_format::model::Header,
) -> Result<Vec<(ArgKind, String)>, DelegateError> {
    let plan = alias_validate::validate_format(header)?;
    let layout = ArgLayout::new(header, &plan)?;
    Ok(layout
        .slots()
        .iter()
        .map(|slot| {
            let kind = match (slot.role, slot.in_place_of()) {
                (Role::Input, _) if slot.is_alias_target() => ArgKind::InOut,
                (Role::Input, _) => ArgKind::Input,
                (Role::Output, Some(input)) => ArgKind::KvOutput { input },
                (Role::Output, None) => ArgKind::Output,
            };
            (kind, slot.name.clone())
        })
        .collect())
}

/// One initialised handle: the plugin instance, what each argument position is, and a reused list.
pub(crate) struct Handle {
    instance: Instance,
    kinds: Vec<ArgKind>,
    names: Vec<String>,
    binds_in_place: bool,
    /// Whether the plugin queues its work on the caller's stream (`Capabilities::caller_stream`): it gets the
    /// managed Module's stream, and the bridge waits for it after the call.
    caller_stream: bool,
    spare: ArgList<'static>,
    inout_slots: Vec<Option<Slot>>,
    /// Per KV output position, the separate output a plugin that does not bind in place fills when
    /// ExecuTorch passed the buffer's own storage (sized at the first call, then reused).
    scratch: Vec<Vec<u8>>,
    /// This call's (scratch output, buffer input) pairs to write back.
    write_backs: Vec<(usize, usize)>,
}

impl BackendSlot {
    fn plugin(&self) -> Option<Arc<Plugin>> {
        self.plugin.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn is_available(&self) -> bool {
        self.plugin().is_some_and(|p| p.is_available())
    }

    pub(crate) fn init(&self, blob: &[u8], compile_specs: &[Spec<'_>]) -> Result<Handle, ErrorCode> {
        self.try_init(blob, compile_specs).map_err(|err| fail(&self.id, "init", err))
    }

    fn try_init(&self, blob: &[u8], compile_specs: &[Spec<'_>]) -> Result<Handle, DelegateError> {
        let plugin = self.plugin().ok_or_else(|| {
            DelegateError::new(ErrorCode::NotFound, format!("no plugin serves backend '{}'", self.id))
        })?;
        let parsed = Blob::parse(blob)?;
        let header = &parsed.header;
        if header.backend_id != self.id {
            return Err(DelegateError::new(
                ErrorCode::DelegateInvalidCompatibility,
                format!(
                    "the payload is a blob for backend '{}', but the program calls '{}'",
                    header.backend_id, self.id
                ),
            ));
        }
        let (kinds, names): (Vec<ArgKind>, Vec<String>) = arg_kinds(header)?.into_iter().unzip();
        // The payload is lent, not copied: ExecuTorch keeps it alive until `destroy` (see `ffi`).
        let instance = plugin.init(&InitContext { blob, compile_specs, runtime_specs: &[] })?;
        let n = kinds.len();
        Ok(Handle {
            instance,
            kinds,
            names,
            binds_in_place: plugin.info().binds_aliases_in_place,
            caller_stream: plugin.info().capabilities.caller_stream,
            spare: ArgList::with_capacity(n),
            inout_slots: vec![None; n],
            scratch: vec![Vec::new(); n],
            write_backs: Vec::with_capacity(n),
        })
    }

    pub(crate) fn execute(&self, handle: &mut Handle, args: &[KvdArg]) -> Result<(), ErrorCode> {
        self.try_execute(handle, args).map_err(|err| fail(&self.id, "execute", err))
    }

    fn try_execute(&self, handle: &mut Handle, args: &[KvdArg]) -> Result<(), DelegateError> {
        if args.len() != handle.kinds.len() {
            return Err(DelegateError::invalid_argument(format!(
                "the DelegateCall passes {} arguments, but the blob threads {} ({})",
                args.len(),
                handle.kinds.len(),
                handle.names.join(", ")
            )));
        }
        let mut list = std::mem::take(&mut handle.spare).recycle();
        handle.inout_slots.iter_mut().for_each(|s| *s = None);
        let mut write_backs = std::mem::take(&mut handle.write_backs);
        write_backs.clear();
        let pushed = (|| -> Result<(), DelegateError> {
            for (position, (kind, raw)) in handle.kinds.iter().zip(args).enumerate() {
                let name = &handle.names[position];
                let flags = match kind {
                    ArgKind::Input => 0,
                    ArgKind::InOut => ARG_WRITABLE | ARG_INOUT,
                    ArgKind::Output | ArgKind::KvOutput { .. } => ARG_WRITABLE,
                };
                let arg = tensor_arg(raw, flags, position, name)?;
                if let ArgKind::KvOutput { input } = *kind {
                    let buffer = &args[input];
                    if buffer.data == raw.data && buffer.nbytes == raw.nbytes {
                        if !handle.binds_in_place {
                            // A plugin that does not bind aliased outputs in place never gets one storage twice
                            // (the host's rule): it fills a scratch output, which the bridge writes back after
                            // the call, as the program's `copy_` would have.
                            let scratch = &mut handle.scratch[position];
                            scratch.resize(raw.nbytes as usize, 0);
                            let mut separate = arg;
                            separate.data = scratch.as_mut_ptr().cast();
                            separate.memory = MemoryKind::Host.into();
                            ffi::push_arg(&mut list, &separate)?;
                            write_backs.push((position, input));
                            continue;
                        }
                        // ExecuTorch planned the KV output on its buffer: the plugin updates it in place.
                        let slot = handle.inout_slots[input].ok_or_else(|| {
                            DelegateError::invalid_program(format!(
                                "argument {position} ('{name}') aliases argument {input}, which comes later"
                            ))
                        })?;
                        list.push_output_in_place(slot, arg.dtype(), &arg.shape[..arg.rank as usize])?;
                        continue;
                    }
                    // A separate output: the plugin fills it, and the program's `copy_` kernel writes it back
                    // into the buffer (counted by the shim as it runs).
                }
                let slot = ffi::push_arg(&mut list, &arg)?;
                if *kind == ArgKind::InOut {
                    handle.inout_slots[position] = Some(slot);
                }
            }
            Ok(())
        })();
        let result = pushed.and_then(|()| run_call(handle.caller_stream, &mut handle.instance, &mut list));
        // The list's borrows of ExecuTorch's memory end here, whatever happened; its capacity is kept.
        handle.spare = list.recycle();
        let stats = result?;
        let mut written = 0u64;
        for &(output, input) in &write_backs {
            written = written.saturating_add(ffi::write_back(&args[input], &handle.scratch[output]));
        }
        handle.write_backs = write_backs;
        STATS.with(|s| {
            let mut now = s.get();
            now.add(CopyStats {
                executes: 1,
                bridge_write_back_bytes: written,
                reflect_bytes: stats.reflect_bytes,
                ..NO_COPIES
            });
            s.set(now);
        });
        Ok(())
    }
}

/// Runs one call: on the executing managed Module's stream when the plugin queues work on the caller's
/// stream (then the bridge waits for the stream before returning, since ExecuTorch's next kernel and the
/// caller read the outputs on the host), else on the plugin's own terms. Counts the host synchronisations
/// the plugin made and the bridge's wait apart ([`crate::planned::SyncStats`]).
fn run_call(
    caller_stream: bool,
    instance: &mut Instance,
    list: &mut ArgList<'static>,
) -> Result<delegate_abi::ExecStats, DelegateError> {
    let stream = if caller_stream { crate::planned::active_stream() } else { None };
    let before = cuda_rt::stats::thread_host_syncs();
    let result = instance.execute(list, stream.as_deref().and_then(ffi::caller_stream));
    let delegate = cuda_rt::stats::thread_host_syncs().saturating_sub(before);
    let Some(stream) = stream else {
        crate::planned::add_syncs(delegate, 0);
        return result;
    };
    // Waited for even after a failed call: the plugin may have queued work that touches the arguments.
    let waited = stream.synchronize().map_err(|err| {
        DelegateError::new(
            et_error::HasErrorCode::error_code(&err),
            format!("waiting for the delegate's work on the bridge's CUDA stream: {err}"),
        )
    });
    crate::planned::add_syncs(delegate, 1);
    let stats = result?;
    waited.map(|()| stats)
}

/// ExecuTorch's `ScalarType` code as our dtype.
fn dtype_of(scalar_type: i32) -> Option<DTypeCode> {
    Some(match scalar_type {
        0 => DTypeCode::U8,
        1 => DTypeCode::I8,
        3 => DTypeCode::I32,
        4 => DTypeCode::I64,
        5 => DTypeCode::F16,
        6 => DTypeCode::F32,
        7 => DTypeCode::F64,
        11 => DTypeCode::Bool,
        15 => DTypeCode::BF16,
        _ => return None,
    })
}

/// ExecuTorch's `ScalarType` code for our dtype.
pub(crate) fn scalar_type_of(dtype: DTypeCode) -> i32 {
    match dtype {
        DTypeCode::U8 => 0,
        DTypeCode::I8 => 1,
        DTypeCode::I32 => 3,
        DTypeCode::I64 => 4,
        DTypeCode::F16 => 5,
        DTypeCode::F32 => 6,
        DTypeCode::F64 => 7,
        DTypeCode::Bool => 11,
        DTypeCode::BF16 => 15,
    }
}

/// The argument as it crosses our ABI: ExecuTorch's pointer, size, dtype and shape, and its memory kind:
/// managed when it lies in the bridge's managed planned memory ([`crate::planned::kind_of`]), else host.
fn tensor_arg(raw: &KvdArg, flags: u32, position: usize, name: &str) -> Result<TensorArg, DelegateError> {
    if raw.is_tensor == 0 {
        return Err(DelegateError::invalid_argument(format!(
            "argument {position} ('{name}') is not a tensor"
        )));
    }
    let dtype = dtype_of(raw.scalar_type).ok_or_else(|| {
        DelegateError::invalid_argument(format!(
            "argument {position} ('{name}') has ExecuTorch scalar type {}, which our ABI does not carry",
            raw.scalar_type
        ))
    })?;
    let rank = raw.rank as usize;
    let dims = raw.shape.get(..rank).ok_or_else(|| {
        DelegateError::invalid_argument(format!("argument {position} ('{name}') has rank {rank}"))
    })?;
    let memory = crate::planned::kind_of(raw.data, raw.nbytes);
    let mut arg = TensorArg::describe(dtype, dims, memory).ok_or_else(|| {
        DelegateError::invalid_argument(format!(
            "argument {position} ('{name}') has rank {rank}, more than our ABI's {}",
            delegate_abi::MAX_RANK
        ))
    })?;
    arg.data = raw.data;
    arg.nbytes = raw.nbytes;
    arg.flags = flags;
    Ok(arg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_crosses_as_executorchs_scalar_type_and_back() {
        for dtype in DTypeCode::ALL {
            assert_eq!(dtype_of(scalar_type_of(dtype)), Some(dtype), "{dtype}");
        }
        // Short (2), ComplexFloat (9) and the quantized types have no dtype of ours.
        for code in [2, 9, 12, 13, 99, -1] {
            assert_eq!(dtype_of(code), None, "{code}");
        }
    }

    #[test]
    fn a_non_tensor_or_unknown_argument_is_invalid_argument_naming_its_position() {
        let mut raw = KvdArg {
            data: std::ptr::null_mut(),
            nbytes: 0,
            shape: [0; crate::ffi::KVD_MAX_RANK],
            rank: 0,
            scalar_type: 6,
            is_tensor: 0,
            reserved: 0,
        };
        let err = tensor_arg(&raw, 0, 3, "tokens").expect_err("not a tensor");
        assert_eq!(err.code, ErrorCode::InvalidArgument);
        assert!(err.message.contains("argument 3 ('tokens')"), "{}", err.message);
        raw.is_tensor = 1;
        raw.scalar_type = 2;
        assert_eq!(tensor_arg(&raw, 0, 1, "x").expect_err("short").code, ErrorCode::InvalidArgument);
        raw.scalar_type = 6;
        raw.rank = 9;
        assert!(tensor_arg(&raw, 0, 1, "x").expect_err("rank 9").message.contains("more than our ABI's 8"));
        raw.rank = 2;
        raw.shape[..2].copy_from_slice(&[3, 4]);
        let arg = tensor_arg(&raw, ARG_WRITABLE, 1, "x").expect("a tensor");
        assert_eq!((arg.dtype(), arg.dims(), arg.flags), (DTypeCode::F32, &[3i64, 4][..], ARG_WRITABLE));
    }
}
