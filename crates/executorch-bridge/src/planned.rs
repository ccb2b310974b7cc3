//! Where ExecuTorch's planned memory lives: the Module's own host buffers, or CUDA managed memory the bridge
//! supplies through ExecuTorch's allocator interface, so a GPU delegate updates the caches where they are.
//!
//! - **the choice** ([`choose`], a pure function): [`PlannedMemory::Host`] when every plugin the program calls
//!   updates host memory in place (the reference delegate: nothing changes for CPU programs);
//!   [`PlannedMemory::Managed`] when one of them does not but updates managed memory in place (the CUDA
//!   delegate, which would otherwise refuse or stage every host cache on every step). `et-run --memory`
//!   overrides it.
//! - **managed planned memory** ([`ManagedPlan`]): every `memory_planned_buffer` of every method (mem_id 1
//!   and 2, activations and the mutable buffers holding the caches, shared across methods at their largest
//!   size as the Module's own `share_memory_arenas` shares them; the others per method), allocated zeroed with
//!   `cuda_rt::Allocation<Managed>` and handed to the shim, which loads each method with a
//!   `HierarchicalAllocator` over them (`Module::load_method(name, planned_memory)`). ExecuTorch's own kernels
//!   read and write it from the host; the delegate reads and writes it on the GPU, in place.
//! - **memory kinds**: the address ranges of live managed plans are registered ([`kind_of`]), so the bridge
//!   passes each DelegateCall argument as [`MemoryKind::Managed`] when it lies in one (planned tensors) and as
//!   [`MemoryKind::Host`] otherwise (constants in the program file).
//! - **the stream**: while a managed Module executes, its stream is this thread's ([`ActiveStream`]); a plugin
//!   that queues work on the caller's stream (`Capabilities::caller_stream`) gets it, and the bridge waits for
//!   it after the call, before ExecuTorch's next kernel or the caller reads the outputs on the host. So the
//!   delegate itself never synchronises: [`SyncStats`] counts the delegate's synchronisations and the
//!   bridge's apart.

use std::cell::{Cell, RefCell};
use std::sync::{Arc, RwLock};

use cuda_rt::{Allocation, Context, Managed, Stream};
use delegate_abi::{MemoryKind, PluginInfo};

/// Where a Module's memory-planned buffers live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PlannedMemory {
    /// Host memory the Module allocates (ExecuTorch's default).
    Host,
    /// CUDA managed memory the bridge allocates (device 0), readable by ExecuTorch's kernels on the host
    /// and updated in place by a GPU delegate.
    Managed,
}

impl PlannedMemory {
    /// `"host"` or `"managed"`.
    pub const fn name(self) -> &'static str {
        match self {
            PlannedMemory::Host => "host",
            PlannedMemory::Managed => "managed",
        }
    }

    /// The memory kind a plugin sees for a planned tensor.
    pub const fn kind(self) -> MemoryKind {
        match self {
            PlannedMemory::Host => MemoryKind::Host,
            PlannedMemory::Managed => MemoryKind::Managed,
        }
    }
}

impl std::fmt::Display for PlannedMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for PlannedMemory {
    type Err = String;

    fn from_str(s: &str) -> Result<PlannedMemory, String> {
        match s {
            "host" => Ok(PlannedMemory::Host),
            "managed" => Ok(PlannedMemory::Managed),
            other => Err(format!("'{other}' is not a planned memory: use host or managed")),
        }
    }
}

/// The planned memory for a program whose DelegateCalls are served by `plugins`: managed when one of them
/// does not update host memory in place but does update managed memory in place (a GPU delegate), host
/// otherwise (no delegate, CPU delegates, or a plugin that updates neither, which stages either way).
pub fn choose(plugins: &[&PluginInfo]) -> PlannedMemory {
    let wants_managed = plugins
        .iter()
        .any(|info| !info.updates_in_place(MemoryKind::Host) && info.updates_in_place(MemoryKind::Managed));
    if wants_managed {
        PlannedMemory::Managed
    } else {
        PlannedMemory::Host
    }
}

/// Address ranges `[start, end)` of the live managed plans' allocations.
static MANAGED_RANGES: RwLock<Vec<(usize, usize)>> = RwLock::new(Vec::new());

