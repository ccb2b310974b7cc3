//! Running a `.pte` on ExecuTorch's `Module` API with our plugins registered: the pre-flight check
//! ([`check_program`]), a safe [`Module`], and the run protocol ([`run`]: the prompt fed as host-runtime's
//! [`generate::protocol`] plans it, then greedy decode steps; [`run_choosing`]: each token picked by the
//! caller, who may end the run early).

use std::ffi::CString;
use std::path::Path;

use delegate_abi::DTypeCode;
use et_error::ErrorCode;
use host_runtime::plugins::Registry;
use pte_format::Program;

use crate::backend::{self, scalar_type_of, CopyStats};
use crate::ffi::{KvdTensor, LoadFailure, RawModule, KVD_MAX_RANK};
use crate::planned::{ActiveStream, ManagedPlan, PlannedMemory, SpanError, SyncStats};
use crate::program_file::ProgramFile;
use crate::{BridgeError, InputProblem};
use host_runtime::generate;
use host_runtime::generate::protocol::{Call, Methods};

/// What the pre-flight check learned about a program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgramSummary {
    /// Method names, in the program's order.
    pub methods: Vec<String>,
    /// Per method, the byte size of each output (from the program's tensor metadata).
    pub output_bytes: Vec<(String, Vec<u64>)>,
    /// Backend ids the DelegateCalls name, sorted, deduplicated.
    pub backends: Vec<String>,
    /// The methods whose token input is batched, `[1, T]` (Hugging Face's `input_ids`) rather than `[T]`.
    pub batched_tokens: Vec<String>,
}

/// Parses `bytes` with `pte-format` and checks that every DelegateCall's backend id is in `served` and that
/// every argument a delegate writes is planned memory ([`crate::written`]).
///
/// # Errors
/// [`BridgeError::Program`] for a file that is not a readable program (truncated, corrupted);
/// [`BridgeError::UnservedBackend`] naming the first backend id nobody serves;
/// [`BridgeError::UnplannedWrite`] naming the first DelegateCall argument a delegate writes that is not planned
/// memory (a constant of the program).
pub fn check_program(path: &Path, bytes: &[u8], served: &[String]) -> Result<ProgramSummary, BridgeError> {
    let program = parse(path, bytes)?;
    if let Some(refusal) = crate::written::unplanned_write(&program) {
        return Err(refusal);
    }
    let mut backends = Vec::new();
    let mut output_bytes = Vec::new();
    let mut batched_tokens = Vec::new();
    for method in &program.methods {
        for (_, call) in method.delegate_calls() {
            let id = method.delegates.get(call.delegate).map(|d| d.id).unwrap_or_default();
            if !served.iter().any(|s| s == id) {
                return Err(BridgeError::UnservedBackend {
                    method: method.name.to_owned(),
                    backend: id.to_owned(),
                    served: if served.is_empty() { "none".to_owned() } else { served.join(", ") },
                });
            }
            backends.push(id.to_owned());
        }
        let sizes =
            method.outputs.iter().map(|&v| method.tensor(v).and_then(|t| t.nbytes()).unwrap_or(0)).collect();
        output_bytes.push((method.name.to_owned(), sizes));
        let first_input = method.inputs.first().and_then(|&v| method.tensor(v));
        if first_input.is_some_and(|t| t.sizes.len() == 2 && t.sizes[0] == 1) {
            batched_tokens.push(method.name.to_owned());
        }
    }
    backends.sort();
    backends.dedup();
    Ok(ProgramSummary {
        methods: program.methods.iter().map(|m| m.name.to_owned()).collect(),
        output_bytes,
        backends,
        batched_tokens,
    })
}

/// Strict zero-copy's check of the program in `bytes` ([`crate::strict`]), with the plugins `registry`
/// serves (a backend no plugin serves was refused before).
fn refuse_copies(path: &Path, bytes: &[u8], registry: &Registry) -> Result<(), BridgeError> {
    let program = parse(path, bytes)?;
    let binds = |backend: &str| registry.served(backend).is_some_and(|p| p.info().binds_aliases_in_place);
    crate::strict::zero_copy_refusal(&program, binds).map_or(Ok(()), Err)
}

