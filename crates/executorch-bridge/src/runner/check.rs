//! The pre-flight check of a program: read by `pte-format` before ExecuTorch loads it.

use std::path::Path;

use host_runtime::plugins::Registry;
use pte_format::Program;

use crate::BridgeError;

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
pub(super) fn refuse_copies(path: &Path, bytes: &[u8], registry: &Registry) -> Result<(), BridgeError> {
    let program = parse(path, bytes)?;
    let binds = |backend: &str| registry.served(backend).is_some_and(|p| p.info().binds_aliases_in_place);
    crate::strict::zero_copy_refusal(&program, binds).map_or(Ok(()), Err)
}

/// `bytes` read by `pte-format`, a failure naming `path`.
pub(super) fn parse<'a>(path: &Path, bytes: &'a [u8]) -> Result<Program<'a>, BridgeError> {
    Program::parse(bytes).map_err(|source| BridgeError::Program { path: path.display().to_string(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

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