/// The memory kind of the `nbytes` at `data`: managed when they lie inside a live [`ManagedPlan`]'s
/// allocation, host otherwise.
pub(crate) fn kind_of(data: *const std::ffi::c_void, nbytes: u64) -> MemoryKind {
    let start = data as usize;
    let Some(end) = usize::try_from(nbytes).ok().and_then(|n| start.checked_add(n)) else {
        return MemoryKind::Host;
    };
    let ranges = MANAGED_RANGES.read().unwrap_or_else(|e| e.into_inner());
    if ranges.iter().any(|&(lo, hi)| lo <= start && end <= hi) {
        MemoryKind::Managed
    } else {
        MemoryKind::Host
    }
}

/// One planned buffer: CUDA managed memory, or (unit tests of the allocator route, on machines without a GPU)
/// zeroed host memory.
enum Buffer {
    Managed(Allocation<Managed>),
    #[cfg(test)]
    Host {
        _bytes: Vec<u8>,
        ptr: *mut std::ffi::c_void,
    },
}

impl Buffer {
    fn ptr(&self) -> *mut std::ffi::c_void {
        match self {
            Buffer::Managed(allocation) => allocation.as_ptr(),
            #[cfg(test)]
            Buffer::Host { ptr, .. } => *ptr,
        }
    }
}

/// The planned buffers of a Module in CUDA managed memory, and the stream its delegates run on. Registered
/// in [`kind_of`]'s ranges while alive; must outlive the Module that loaded methods over them (`RawModule`
/// frees its ExecuTorch Module first).
///
/// The shared buffers are sized for the methods the plan was made for, and only those methods get spans
/// ([`ManagedPlan::spans`]): another method's planned buffers may be larger than the shared allocation, and
/// ExecuTorch would place its tensors past the end.
pub(crate) struct ManagedPlan {
    /// The methods the shared buffers were sized for.
    methods: Vec<String>,
    /// mem_id 1 and 2, shared by every method (each at its largest size over the methods).
    shared: Vec<Buffer>,
    /// Per method, its buffers from mem_id 3 on.
    own: Vec<Buffer>,
    /// Where the buffers are allocated and the delegates' stream (`None`: host memory, unit tests only).
    device: Option<(Context, Arc<Stream>)>,
}

impl std::fmt::Debug for ManagedPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagedPlan")
            .field("shared", &self.shared.len())
            .field("own", &self.own.len())
            .finish()
    }
}

/// How many planned buffers (from mem_id 1) the methods share, as ExecuTorch's `share_memory_arenas` does.
pub(crate) const SHARED_BUFFERS: usize = 2;

/// Why [`ManagedPlan::spans`] gave no spans.
#[derive(Debug)]
pub(crate) enum SpanError {
    /// The method is not one the plan was sized for.
    NotPlannedFor {
        /// The method.
        method: String,
        /// The methods the plan was sized for.
        planned_for: Vec<String>,
    },
    /// Managed memory for the method's own buffers could not be allocated.
    Memory(cuda_rt::Error),
}

impl ManagedPlan {
    /// Opens device 0 and allocates the shared buffers: per index below [`SHARED_BUFFERS`], the largest size
    /// any method plans there (`methods`: per method, its name and its buffer sizes from mem_id 1).
    pub(crate) fn new(methods: &[(String, Vec<u64>)]) -> Result<ManagedPlan, cuda_rt::Error> {
        let ctx = Context::open(0)?;
        let stream = Arc::new(Stream::new(&ctx)?);
        ManagedPlan::with(methods, Some((ctx, stream)))
    }

    /// The same route over zeroed host memory (no stream): tests the allocator route without a GPU.
    #[cfg(test)]
    pub(crate) fn in_host_memory(methods: &[(String, Vec<u64>)]) -> ManagedPlan {
        ManagedPlan::with(methods, None).unwrap_or_else(|e| panic!("host memory: {e}"))
    }

    fn with(
        methods: &[(String, Vec<u64>)],
        device: Option<(Context, Arc<Stream>)>,
    ) -> Result<ManagedPlan, cuda_rt::Error> {
        let names = methods.iter().map(|(name, _)| name.clone()).collect();
        let mut plan = ManagedPlan { methods: names, shared: Vec::new(), own: Vec::new(), device };
        for index in 0..SHARED_BUFFERS {
            let Some(&largest) = methods.iter().filter_map(|(_, s)| s.get(index)).max() else { break };
            let buffer = plan.zeroed(largest)?;
            plan.shared.push(buffer);
        }
        Ok(plan)
    }