/// `bytes` read by `pte-format`, a failure naming `path`.
fn parse<'a>(path: &Path, bytes: &'a [u8]) -> Result<Program<'a>, BridgeError> {
    Program::parse(bytes).map_err(|source| BridgeError::Program { path: path.display().to_string(), source })
}

/// A method input: caller memory, read (copied into the method's planned input) during the call only.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    /// The bytes.
    pub data: &'a [u8],
    /// Element type.
    pub dtype: DTypeCode,
    /// Shape.
    pub shape: &'a [i64],
}

/// An output as [`Module::execute`] returns it: the bytes were copied into the caller's buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputMeta {
    /// Bytes written.
    pub nbytes: usize,
    /// ExecuTorch's scalar type code.
    pub scalar_type: i32,
    /// Shape.
    pub shape: Vec<i64>,
}

/// An ExecuTorch `Module` over one `.pte`, arenas shared across its methods (`share_memory_arenas = true`),
/// loaded from the program's bytes read once ([`ProgramFile`]; ExecuTorch never opens the file, and delegate
/// payloads are lent from those bytes, uncopied); its planned memory in host memory (the Module's own buffers)
/// or in CUDA managed memory ([`Module::open_with`], [`crate::planned`]). Every Module checks, before
/// ExecuTorch loads the program, that each argument a delegate writes is planned memory ([`crate::written`]).
pub struct Module {
    raw: RawModule,
}

impl std::fmt::Debug for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Module").field("path", &self.path()).finish()
    }
}

fn runtime(what: String, code: ErrorCode) -> BridgeError {
    BridgeError::Runtime { what, code, detail: backend::take_last_error() }
}

impl Module {
    /// Reads ([`ProgramFile::read`]) and loads the program (not its methods).
    ///
    /// # Errors
    /// As [`Module::from_program`], and [`BridgeError::Io`] when the file cannot be read.
    pub fn open(path: &Path) -> Result<Module, BridgeError> {
        Module::open_with(path, PlannedMemory::Host, &[])
    }

    /// Reads ([`ProgramFile::read`]) and loads the program with its planned memory in `memory`, as
    /// [`Module::from_program`].
    ///
    /// # Errors
    /// As [`Module::from_program`], and [`BridgeError::Io`] when the file cannot be read.
    pub fn open_with(path: &Path, memory: PlannedMemory, methods: &[String]) -> Result<Module, BridgeError> {
        Module::from_program(ProgramFile::read(path)?, memory, methods)
    }

    /// Loads the program in `program` (those bytes: ExecuTorch opens no file) with its planned memory in
    /// `memory`. For [`PlannedMemory::Managed`], `methods` are the methods whose planned buffers mem_id 1 and 2
    /// are shared (sized to the largest of them, as ExecuTorch's `share_memory_arenas` sizes its own): every
    /// method that will be loaded; [`Module::load_method`] refuses any other.
    ///
    /// # Errors
    /// [`BridgeError::Program`] or [`BridgeError::UnplannedWrite`] for a program that `pte-format` cannot read
    /// or whose DelegateCall writes a tensor that is not planned memory (checked before ExecuTorch loads it);
    /// [`BridgeError::Runtime`] with ExecuTorch's code when it cannot load the program;
    /// [`BridgeError::ManagedMemory`] when managed memory cannot be had (no CUDA driver or GPU, or the
    /// allocation failed).
    pub fn from_program(
        program: ProgramFile,
        memory: PlannedMemory,
        methods: &[String],
    ) -> Result<Module, BridgeError> {
        let mut module = Module::load_host(program)?;
        if memory == PlannedMemory::Managed {
            let sizes = module.planned_sizes(methods)?;
            let plan = ManagedPlan::new(&sizes).map_err(|source| BridgeError::ManagedMemory { source })?;
            module.raw.use_managed(plan);
        }
        Ok(module)
    }

    /// Opens the program with its planned memory supplied as for managed memory, but in host memory: the
    /// allocator route of [`Module::open_with`], tested without a GPU.
    #[cfg(test)]
    pub(crate) fn open_host_supplied(path: &Path, methods: &[String]) -> Result<Module, BridgeError> {
        let mut module = Module::load_host(ProgramFile::read(path)?)?;
        let sizes = module.planned_sizes(methods)?;
        module.raw.use_managed(ManagedPlan::in_host_memory(&sizes));
        Ok(module)
    }

