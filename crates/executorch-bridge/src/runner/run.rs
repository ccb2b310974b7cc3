//! The run protocol: prefill the prompt, then decode a token a step, each token greedy or the caller's pick.

use std::path::Path;

use host_runtime::generate::protocol::Call;
use host_runtime::plugins::Registry;

use super::check::{check_program, refuse_copies, ProgramSummary};
use super::module::Module;
use super::session::{prompt_calls, Session};
use crate::backend::{self, CopyStats};
use crate::planned::{PlannedMemory, SyncStats};
use crate::program_file::ProgramFile;
use crate::BridgeError;

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
/// ([`generate::protocol`](host_runtime::generate::protocol)): in chunks of the prefill method's token count through `prefill`, the tokens short
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
}