    /// `len` zero bytes (at least one: the driver refuses an empty allocation; nothing is placed there),
    /// registered in [`kind_of`]'s ranges.
    fn zeroed(&self, len: u64) -> Result<Buffer, cuda_rt::Error> {
        let len = usize::try_from(len.max(1)).unwrap_or(usize::MAX);
        let buffer = match &self.device {
            Some((ctx, _)) => Buffer::Managed(Allocation::<Managed>::zeroed(ctx, len)?),
            #[cfg(test)]
            None => {
                let mut bytes = vec![0u8; len];
                let ptr = bytes.as_mut_ptr().cast();
                Buffer::Host { _bytes: bytes, ptr }
            }
            #[cfg(not(test))]
            None => return Err(cuda_rt::Error::NoDriver { reason: "no device context".to_owned() }),
        };
        let start = buffer.ptr() as usize;
        MANAGED_RANGES.write().unwrap_or_else(|e| e.into_inner()).push((start, start.saturating_add(len)));
        Ok(buffer)
    }

    /// The spans (pointer, length) of `method`, whose buffers have `sizes`: the shared buffers first, then new
    /// allocations of this plan for the rest. Only for a method the plan was sized for: the shared buffers hold
    /// the largest of those methods' buffers, and no other's.
    pub(crate) fn spans(
        &mut self,
        method: &str,
        sizes: &[u64],
    ) -> Result<Vec<(*mut std::ffi::c_void, u64)>, SpanError> {
        if !self.methods.iter().any(|m| m == method) {
            return Err(SpanError::NotPlannedFor {
                method: method.to_owned(),
                planned_for: self.methods.clone(),
            });
        }
        let mut spans = Vec::with_capacity(sizes.len());
        for (index, &size) in sizes.iter().enumerate() {
            let ptr = match self.shared.get(index) {
                Some(shared) => shared.ptr(),
                None => {
                    let buffer = self.zeroed(size).map_err(SpanError::Memory)?;
                    let ptr = buffer.ptr();
                    self.own.push(buffer);
                    ptr
                }
            };
            spans.push((ptr, size));
        }
        Ok(spans)
    }

    /// The stream this plan's delegates run on (`None` for the unit tests' host memory).
    pub(crate) fn stream(&self) -> Option<&Arc<Stream>> {
        self.device.as_ref().map(|(_, stream)| stream)
    }
}

impl Drop for ManagedPlan {
    fn drop(&mut self) {
        let mine: Vec<usize> = self.shared.iter().chain(&self.own).map(|b| b.ptr() as usize).collect();
        MANAGED_RANGES.write().unwrap_or_else(|e| e.into_inner()).retain(|(lo, _)| !mine.contains(lo));
    }
}

thread_local! {
    static ACTIVE: RefCell<Option<Arc<Stream>>> = const { RefCell::new(None) };
    static SYNCS: Cell<SyncStats> = const { Cell::new(SyncStats { delegate: 0, bridge: 0 }) };
}

/// This thread's stream while a managed Module executes: set by [`ActiveStream::enter`], cleared on drop.
pub(crate) struct ActiveStream(());

impl ActiveStream {
    pub(crate) fn enter(stream: Arc<Stream>) -> ActiveStream {
        ACTIVE.with(|a| *a.borrow_mut() = Some(stream));
        ActiveStream(())
    }
}

impl Drop for ActiveStream {
    fn drop(&mut self) {
        ACTIVE.with(|a| a.borrow_mut().take());
    }
}

/// The stream of the managed Module executing on this thread, if any.
pub(crate) fn active_stream() -> Option<Arc<Stream>> {
    ACTIVE.with(|a| a.borrow().clone())
}

/// Host synchronisations with the GPU on this thread (`cuda_rt::stats::thread_host_syncs`), split by who made
/// them. A plugin embedded in this binary (et-run embeds the CUDA delegate) counts into the same counter; one
/// loaded from a dylib has its own copy of `cuda-rt`, whose synchronisations are not seen here.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SyncStats {
    /// Inside the plugins' `execute` (zero for a delegate that queues its work on the bridge's stream).
    pub delegate: u64,
    /// The bridge's waits for a delegate's stream after its call, before ExecuTorch's next kernel (one per
    /// DelegateCall of a managed program).
    pub bridge: u64,
}

pub(crate) fn add_syncs(delegate: u64, bridge: u64) {
    SYNCS.with(|s| {
        let now = s.get();
        s.set(SyncStats {
            delegate: now.delegate.saturating_add(delegate),
            bridge: now.bridge.saturating_add(bridge),
        });
    });
}