    /// Per method, its name and the sizes of its planned buffers (mem_id 1 first).
    fn planned_sizes(&mut self, methods: &[String]) -> Result<Vec<(String, Vec<u64>)>, BridgeError> {
        let mut sizes = Vec::with_capacity(methods.len());
        for method in methods {
            let name = cname(method)?;
            let planned = self.raw.planned_sizes(&name);
            let planned = planned.map_err(|code| {
                runtime(format!("{}: reading method '{method}''s planned buffers", self.path()), code)
            })?;
            sizes.push((method.clone(), planned));
        }
        Ok(sizes)
    }

    /// The path the program was read from, as messages show it.
    pub fn path(&self) -> &str {
        self.raw.program().path()
    }

    /// Where this Module's planned memory lives.
    pub fn planned_memory(&self) -> PlannedMemory {
        if self.raw.managed().is_some() {
            PlannedMemory::Managed
        } else {
            PlannedMemory::Host
        }
    }

    /// Checks what the program's delegates write ([`crate::written`]), then has ExecuTorch load it from
    /// `program`'s bytes, its planned memory the Module's own.
    fn load_host(program: ProgramFile) -> Result<Module, BridgeError> {
        let path = program.path().to_owned();
        if let Some(refusal) = crate::written::unplanned_write(&parse(Path::new(&path), program.bytes())?) {
            return Err(refusal);
        }
        let mut raw = RawModule::new(program, true)
            .map_err(|code| runtime(format!("{path}: creating the Module"), code))?;
        raw.load().map_err(|code| runtime(format!("{path}: ExecuTorch cannot load the program"), code))?;
        let (wrapped, write_backs) = crate::counted_copy_kernels();
        tracing::debug!(target: "executorch_bridge", wrapped, write_backs, path = %path, "copy kernels counted");
        Ok(Module { raw })
    }

    /// Loads `method`: ExecuTorch plans its memory and runs every delegate's `init`.
    ///
    /// # Errors
    /// [`BridgeError::Runtime`] with ExecuTorch's code (a plugin's `init` error keeps its code);
    /// [`BridgeError::MethodNotPlanned`] for a method a managed Module's planned memory was not sized for
    /// ([`Module::from_program`]'s `methods`), refused before ExecuTorch sees it.
    pub fn load_method(&mut self, method: &str) -> Result<(), BridgeError> {
        let name = cname(method)?;
        backend::take_last_error();
        let loaded = if self.raw.managed().is_none() {
            self.raw.load_method(&name).map_err(LoadFailure::Code)
        } else {
            self.raw.load_method_managed(&name)
        };
        loaded.map_err(|failure| match failure {
            LoadFailure::Plan(SpanError::NotPlannedFor { method, planned_for }) => {
                BridgeError::MethodNotPlanned { method, planned_for }
            }
            LoadFailure::Plan(SpanError::Memory(source)) => BridgeError::ManagedMemory { source },
            LoadFailure::Code(code) => runtime(format!("{}: loading method '{method}'", self.path()), code),
        })
    }

