//! One initialised graph on one device: its kernels, uploaded constants and scratch, and the per-call work
//! (bind arguments, queue the launches on the caller's stream, reflect aliased outputs for copy-back hosts).

use alias_validate::residency::DirectAccess;
use cuda_rt::{Allocation, Context, Device, DevicePtr, Pinned, PointerKind, Stream, StreamRef};
use delegate_abi::check::ArgError;
use delegate_abi::{ExecuteArgs, MemoryKind, TensorArg};
use ref_graph::{half, Data, ElemType, Graph, TensorId};

use ref_graph_contract::ArgSpec;

use crate::delegate::Error;
use crate::gemm::{self, attention::PrefillAttention, launch::Runner, Part};
use crate::kernels::general::{General, GeneralLaunch};
use crate::kernels::{self, Kernels, Launch};
use crate::plan::{Float, Home, Plan, Step};

mod general;
mod typed;

/// The kernels' error bits (`ERR_TOKEN`, `ERR_POSITION` in the source).
const ERR_TOKEN: u32 = 1;
const ERR_POSITION: u32 = 2;

/// Device state of one `init`.
#[derive(Debug)]
pub struct Engine {
    ctx: Context,
    /// The typed kernels, one module per float type the plan uses (`plan.floats`, same order).
    typed: Vec<(Float, Kernels)>,
    /// The untyped kernels of the general path.
    general: General,
    plan: Plan,
    /// The stream of calls that bring none; blocking, so it orders after the legacy default stream.
    own_stream: Stream,
    access: DirectAccess,
    _constants: Vec<Allocation<Device>>,
    /// The transposed upload of each `[K, N]` weight the GEMVs read as `[N, K]`, by tensor index (0: none).
    transposed: Vec<DevicePtr>,
    /// Intermediates, and the device homes of host-memory inputs and outputs, by tensor.
    _buffers: Vec<Allocation<Device>>,
    /// Device-side homes of I/O tensors, by tensor index, used when the argument is host memory.
    io_home: Vec<Option<DevicePtr>>,
    _scratch: Vec<Allocation<Device>>,
    attn_part: DevicePtr,
    attn_ml: DevicePtr,
    attn_counters: DevicePtr,
    /// The argmax blocks' best values and indices, and the ticket of the block that picks among them.
    argmax_part: (DevicePtr, DevicePtr, DevicePtr),
    /// Whether typed launches overlap the previous kernel of the call (programmatic dependent launch).
    overlap: bool,
    /// The most blocks a staged GEMV launch takes: a wave on this device (`kernels::gemv_wave`).
    gemv_wave: u32,
    /// The most blocks a staged GEMV launch may have to take the `_deep` entries (`kernels::gemv_deep_wave`).
    gemv_deep_wave: u32,
    /// The most blocks a tensor-core attention launch takes (`kernels::attention_tc_wave`).
    attn_tc_wave: u32,
    /// The most tiles a warp of a clustered attention takes (`kernels::attention_cluster_tiles`).
    attn_cluster_tiles: u32,
    err: Allocation<Device>,
    /// Where the error word is copied after each call queued on a caller's stream; read at the next call.
    err_seen: Allocation<Pinned>,
    /// Every tensor's address for the current call.
    ptrs: Vec<DevicePtr>,
    /// The last address checked with the driver, per argument position (the check runs when it changes).
    checked: Vec<usize>,
    launches: Vec<Queued>,
    /// The products of steps of many rows on cuBLAS (`gemm`), where any step takes that path.
    gemm: Option<Runner>,
    /// The attention of a chunk of many rows (`gemm::attention`), in the modules that have it.
    prefill_attention: PrefillAttention,
}

/// A tuning build writes each module's trace when the engine goes (`kernels::tuning::dump_trace`; nothing
/// otherwise).
impl Drop for Engine {
    fn drop(&mut self) {
        for (float, kernels) in &self.typed {
            kernels::tuning::dump_trace(kernels.module(), &format!("{float:?}").to_lowercase());
        }
    }
}

/// One launch of a call: a typed kernel (the index of its module in `Engine::typed`), an untyped one, or a
/// product on cuBLAS.
#[derive(Debug, Clone, Copy)]
enum Queued {
    Typed(usize, Launch),
    General(GeneralLaunch),
    Gemm(cuda_rt::GemmEx),
    /// The prefill attention of the typed module of that index (`gemm::attention`).
    PrefillAttention(usize, cuda_rt::LaunchConfig, kernels::AttnP),
}