/// Returns and resets this thread's [`SyncStats`].
pub fn take_syncs() -> SyncStats {
    SYNCS.with(|s| s.replace(SyncStats::default()))
}

/// The integration tests' programs (kv-example's blobs in `.pte` files laid out as ExecuTorch's exporter lays
/// them out), for the allocator-route test below.
#[cfg(test)]
#[path = "../tests/common/mod.rs"]
mod test_common;

#[cfg(test)]
mod tests {
    use super::*;
    use delegate_abi::Capabilities;

    fn plugin(kinds: &[MemoryKind], in_place: Option<Vec<MemoryKind>>) -> PluginInfo {
        let mut capabilities = Capabilities::default();
        capabilities.in_place_memory_kinds = in_place;
        PluginInfo::new("p", "1")
            .with_backend("B")
            .with_memory_kinds(kinds.iter().copied())
            .with_binds_aliases_in_place(true)
            .with_capabilities(capabilities)
    }

    #[test]
    fn a_gpu_delegate_gets_managed_planned_memory_and_a_cpu_delegate_keeps_host() {
        use MemoryKind::{Device, Host, Managed, Pinned};
        let reference = plugin(&[Host, Pinned, Managed], Some(vec![Host, Pinned, Managed]));
        let cuda = plugin(&[Host, Device, Managed, Pinned], Some(vec![Device, Managed]));
        assert_eq!(choose(&[&reference]), PlannedMemory::Host);
        assert_eq!(choose(&[&cuda]), PlannedMemory::Managed);
        // Mixed: both update managed memory in place; host would stage the GPU delegate's caches.
        assert_eq!(choose(&[&reference, &cuda]), PlannedMemory::Managed);
        assert_eq!(choose(&[]), PlannedMemory::Host, "no delegate: ExecuTorch's own memory");
        // A plugin that updates nothing in place stages anywhere: host, the cheaper.
        assert_eq!(choose(&[&plugin(&[Host, Device], Some(vec![]))]), PlannedMemory::Host);
        // Not stated: a plugin that accepts device memory is a GPU plugin (managed), others keep host.
        assert_eq!(choose(&[&plugin(&[Device, Managed], None)]), PlannedMemory::Managed);
        assert_eq!(choose(&[&plugin(&[Host], None)]), PlannedMemory::Host);
    }

    #[test]
    fn planned_memory_reads_its_names_and_refuses_others() {
        for memory in [PlannedMemory::Host, PlannedMemory::Managed] {
            assert_eq!(memory.name().parse::<PlannedMemory>(), Ok(memory));
        }
        let err = "device".parse::<PlannedMemory>().expect_err("not a choice");
        assert!(err.contains("'device'") && err.contains("host or managed"), "{err}");
        assert_eq!(PlannedMemory::Managed.kind(), MemoryKind::Managed);
    }

    use super::test_common as common;