    /// Runs `method` on `inputs`; copies its outputs into `outputs` (one buffer per output, each large
    /// enough) and describes them. Returns the method's output count.
    ///
    /// # Errors
    /// [`BridgeError::Input`] for an input whose slice is not exactly its shape x dtype bytes, or whose shape
    /// ExecuTorch cannot carry (nothing runs); [`BridgeError::Runtime`] with ExecuTorch's code (a plugin's
    /// `execute` error keeps its code).
    pub fn execute(
        &mut self,
        method: &str,
        inputs: &[Input<'_>],
        outputs: &mut [&mut [u8]],
    ) -> Result<Vec<OutputMeta>, BridgeError> {
        let name = cname(method)?;
        let raw_inputs = inputs
            .iter()
            .enumerate()
            .map(|(index, input)| raw_input(index, input))
            .collect::<Result<Vec<_>, _>>()?;
        let mut raw_outputs: Vec<KvdTensor> = outputs
            .iter_mut()
            .map(|buf| KvdTensor {
                data: buf.as_mut_ptr().cast(),
                capacity: buf.len() as u64,
                nbytes: 0,
                shape: [0; KVD_MAX_RANK],
                rank: 0,
                scalar_type: 0,
            })
            .collect();
        backend::take_last_error();
        // A managed Module's delegates run on its stream (see `crate::planned`).
        let _stream = self.raw.managed().and_then(ManagedPlan::stream).cloned().map(ActiveStream::enter);
        let count = self
            .raw
            .execute(&name, &raw_inputs, &mut raw_outputs)
            .map_err(|code| runtime(format!("{}: executing method '{method}'", self.path()), code))?;
        Ok(raw_outputs
            .iter()
            .take(count)
            .map(|o| OutputMeta {
                nbytes: o.nbytes as usize,
                scalar_type: o.scalar_type,
                shape: o.shape[..(o.rank as usize).min(KVD_MAX_RANK)].to_vec(),
            })
            .collect())
    }
}

/// The largest dimension ExecuTorch's tensors carry (`SizesType` is `int32_t`).
const MAX_SIZE: i64 = i32::MAX as i64;

/// Checks method input `index` and describes it for the shim: at most [`KVD_MAX_RANK`] dimensions, each one
/// fitting ExecuTorch's 32-bit sizes, and a slice of exactly shape x dtype bytes (the shim builds the tensor
/// from the shape and reads that many bytes).
fn raw_input(index: usize, input: &Input<'_>) -> Result<KvdTensor, BridgeError> {
    let refuse =
        |problem| BridgeError::Input { index, dtype: input.dtype, shape: input.shape.to_vec(), problem };
    let rank = input.shape.len();
    if rank > KVD_MAX_RANK {
        return Err(refuse(InputProblem::Rank { rank, max: KVD_MAX_RANK }));
    }
    let mut expected = Some(input.dtype.size_bytes() as u64);
    for (dim, &size) in input.shape.iter().enumerate() {
        if !(0..=MAX_SIZE).contains(&size) {
            return Err(refuse(InputProblem::Size { dim, size, max: MAX_SIZE }));
        }
        expected = expected.and_then(|bytes| bytes.checked_mul(size as u64));
    }
    let actual = input.data.len() as u64;
    if expected != Some(actual) {
        return Err(refuse(InputProblem::Length { expected, actual }));
    }
    let mut shape = [0i64; KVD_MAX_RANK];
    shape[..rank].copy_from_slice(input.shape);
    Ok(KvdTensor {
        data: input.data.as_ptr().cast_mut().cast(),
        capacity: actual,
        nbytes: actual,
        shape,
        rank: rank as u32,
        scalar_type: scalar_type_of(input.dtype),
    })
}

fn cname(method: &str) -> Result<CString, BridgeError> {
    CString::new(method)
        .map_err(|_| BridgeError::Protocol(format!("method name {method:?} contains a NUL byte")))
}

/// The run protocol: prefill `prompt`, then `steps` greedy decode steps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Protocol {
    /// The prompt's tokens.
    pub prompt: Vec<i64>,
    /// Decode steps after prefill.
    pub steps: usize,
    /// Strict zero-copy: refuse, before ExecuTorch loads the program, one whose calls would copy cache bytes
    /// on every step ([`crate::strict`]).
    pub require_zero_copy: bool,
}

impl Default for Protocol {
    /// The example's: prompt `[1, 7, 3, 12]`, 12 steps.
    fn default() -> Protocol {
        Protocol { prompt: vec![1, 7, 3, 12], steps: 12, require_zero_copy: false }
    }
}

/// What a run produced and observed.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Report {
    /// The program's methods.
    pub methods: Vec<String>,
    /// Per backend id the program calls, the plugin library that served it (`(embedded)` for a linked one).
    pub served_by: Vec<(String, String)>,
    /// `t0` (after prefill) and one token per decode step.
    pub tokens: Vec<i64>,
    /// The last logits row after prefill and after each decode step.
    pub logits: Vec<Vec<f32>>,
    /// Copies counted during prefill.
    pub prefill: CopyStats,
    /// Copies counted during each decode step.
    pub decode: Vec<CopyStats>,
    /// Where ExecuTorch's planned memory (activations and the mutable buffers holding the caches) was.
    pub planned_memory: PlannedMemory,
    /// Host synchronisations with the GPU during each decode step, the delegates' and the bridge's apart.
    pub decode_syncs: Vec<SyncStats>,
}

