//! One loaded [`Module`]'s calls of the run protocol: the prompt's calls planned, each call's inputs written and
//! the last row of its logits read back.

use std::path::Path;

use delegate_abi::DTypeCode;
use host_runtime::generate;
use host_runtime::generate::protocol::{Call, Methods};

use super::check::{parse, ProgramSummary};
use super::module::{Input, Module, OutputMeta};
use crate::backend::{self, scalar_type_of, CopyStats};
use crate::BridgeError;

/// The calls that feed `prompt` through `(prefill, decode)` of the program in `bytes`
/// ([`generate::protocol::plan`]), each method's token count read from its first input.
pub(super) fn prompt_calls<'p>(
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
pub(super) struct Session<'s> {
    pub(super) module: Module,
    summary: &'s ProgramSummary,
    outputs: Vec<(String, Vec<Vec<u8>>)>,
}

impl<'s> Session<'s> {
    pub(super) fn new(module: Module, summary: &'s ProgramSummary) -> Session<'s> {
        let outputs = summary
            .output_bytes
            .iter()
            .map(|(m, sizes)| (m.clone(), sizes.iter().map(|&n| vec![0u8; n as usize]).collect()))
            .collect();
        Session { module, summary, outputs }
    }

    /// Runs `calls` in order: the last one's logits row, and the copies of them all.
    pub(super) fn feed(&mut self, calls: &[Call<'_>]) -> Result<(Vec<f32>, CopyStats), BridgeError> {
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
    pub(super) fn call(&mut self, call: &Call<'_>) -> Result<(Vec<f32>, CopyStats), BridgeError> {
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