    /// Prefill, then three decode steps, on `module`: every output's bytes.
    fn outputs(mut module: crate::runner::Module, summary: &crate::runner::ProgramSummary) -> Vec<Vec<u8>> {
        use crate::runner::Input;
        let mut all = Vec::new();
        let steps: Vec<(&str, Vec<i64>, i64)> = vec![
            ("prefill", common::PROMPT.to_vec(), 0),
            ("decode", vec![5], 4),
            ("decode", vec![9], 5),
            ("decode", vec![2], 6),
        ];
        for method in ["prefill", "decode"] {
            module.load_method(method).expect("load");
        }
        for (method, tokens, pos) in steps {
            let token_bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
            let pos_bytes = pos.to_le_bytes();
            let shape = [tokens.len() as i64];
            let inputs = [
                Input { data: &token_bytes, dtype: delegate_abi::DTypeCode::I64, shape: &shape },
                Input { data: &pos_bytes, dtype: delegate_abi::DTypeCode::I64, shape: &[1] },
            ];
            let sizes = &summary.output_bytes.iter().find(|(m, _)| m == method).expect("sizes").1;
            let mut buffers: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n as usize]).collect();
            let mut views: Vec<&mut [u8]> = buffers.iter_mut().map(Vec::as_mut_slice).collect();
            module.execute(method, &inputs, &mut views).expect("execute");
            all.extend(buffers);
        }
        all
    }

    #[test]
    fn planned_memory_supplied_through_executorchs_allocator_gives_the_modules_own_results() {
        use delegate_abi::host::HostConfig;
        use host_runtime::plugins::{Discovery, Registry};
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("kv.pte");
        let bytes = common::program(&kv_example::Config::tiny(), 2, true, common::BACKEND);
        std::fs::write(&path, &bytes).expect("write");
        let registry = Registry::discover(Discovery::new().use_env(false))
            .with_embedded(reference_delegate::delegate_root(), &HostConfig::default());
        crate::register_backends(&registry, &[common::BACKEND.to_owned()]).expect("register");
        let summary =
            crate::runner::check_program(&path, &bytes, &[common::BACKEND.to_owned()]).expect("check");
        let methods = vec!["prefill".to_owned(), "decode".to_owned()];

        let own = outputs(crate::runner::Module::open(&path).expect("open"), &summary);
        let supplied = crate::runner::Module::open_host_supplied(&path, &methods).expect("open");
        assert_eq!(supplied.planned_memory(), PlannedMemory::Managed);
        // The caches written by prefill are read by decode: the methods share the supplied mem_id 2, as the
        // Module's own arenas are shared; any difference (unshared, unzeroed, misplaced) changes the logits.
        assert_eq!(outputs(supplied, &summary), own, "the same logits and tokens over supplied memory");
    }

    #[test]
    fn a_plan_gives_spans_only_to_the_methods_it_was_sized_for() {
        // Sized for `decode` (T = 1); `prefill` (T = 4) plans more activations than the shared mem_id 1 holds.
        let mut plan = ManagedPlan::in_host_memory(&[("decode".to_owned(), vec![256, 64, 32])]);
        let spans = plan.spans("decode", &[256, 64, 32]).expect("sized for it");
        assert_eq!(spans.iter().map(|&(_, len)| len).collect::<Vec<_>>(), [256, 64, 32]);
        match plan.spans("prefill", &[1024, 64]) {
            Err(SpanError::NotPlannedFor { method, planned_for }) => {
                assert_eq!(
                    (method.as_str(), planned_for.as_slice()),
                    ("prefill", &["decode".to_owned()][..])
                );
            }
            other => panic!("a 1024-byte span over a 256-byte buffer: {other:?}"),
        }
        // A plan sized for no method gives spans to none.
        let mut empty = ManagedPlan::in_host_memory(&[]);
        assert!(matches!(empty.spans("decode", &[8]), Err(SpanError::NotPlannedFor { .. })));
    }

    #[test]
    fn loading_a_method_the_managed_plan_was_not_sized_for_is_refused_naming_both() {
        use et_error::{ErrorCode, HasErrorCode};
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("kv.pte");
        std::fs::write(&path, common::program(&kv_example::Config::tiny(), 2, true, common::BACKEND))
            .expect("write");
        crate::register_backends(&embedded_reference(), &[common::BACKEND.to_owned()]).expect("register");
        // The route `Module::open_with(path, Managed, ["decode"])` takes, over host memory (no GPU needed):
        // prefill's activations (T = 4) are larger than the shared buffer sized for decode (T = 1).
        let mut module =
            crate::runner::Module::open_host_supplied(&path, &["decode".to_owned()]).expect("open");
        let err = module.load_method("prefill").expect_err("not sized for it");
        assert!(
            matches!(&err, crate::BridgeError::MethodNotPlanned { method, planned_for }
                if method == "prefill" && planned_for == &["decode".to_owned()]),
            "{err:?}"
        );
        assert_eq!(err.error_code(), ErrorCode::InvalidArgument);
        assert_eq!(
            err.to_string(),
            "method 'prefill' cannot be loaded: this Module's managed planned memory was sized for [\"decode\"] \
             only; list every method to be loaded in Module::open_with"
        );
        module.load_method("decode").expect("the method it was sized for loads");
    }

    fn embedded_reference() -> host_runtime::plugins::Registry {
        use host_runtime::plugins::{Discovery, Registry};
        Registry::discover(Discovery::new().use_env(false))
            .with_embedded(reference_delegate::delegate_root(), &delegate_abi::host::HostConfig::default())
    }

    #[test]
    fn memory_outside_every_managed_plan_is_host() {
        let local = [0u8; 16];
        assert_eq!(kind_of(local.as_ptr().cast(), 16), MemoryKind::Host);
        assert_eq!(kind_of(usize::MAX as *const _, 16), MemoryKind::Host, "no overflow");
    }
}