impl Report {
    /// A report of no step yet, for the program `summary` describes.
    fn new(
        summary: &ProgramSummary,
        served_by: Vec<(String, String)>,
        planned_memory: PlannedMemory,
    ) -> Report {
        Report {
            methods: summary.methods.clone(),
            served_by,
            tokens: vec![],
            logits: vec![],
            prefill: CopyStats::default(),
            decode: vec![],
            planned_memory,
            decode_syncs: vec![],
        }
    }

    /// Records one step's last logits row and the token picked from it.
    fn record(&mut self, row: Vec<f32>, token: i64) {
        self.tokens.push(token);
        self.logits.push(row);
    }
}

/// The greedy token of a logits row: [`ref_graph::argmax`] (first of equals, NaN never wins: the rule of
/// every delegate's `next_token` and of host-runtime's generation).
fn greedy(row: &[f32], _step: usize) -> i64 {
    ref_graph::argmax(row) as i64
}

/// What [`prepare`] read, checked and learned: the program's bytes (what ExecuTorch will load), its summary,
/// and (backend, plugin location) per backend it calls.
type Prepared = (ProgramFile, ProgramSummary, Vec<(String, String)>);

/// Reads the program at `path` once and checks those bytes (strict zero-copy's refusals included), registers
/// the backends it calls, and says which plugin serves each.
fn prepare(path: &Path, registry: &Registry, protocol: &Protocol) -> Result<Prepared, BridgeError> {
    let file = ProgramFile::read(path)?;
    let bytes = file.bytes();
    let served = registry.backends();
    let summary = check_program(path, bytes, &served).map_err(|err| match err {
        // Offered, but by plugins that cannot serve it: their reasons say more than "unserved".
        BridgeError::UnservedBackend { backend, .. }
            if registry.unavailable_for(&backend).next().is_some() =>
        {
            backend::unavailable(registry, &backend)
        }
        other => other,
    })?;
    if protocol.require_zero_copy {
        refuse_copies(path, bytes, registry)?;
    }
    // Only what the program calls: a plugin listed from its manifest is loaded when a program needs it.
    // A plugin that must run isolated is refused here, naming this program in the fix.
    crate::register_backends(registry, &summary.backends).map_err(|err| match err {
        BridgeError::Isolated { backend, plugin, library, program: None } => {
            BridgeError::Isolated { backend, plugin, library, program: Some(path.display().to_string()) }
        }
        other => other,
    })?;
    let mut served_by = Vec::with_capacity(summary.backends.len());
    for id in &summary.backends {
        let plugin = backend::in_process(registry, id)?;
        let at = plugin.path().map_or_else(|| "(embedded)".to_owned(), |p| p.display().to_string());
        served_by.push((id.clone(), at));
    }
    Ok((file, summary, served_by))
}

/// The run protocol's methods: `prefill` and `decode`, or `forward` for both.
fn generation_methods(
    path: &Path,
    summary: &ProgramSummary,
) -> Result<(&'static str, &'static str), BridgeError> {
    let has = |m: &str| summary.methods.iter().any(|n| n == m);
    if has("prefill") && has("decode") {
        Ok(("prefill", "decode"))
    } else if has("forward") {
        Ok(("forward", "forward"))
    } else {
        Err(BridgeError::Protocol(format!(
            "{}: the program has methods {:?}; the run protocol needs 'forward', or 'prefill' and 'decode'",
            path.display(),
            summary.methods
        )))
    }
}

/// Runs the protocol on the program at `path` with `registry`'s plugins (the backends it calls are registered
/// here, see [`crate::register_backends`]). The prompt is fed as host-runtime feeds it
/// ([`generate::protocol`]): in chunks of the prefill method's token count through `prefill`, the tokens short
/// of a chunk one a call through `decode` (a one-method program: `forward` for both), so a two-method program
/// takes a prompt of any length; then `decode` one token a step.
///
/// # Errors
/// Everything [`check_program`], [`Module`] and [`crate::register`] return; [`BridgeError::Protocol`] when
/// the program has neither `forward` nor `prefill` + `decode`, its first output is not f32, f16 or bf16
/// logits, or a one-method program of several tokens a call is given a prompt that is not a multiple of them.
pub fn run(path: &Path, registry: &Registry, protocol: &Protocol) -> Result<Report, BridgeError> {
    run_with_memory(path, registry, protocol, None)
}