fn alloc(ctx: &Context, bytes: usize, what: &str) -> Result<Allocation<Device>, Error> {
    Allocation::<Device>::zeroed(ctx, bytes.max(4))
        .map_err(|source| Error::Cuda { action: format!("allocating {bytes} bytes for {what}"), source })
}

fn data_bytes(data: &Data) -> &[u8] {
    match data {
        Data::F32(v) => bytemuck::cast_slice(v),
        Data::F16(v) => bytemuck::cast_slice(v),
        Data::Bf16(v) => bytemuck::cast_slice(v),
        Data::I64(v) => bytemuck::cast_slice(v),
    }
}

/// Uploads the constants of `graph`, recording their addresses in `ptrs`: each as it is unless the plan
/// reads it only transposed, and each weight of `plan.transposed` as its `[N, K]` transpose (its address in
/// `transposed`).
fn upload_constants(
    ctx: &Context,
    graph: &Graph,
    plan: &Plan,
    ptrs: &mut [DevicePtr],
    transposed: &mut [DevicePtr],
) -> Result<Vec<Allocation<Device>>, Error> {
    let tensors = graph.tensors();
    let upload = |bytes: &[u8], name: &str| -> Result<Allocation<Device>, Error> {
        let mut a = alloc(ctx, bytes.len(), name)?;
        if !bytes.is_empty() {
            // `alloc` gives at least 4 bytes, so a one-element f16 or bf16 constant (2 bytes) is written with
            // zeros after it.
            let padded;
            let bytes = if bytes.len() < a.len() {
                padded = [bytes, &vec![0; a.len() - bytes.len()]].concat();
                &padded[..]
            } else {
                bytes
            };
            a.write(bytes)
                .map_err(|source| Error::Cuda { action: format!("uploading constant '{name}'"), source })?;
        }
        Ok(a)
    };
    let mut constants = Vec::new();
    for (id, data) in graph.constants() {
        let name = &tensors[id.0].name;
        let plan_entry = plan.transposed.iter().find(|(w, _)| *w == id);
        if plan_entry.is_none_or(|&(_, as_stored)| as_stored) {
            let converted = converted_bytes(data, plan.dtypes[id.0]);
            let a = upload(converted.as_deref().unwrap_or(data_bytes(data)), name)?;
            ptrs[id.0] = a.device_ptr();
            constants.push(a);
        }
        if plan_entry.is_some() {
            let shape = &tensors[id.0].shape;
            let a = upload(&transposed_bytes(data, shape[0] as usize, shape[1] as usize), name)?;
            transposed[id.0] = a.device_ptr();
            constants.push(a);
        }
    }
    Ok(constants)
}

/// The bytes of an f32 constant the plan reads as `dtype` (a half model's norm gain, [`Plan::dtypes`]),
/// converted; `None` when the plan reads it as stored.
fn converted_bytes(data: &Data, dtype: ElemType) -> Option<Vec<u8>> {
    let Data::F32(v) = data else { return None };
    match dtype {
        ElemType::F16 => Some(v.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect()),
        ElemType::Bf16 => Some(v.iter().flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()).collect()),
        ElemType::F32 | ElemType::I64 => None,
    }
}

/// The bytes of a `[rows, cols]` matrix stored `[cols, rows]`.
fn transposed_bytes(data: &Data, rows: usize, cols: usize) -> Vec<u8> {
    fn t<E: Copy + Default + bytemuck::Pod>(v: &[E], rows: usize, cols: usize) -> Vec<u8> {
        let mut out = vec![E::default(); v.len()];
        transpose::transpose(v, &mut out, cols, rows);
        bytemuck::cast_slice(&out).to_vec()
    }
    match data {
        Data::F32(v) => t(v, rows, cols),
        Data::F16(v) => t(v, rows, cols),
        Data::Bf16(v) => t(v, rows, cols),
        Data::I64(v) => t(v, rows, cols),
    }
}

impl Engine {
    /// Compiles the kernels, uploads the constants and allocates every intermediate and scratch buffer.
    pub fn new(ctx: Context, graph: &Graph, mut plan: Plan, io: &[TensorId]) -> Result<Engine, Error> {
        let cuda = |action: &str| {
            let action = action.to_owned();
            move |source| Error::Cuda { action: action.clone(), source }
        };
        // Before the addresses are sized: the GEMM path's scratch tensors follow the graph's.
        let expansion = gemm::Expansion::new(&mut plan);
        let typed = plan
            .floats
            .iter()
            .map(|&float| Kernels::load(&ctx, float).map(|kernels| (float, kernels)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(cuda("compiling the kernels"))?;
        let general = General::load(&ctx).map_err(cuda("compiling the general kernels"))?;
        let prefill_attention =
            PrefillAttention::load(&ctx, &typed).map_err(cuda("loading the prefill attention"))?;
        let own_stream = Stream::new(&ctx).map_err(cuda("creating a stream"))?;
        let tensors = graph.tensors();
        let mut ptrs = vec![0; plan.dtypes.len()];
        let mut transposed = vec![0; tensors.len()];
        let constants = upload_constants(&ctx, graph, &plan, &mut ptrs, &mut transposed)?;
        let mut buffers = Vec::new();
        let mut io_home = vec![None; tensors.len()];
        for (index, home) in plan.homes.iter().enumerate() {
            let decl = &tensors[index];
            match home {
                Home::Scratch => {
                    let a = alloc(&ctx, decl.nbytes(), &decl.name)?;
                    ptrs[index] = a.device_ptr();
                    buffers.push(a);
                }
                Home::Io if io.contains(&TensorId(index)) => {
                    let a = alloc(&ctx, decl.nbytes(), &decl.name)?;
                    io_home[index] = Some(a.device_ptr());
                    buffers.push(a);
                }
                _ => {}
            }
        }
        let mut scratch = Vec::new();
        let mut take = |elems: usize, elem: usize, what: &str| -> Result<DevicePtr, Error> {
            let a = alloc(&ctx, elems * elem, what)?;
            let ptr = a.device_ptr();
            scratch.push(a);
            Ok(ptr)
        };
        let attn_part = take(plan.attn_scratch.partials, 4, "attention partial outputs")?;
        let attn_ml = take(plan.attn_scratch.maxima, 4, "attention maxima")?;
        let attn_counters = take(plan.attn_scratch.counters, 4, "attention merge counters")?;
        let argmaxes = plan.steps.iter().any(|s| matches!(s, Step::Argmax { .. }));
        let blocks = if argmaxes { kernels::ARGMAX_BLOCKS as usize } else { 0 };
        let argmax_part = (
            take(blocks, 4, "argmax block maxima")?,
            take(blocks, 4, "argmax block indices")?,
            take(usize::from(argmaxes), 4, "the argmax ticket")?,
        );
        let gemm =
            Runner::new(&ctx, expansion, &mut ptrs).map_err(cuda("preparing the products on cuBLAS"))?;
        let err = alloc(&ctx, 4, "the error word")?;
        let err_seen = Allocation::<Pinned>::zeroed(&ctx, 4).map_err(cuda("allocating the error mirror"))?;
        let access = DirectAccess::gpu(ctx.is_integrated());
        // One launch a step at most, or its parts on the GEMM path, so a call never grows it.
        let launches = Vec::with_capacity(gemm.as_ref().map_or(plan.steps.len(), Runner::launches));
        let overlap = ctx.overlaps_launches();
        let gemv_wave = kernels::gemv_wave(ctx.multiprocessors());
        let gemv_deep_wave = kernels::gemv_deep_wave(ctx.multiprocessors());
        let attn_tc_wave = kernels::attention_tc_wave(ctx.multiprocessors());
        let attn_cluster_tiles = kernels::attention_cluster_tiles();
        Ok(Engine {
            ctx,
            typed,
            general,
            plan,
            own_stream,
            access,
            _constants: constants,
            transposed,
            _buffers: buffers,
            io_home,
            _scratch: scratch,
            attn_part,
            attn_ml,
            attn_counters,
            argmax_part,
            overlap,
            gemv_wave,
            gemv_deep_wave,
            attn_tc_wave,
            attn_cluster_tiles,
            err,
            err_seen,
            ptrs,
            checked: Vec::new(),
            launches,
            gemm,
            prefill_attention,
        })
    }

    /// The plan it runs.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The device it runs on.
    pub fn device(&self) -> i32 {
        self.ctx.ordinal()
    }

    /// Checks, with the driver, that a device or managed argument really is memory of that kind on this
    /// device, and that an aliased input is memory the GPU can update in place (the residency gate on the
    /// real pointer). Runs only when the argument's address changed since the last call.
    fn check_memory(&mut self, position: usize, spec: &ArgSpec, arg: &TensorArg) -> Result<(), Error> {
        if self.checked.len() <= position {
            self.checked.resize(position + 1, 0);
        }
        let claimed = arg.memory();
        let needs_device = spec.aliased_input || matches!(claimed, MemoryKind::Device | MemoryKind::Managed);
        if !needs_device || self.checked[position] == arg.data as usize {
            return Ok(());
        }
        let info = self.ctx.pointer_info(arg.data).map_err(|source| Error::Cuda {
            action: format!("querying argument {position}'s pointer"),
            source,
        })?;
        let residency = match info.kind {
            PointerKind::Device => MemoryKind::Device,
            PointerKind::Managed => MemoryKind::Managed,
            PointerKind::Host => MemoryKind::Pinned,
            _ => MemoryKind::Host,
        };
        let bad = |problem: String| Error::from(ArgError::arg(position, &spec.name, problem));
        if spec.aliased_input {
            self.access
                .check(&spec.name, residency, arg.nbytes)
                .map_err(|source| Error::Residency { position, source })?;
        }
        if claimed != residency {
            return Err(bad(format!(
                "is passed as {claimed} memory, but the driver says it is {}",
                residency.name()
            )));
        }
        if let Some(device) = info.device.filter(|_| residency != MemoryKind::Pinned) {
            if device != self.ctx.ordinal() {
                return Err(bad(format!(
                    "lives on CUDA device {device}, but this blob runs on device {}",
                    self.ctx.ordinal()
                )));
            }
        }
        self.checked[position] = arg.data as usize;
        Ok(())
    }

    /// Runs the graph for one call: binds `args` (checked against `specs` by the caller), queues every
    /// launch on the caller's stream (or the instance's own, then waits), reflects aliased outputs bound to
    /// separate slots, and copies host-memory outputs back.
    pub fn run(&mut self, specs: &[ArgSpec], args: &mut ExecuteArgs<'_>) -> Result<(), Error> {
        self.take_reported_error()?;
        let caller = args.stream();
        let raw = caller.map_or_else(|| self.own_stream.as_ref().as_raw(), |s| s.as_raw());
        // SAFETY: a caller stream crossed the ABI as `CudaStream`, whose contract makes it a live stream of
        // this device's primary context for the call and the work queued on it; the own stream is created in
        // that context and lives as long as `self`, which outlives this call.
        let stream: StreamRef<'_> = unsafe { StreamRef::from_raw(raw) };
        self.bind(specs, args, stream)?;
        self.queue(stream)?;
        self.write_back(specs, args, stream)?;
        self.report(caller.is_none(), stream)
    }

    /// Every tensor's address for this call: arguments in device memory where they are, host ones staged
    /// into their device homes, aliases their storage's.
    fn bind(
        &mut self,
        specs: &[ArgSpec],
        args: &mut ExecuteArgs<'_>,
        stream: StreamRef<'_>,
    ) -> Result<(), Error> {
        for (position, spec) in specs.iter().enumerate() {
            let arg = *args.arg(position).map_err(Error::Abi)?;
            self.check_memory(position, spec, &arg)?;
            if spec.aliases_arg.is_some() {
                continue; // an aliased output slot: the tensor is its cache; reflected below if separate
            }
            if matches!(arg.memory(), MemoryKind::Device | MemoryKind::Managed) {
                self.ptrs[spec.tensor.0] = arg.data as DevicePtr;
                continue;
            }
            let home = self.io_home[spec.tensor.0].ok_or_else(|| {
                ArgError::arg(
                    position,
                    &spec.name,
                    format!("is {} memory, which this tensor cannot be staged from", arg.memory()),
                )
            })?;
            self.ptrs[spec.tensor.0] = home;
            if spec.role == blob_format::model::Role::Input {
                // SAFETY: `arg.data` is host memory of `nbytes` bytes the caller lends for the call (checked
                // against the binding); `home` is this instance's device buffer of the tensor's size, which
                // equals `nbytes`. A copy from pageable memory returns once the source is consumed.
                unsafe { self.ctx.copy_htod_async(home, arg.data, arg.nbytes, stream) }.map_err(
                    |source| Error::Cuda { action: format!("staging argument {position}"), source },
                )?;
                args.record_staging(arg.nbytes);
            }
        }
        for (index, home) in self.plan.homes.iter().enumerate() {
            if let Home::SameAs(cache) = home {
                self.ptrs[index] = self.ptrs[cache.0];
            }
        }
        Ok(())
    }

    /// Queues the plan's launches, with this call's addresses, on `stream`.
    fn queue(&mut self, stream: StreamRef<'_>) -> Result<(), Error> {
        let mut launches = std::mem::take(&mut self.launches);
        launches.clear();
        for (index, step) in self.plan.steps.iter().enumerate() {
            match self.gemm.as_ref().and_then(|g| g.parts(index)) {
                Some(parts) => self.lower_parts(parts, &mut launches),
                None => {
                    let first = launches.len();
                    self.lower(step, &mut launches);
                    self.prefill_attention_in(&mut launches[first..]);
                }
            }
        }
        let launched = launches.iter().enumerate().try_for_each(|(index, queued)| {
            let overlapped = self.overlap && index > 0;
            // SAFETY: every address in the launch is an argument checked against its binding (size, dtype,
            // shape, memory kind and device, with the driver) or this instance's own allocation, sized by the
            // plan from the graph's static shapes; the caller keeps arguments untouched until the stream has
            // run the call (the ABI's rule), and the instance's memory lives as long as the instance, which
            // the host drops only after its streams drained. Only launches after the call's first overlap,
            // and only on a device that has it (`overlaps_launches`); every kernel waits with `pdl_wait`. A
            // product on cuBLAS is launched without overlap, its matrices the plan's tensors or the runner's
            // scratch, each sized for the rows and columns it describes (`gemm::Expansion`); the prefill
            // attention takes the very parameters of the tensor-core attention it replaces
            // (`gemm::attention`) and waits with `pdl_wait` too.
            unsafe {
                match queued {
                    Queued::Typed(module, launch) => self.typed[*module].1.launch(launch, stream, overlapped),
                    Queued::General(launch) => self.general.launch(launch, stream, overlapped),
                    Queued::PrefillAttention(module, config, p) => self
                        .prefill_attention
                        .entry(*module, p)
                        .and_then(|f| kernels::go(f, *config, stream, p, overlapped)),
                    Queued::Gemm(gemm) => match self.gemm.as_mut() {
                        Some(runner) => runner.blas().gemm_ex(stream, gemm),
                        None => unreachable!("only a runner's parts queue products"),
                    },
                }
            }
            .map_err(|source| Error::Cuda { action: "launching a kernel".into(), source })
        });
        self.launches = launches;
        launched
    }

    /// An attention of many rows among `launches` (one step's) as the prefill attention.
    fn prefill_attention_in(&self, launches: &mut [Queued]) {
        for queued in launches {
            if let Queued::Typed(module, launch) = *queued {
                if let Some((config, p)) = self.prefill_attention.replacing(module, &launch) {
                    *queued = Queued::PrefillAttention(module, config, p);
                }
            }
        }
    }

    /// The launches of a step on the GEMM path: its parts lowered as steps, its products as cuBLAS calls.
    fn lower_parts(&self, parts: &[Part], into: &mut Vec<Queued>) {
        for part in parts {
            match part {
                Part::Step(step) => self.lower(step, into),
                Part::Product(product) => {
                    let w = if product.transposed {
                        self.transposed[product.w.0]
                    } else {
                        self.ptrs[product.w.0]
                    };
                    let (a, y) = (self.ptrs[product.a.0], self.ptrs[product.y.0]);
                    into.push(Queued::Gemm(gemm::launch::call(product, a, w, y)));
                }
            }
        }
    }

    /// Reflects aliased outputs bound to separate slots and copies host-memory outputs back.
    fn write_back(
        &self,
        specs: &[ArgSpec],
        args: &mut ExecuteArgs<'_>,
        stream: StreamRef<'_>,
    ) -> Result<(), Error> {
        for (position, spec) in specs.iter().enumerate() {
            let arg = *args.arg(position).map_err(Error::Abi)?;
            if let Some(input) = spec.aliases_arg {
                let cache = *args.arg(input).map_err(Error::Abi)?;
                if arg.same_storage(&cache) {
                    continue;
                }
                self.copy_out(position, cache.data as DevicePtr, &arg, stream)?;
                args.record_reflect(arg.nbytes);
            } else if spec.role == blob_format::model::Role::Output && !is_device(&arg) {
                self.copy_out(position, self.ptrs[spec.tensor.0], &arg, stream)?;
            }
        }
        Ok(())
    }

    /// The kernels' error word: on the instance's own stream, waited for and reported now; on a caller's,
    /// copied to the pinned mirror the next call reads (no wait).
    fn report(&mut self, own_stream: bool, stream: StreamRef<'_>) -> Result<(), Error> {
        if !own_stream {
            // SAFETY: both are this instance's 4-byte allocations; the pinned mirror is only read by
            // `take_reported_error` with a volatile read of a whole word.
            return unsafe {
                self.ctx.copy_dtoh_async(self.err_seen.as_ptr(), self.err.device_ptr(), 4, stream)
            }
            .map_err(|source| Error::Cuda { action: "queueing the error word".into(), source });
        }
        self.own_stream
            .synchronize()
            .map_err(|source| Error::Cuda { action: "waiting for the call".into(), source })?;
        let word = self
            .err
            .read()
            .map_err(|source| Error::Cuda { action: "reading the error word".into(), source })?;
        let bits = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
        if bits != 0 {
            self.err
                .clear()
                .map_err(|source| Error::Cuda { action: "clearing the error word".into(), source })?;
            return Err(Error::Kernel { bits: describe(bits), earlier: false });
        }
        Ok(())
    }

    /// An error a kernel of an earlier call (queued on a caller's stream) recorded, reported now.
    fn take_reported_error(&mut self) -> Result<(), Error> {
        // SAFETY: the mirror is a live 4-byte, 4-aligned pinned allocation; the device may be copying into
        // it, so it is read with one volatile word load (never through a reference).
        let bits = unsafe { std::ptr::read_volatile(self.err_seen.as_ptr().cast::<u32>()) };
        if bits == 0 {
            return Ok(());
        }
        self.own_stream.synchronize().ok();
        self.ctx
            .synchronize()
            .map_err(|source| Error::Cuda { action: "waiting for earlier calls".into(), source })?;
        self.err
            .clear()
            .map_err(|source| Error::Cuda { action: "clearing the error word".into(), source })?;
        self.err_seen.bytes_mut().fill(0);
        Err(Error::Kernel { bits: describe(bits), earlier: true })
    }

    fn copy_out(
        &self,
        position: usize,
        src: DevicePtr,
        dst: &TensorArg,
        stream: StreamRef<'_>,
    ) -> Result<(), Error> {
        let failed = |source| Error::Cuda { action: format!("copying into argument {position}"), source };
        if is_device(dst) {
            // SAFETY: `src` is a checked device argument or this instance's buffer, `dst` a checked device
            // argument of the same size (the binding's), distinct storage (`same_storage` was false and the
            // host checked overlaps at load); both live until the stream has run the copy.
            unsafe { self.ctx.copy_dtod_async(dst.data as DevicePtr, src, dst.nbytes, stream) }
                .map_err(failed)
        } else {
            // SAFETY: as above, with `dst` host memory of `nbytes` the caller lends for the call.
            unsafe { self.ctx.copy_dtoh_async(dst.data, src, dst.nbytes, stream) }.map_err(failed)
        }
    }
}

fn is_device(arg: &TensorArg) -> bool {
    matches!(arg.memory(), MemoryKind::Device | MemoryKind::Managed)
}

fn describe(bits: u32) -> String {
    let mut what = Vec::new();
    if bits & ERR_TOKEN != 0 {
        what.push("a token id outside the embedding table");
    }
    if bits & ERR_POSITION != 0 {
        what.push("a position outside the cache");
    }
    if what.is_empty() {
        what.push("an unknown kernel error");
    }
    what.join(" and ")
}