/// The planned memory for the program `summary` describes: `requested` when given, else
/// [`crate::planned::choose`] over the plugins serving its backends (managed for a GPU delegate).
fn planned_memory_for(
    summary: &ProgramSummary,
    registry: &Registry,
    requested: Option<PlannedMemory>,
) -> Result<PlannedMemory, BridgeError> {
    if let Some(memory) = requested {
        return Ok(memory);
    }
    let plugins =
        summary.backends.iter().map(|id| backend::in_process(registry, id)).collect::<Result<Vec<_>, _>>()?;
    let infos: Vec<&delegate_abi::PluginInfo> = plugins.iter().map(|p| p.info()).collect();
    Ok(crate::planned::choose(&infos))
}

/// [`run`] with the planned memory in `memory` (`None`: chosen per program, [`crate::planned::choose`]).
///
/// # Errors
/// As [`run`]; [`BridgeError::ManagedMemory`] when managed memory is wanted and cannot be had (no CUDA
/// driver or GPU).
pub fn run_with_memory(
    path: &Path,
    registry: &Registry,
    protocol: &Protocol,
    memory: Option<PlannedMemory>,
) -> Result<Report, BridgeError> {
    run_choosing(path, registry, protocol, memory, greedy, |_| true)
}

/// [`run_with_memory`] where `choose` picks each token from the last row of its step's logits (widened to
/// f32) and the step's index (0 for the token after the prompt), in place of the argmax (`et-run
/// --temperature`), and `go_on` sees each token as it is picked and ends the run by returning `false` (the
/// token is then recorded but not fed: an end-of-sequence id, a stop string, a token budget). At most
/// `protocol.steps` decode steps run.
///
/// # Errors
/// As [`run_with_memory`].
pub fn run_choosing(
    path: &Path,
    registry: &Registry,
    protocol: &Protocol,
    memory: Option<PlannedMemory>,
    mut choose: impl FnMut(&[f32], usize) -> i64,
    mut go_on: impl FnMut(i64) -> bool,
) -> Result<Report, BridgeError> {
    if protocol.prompt.is_empty() {
        return Err(BridgeError::Protocol("the prompt is empty".to_owned()));
    }
    let (file, summary, served_by) = prepare(path, registry, protocol)?;
    let (prefill, decode) = generation_methods(path, &summary)?;
    let prompt = prompt_calls(path, file.bytes(), (prefill, decode), &protocol.prompt)?;
    let memory = planned_memory_for(&summary, registry, memory)?;
    let methods: Vec<String> = [prefill, decode].iter().map(|m| (*m).to_owned()).collect();
    // The bytes just checked: ExecuTorch never reads the path again.
    let mut session = Session::new(Module::from_program(file, memory, &methods)?, &summary);
    for method in [prefill, decode] {
        session.module.load_method(method)?;
    }
    let mut report = Report::new(&summary, served_by, session.module.planned_memory());
    let (row, stats) = session.feed(&prompt)?;
    let mut token = choose(&row, 0);
    report.record(row, token);
    report.prefill = stats;
    if !go_on(token) {
        return Ok(report);
    }
    for i in 0..protocol.steps {
        let position = (protocol.prompt.len() + i) as i64;
        let (row, stats) = session.call(&Call { method: decode, tokens: &[token], position })?;
        token = choose(&row, i + 1);
        report.record(row, token);
        report.decode.push(stats);
        // What `execute` synchronised (the call reset the counts before it).
        report.decode_syncs.push(crate::planned::take_syncs());
        if !go_on(token) {
            break;
        }
    }
    Ok(report)
}

/// The calls that feed `prompt` through `(prefill, decode)` of the program in `bytes`
/// ([`generate::protocol::plan`]), each method's token count read from its first input.
fn prompt_calls<'p>(
    path: &Path,
    bytes: &[u8],
    (prefill, decode): (&'p str, &'p str),
    prompt: &'p [i64],
) -> Result<Vec<Call<'p>>, BridgeError> {
    let program = parse(path, bytes)?;
    let rows = |name: &str| {
        let method = program.methods.iter().find(|m| m.name == name)?;
        let tokens = method.inputs.first().and_then(|&v| method.tensor(v))?;
        usize::try_from(tokens.numel()?).ok()
    };
    let methods = Methods {
        prefill,
        prefill_rows: rows(prefill).unwrap_or(prompt.len()),
        decode,
        decode_rows: rows(decode).unwrap_or(1),
    };
    generate::protocol::plan(methods, prompt, 0)
        .map_err(|err| BridgeError::Protocol(format!("{}: {err}", path.display())))
}

/// A loaded [`Module`] and a buffer for each output of each method: the protocol's calls, one at a time.
struct Session<'s> {
    module: Module,
    summary: &'s ProgramSummary,
    outputs: Vec<(String, Vec<Vec<u8>>)>,
}

impl<'s> Session<'s> {
    fn new(module: Module, summary: &'s ProgramSummary) -> Session<'s> {
        let outputs = summary
            .output_bytes
            .iter()
            .map(|(m, sizes)| (m.clone(), sizes.iter().map(|&n| vec![0u8; n as usize]).collect()))
            .collect();
        Session { module, summary, outputs }
    }

    /// Runs `calls` in order: the last one's logits row, and the copies of them all.
    fn feed(&mut self, calls: &[Call<'_>]) -> Result<(Vec<f32>, CopyStats), BridgeError> {
        let mut last = (vec![], CopyStats::default());
        for call in calls {
            let (row, stats) = self.call(call)?;
            last.0 = row;
            last.1.add(stats);
        }
        Ok(last)
    }

    /// Runs one call (its tokens `[T]`, or `[1, T]` for a batched method, and its position): the last row of
    /// its logits and the copies it made (the copy and sync counts reset before it).
    fn call(&mut self, call: &Call<'_>) -> Result<(Vec<f32>, CopyStats), BridgeError> {
        let Call { method, tokens, position } = *call;
        let token_bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        let pos_bytes = position.to_le_bytes();
        let batched = self.summary.batched_tokens.iter().any(|m| m == method);
        let batched_shape = [1, tokens.len() as i64];
        let token_shape = if batched { &batched_shape[..] } else { &batched_shape[1..] };
        let inputs = [
            Input { data: &token_bytes, dtype: DTypeCode::I64, shape: token_shape },
            Input { data: &pos_bytes, dtype: DTypeCode::I64, shape: &[1] },
        ];
        let outs = &mut self
            .outputs
            .iter_mut()
            .find(|(m, _)| m == method)
            .ok_or_else(|| BridgeError::Protocol(format!("no method '{method}'")))?
            .1;
        let mut views: Vec<&mut [u8]> = outs.iter_mut().map(Vec::as_mut_slice).collect();
        backend::take_stats();
        crate::planned::take_syncs();
        let metas = self.module.execute(method, &inputs, &mut views)?;
        let stats = backend::take_stats();
        let (meta, data) = metas.first().zip(outs.first()).ok_or_else(|| {
            BridgeError::Protocol(format!("method '{method}' returns no output; the protocol reads logits"))
        })?;
        Ok((last_logits_row(method, meta, &data[..meta.nbytes])?, stats))
    }
}

/// The last row of the logits `method` returned first (`meta`, its `bytes`) as f32: the protocol reads f32,
/// f16 or bf16 logits `[.., vocab]`.
fn last_logits_row(method: &str, meta: &OutputMeta, bytes: &[u8]) -> Result<Vec<f32>, BridgeError> {
    let vocab = usize::try_from(*meta.shape.last().unwrap_or(&0)).unwrap_or(0);
    let last = match meta.scalar_type {
        t if t == scalar_type_of(DTypeCode::F32) => generate::last_row(bytes, vocab),
        t if t == scalar_type_of(DTypeCode::F16) => generate::last_row_f16(bytes, vocab),
        t if t == scalar_type_of(DTypeCode::BF16) => generate::last_row_bf16(bytes, vocab),
        _ => {
            return Err(BridgeError::Protocol(format!(
                "method '{method}' returns scalar type {} {:?} first; the protocol reads f32, f16 or bf16 \
                 logits [T, vocab]",
                meta.scalar_type, meta.shape
            )))
        }
    };
    if meta.shape.is_empty() {
        return Err(BridgeError::Protocol(format!("method '{method}' returns a scalar first, not logits")));
    }
    Ok(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_recorded_is_the_first_largest_and_never_a_nan() {
        let summary = ProgramSummary {
            methods: vec![],
            output_bytes: vec![],
            backends: vec![],
            batched_tokens: vec![],
        };
        let mut report = Report::new(&summary, vec![], PlannedMemory::Host);
        for row in [vec![0.5, 2.0, 2.0, -1.0], vec![f32::NAN, 1.0, 0.5], vec![f32::NAN, f32::NAN], vec![3.0]]
        {
            let token = greedy(&row, 0);
            report.record(row, token);
        }
        // A NaN first value never wins; an all-NaN row gives its last index, as `ref_graph::argmax`.
        assert_eq!(report.tokens, [1, 1, 1, 0]);
        assert_eq!(report.logits.len(), 4);
    }

    fn problem(data: &[u8], dtype: DTypeCode, shape: &[i64]) -> Option<InputProblem> {
        match raw_input(2, &Input { data, dtype, shape }) {
            Ok(_) => None,
            Err(BridgeError::Input { index, dtype: d, shape: s, problem }) => {
                assert_eq!((index, d, s.as_slice()), (2, dtype, shape), "the error names the input");
                Some(problem)
            }
            Err(other) => panic!("expected an input error, got {other}"),
        }
    }

    #[test]
    fn an_input_must_be_exactly_its_shape_times_its_dtype_and_fit_executorchs_sizes() {
        // An 8-byte slice declared [4] i64 (32 bytes): the shim would read 24 bytes past it.
        assert_eq!(
            problem(&[0; 8], DTypeCode::I64, &[4]),
            Some(InputProblem::Length { expected: Some(32), actual: 8 })
        );
        let err =
            raw_input(0, &Input { data: &[0; 8], dtype: DTypeCode::I64, shape: &[4] }).expect_err("short");
        assert_eq!(
            err.to_string(),
            "input 0 (i64 [4]): its shape x dtype is 32 bytes, but the slice holds 8"
        );
        assert_eq!(et_error::HasErrorCode::error_code(&err), ErrorCode::InvalidArgument);
        // Too long is refused too: the tensor would not say what the caller handed over.
        assert_eq!(
            problem(&[0; 12], DTypeCode::F32, &[2]),
            Some(InputProblem::Length { expected: Some(8), actual: 12 })
        );
        // Sizes are narrowed to ExecuTorch's int32 with a check, never truncated (2^32 + 1 would become 1).
        assert_eq!(
            problem(&[0; 8], DTypeCode::I64, &[(1 << 32) + 1]),
            Some(InputProblem::Size { dim: 0, size: (1 << 32) + 1, max: i64::from(i32::MAX) })
        );
        assert_eq!(
            problem(&[], DTypeCode::I64, &[1, -1]),
            Some(InputProblem::Size { dim: 1, size: -1, max: i64::from(i32::MAX) })
        );
        // A product past 64 bits is a length problem, not an overflow.
        let huge = [i64::from(i32::MAX); 3];
        assert_eq!(
            problem(&[], DTypeCode::I64, &huge),
            Some(InputProblem::Length { expected: None, actual: 0 })
        );
        assert_eq!(
            problem(&[], DTypeCode::F32, &[0; 17]),
            Some(InputProblem::Rank { rank: 17, max: KVD_MAX_RANK })
        );
        // What fits is described as it is.
        let raw =
            raw_input(1, &Input { data: &[0; 24], dtype: DTypeCode::F32, shape: &[2, 3] }).expect("fits");
        assert_eq!((raw.nbytes, raw.rank, &raw.shape[..2]), (24, 2, &[2i64, 3][..]));
        assert_eq!(problem(&[0; 8], DTypeCode::I64, &[]), None, "a scalar is one element");
    }

    #[test]
    fn the_check_names_an_unserved_backend_and_reads_a_served_one() {
        let bytes = pte_format::testing::kv_decoder(b"payload");
        let path = Path::new("kv.pte");
        let err = check_program(path, &bytes, &[]).expect_err("nobody serves it");
        assert!(
            err.to_string().contains("backend 'ReferenceBackend'") && err.to_string().contains("none"),
            "{err}"
        );
        let summary = check_program(path, &bytes, &["ReferenceBackend".to_owned()]).expect("served");
        assert_eq!(summary.backends, ["ReferenceBackend"]);
        assert_eq!(summary.methods, ["forward"]);
        let err = check_program(path, &bytes[..bytes.len() / 2], &[]).expect_err("truncated");
        assert!(matches!(err, BridgeError::Program { .. }), "{err}");
    }
}
