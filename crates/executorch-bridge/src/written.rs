//! What a delegate writes is planned memory: every DelegateCall argument the delegate writes (an output, or a
//! buffer it updates in place, as its payload's argument layout says) must be a tensor the memory planner placed
//! (`allocation_info`), or the program is refused before ExecuTorch loads it ([`unplanned_write`]).
//!
//! ExecuTorch does not know which arguments of a DelegateCall are outputs: it hands the delegate every tensor's
//! data pointer as writable. A crafted program can name one of its constants (no `allocation_info`; a
//! `data_buffer_idx` into the program's constant data) where the delegate writes: the delegate would write into
//! the program's bytes (read-only when ExecuTorch maps the file: the process dies; in memory: the constants are
//! overwritten). A tensor with neither is memory the caller binds at run time, which a delegate must not write
//! either. So the check is on the program alone, decided by the same reading of the payload's layout as the
//! delegate's `init` (`backend::arg_kinds`); a payload that is not a blob is refused by `init`, before
//! any call runs, so it is passed over here.

use pte_format::model::{Method, Tensor};
use pte_format::Program;

use crate::BridgeError;

/// The first DelegateCall argument of `program` that its delegate writes and that is not planned memory, as
/// [`BridgeError::UnplannedWrite`] naming the method, the call, the argument and why.
pub fn unplanned_write(program: &Program<'_>) -> Option<BridgeError> {
    program.methods.iter().find_map(in_method)
}

fn in_method(method: &Method<'_>) -> Option<BridgeError> {
    for (at, call) in method.delegate_calls() {
        let Some(delegate) = method.delegates.get(call.delegate) else { continue };
        let Ok(blob) = blob_format::Blob::parse(delegate.processed.data) else { continue };
        let Ok(kinds) = crate::backend::arg_kinds(&blob.header) else { continue };
        for (position, ((kind, name), &value)) in kinds.iter().zip(&call.args).enumerate() {
            let Some(written) = kind.written_as() else { continue };
            // Not a tensor: the bridge refuses it when the call runs, naming the position.
            let Some(tensor) = method.tensor(value) else { continue };
            if let Some(reason) = not_planned(tensor) {
                return Some(BridgeError::UnplannedWrite {
                    method: method.name.to_owned(),
                    instruction: format!("{at} (DelegateCall to {})", delegate.id),
                    argument: format!("argument {position} ('{name}', value {value})"),
                    written: written.to_owned(),
                    reason,
                });
            }
        }
    }
    None
}

/// Why `tensor` is not planned memory, if it is not.
fn not_planned(tensor: &Tensor<'_>) -> Option<String> {
    if tensor.allocation.is_some() {
        return None;
    }
    Some(match tensor.data_buffer_idx {
        0 => "it has no allocation_info and no data: memory the caller binds at run time".to_owned(),
        index => format!("it is constant data of the program (data_buffer_idx {index}, no allocation_info)"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pte_format::testing::{kv, kv_decoder_spec, TensorSpec, ValueSpec};

    /// `pte_format::testing::kv_decoder` around a reference blob whose layout is that decoder's: inputs
    /// `input_pos, tokens`, buffers `k_cache, v_cache` updated in place by `k_new, v_new`, output `logits`.
    fn decoder(change: impl FnOnce(&mut Vec<ValueSpec>)) -> Vec<u8> {
        let blob = kv_example::export::blob(
            &kv_example::Config::tiny(),
            &kv_example::Weights::generate(&kv_example::Config::tiny()),
            1,
            kv_example::export::Backend::Reference,
        )
        .expect("a blob");
        let mut spec = kv_decoder_spec(&blob);
        change(&mut spec.methods[0].values);
        spec.to_bytes()
    }

    fn refusal(bytes: &[u8]) -> Option<String> {
        let program = Program::parse(bytes).expect("a program");
        unplanned_write(&program).map(|err| {
            assert_eq!(et_error::HasErrorCode::error_code(&err), et_error::ErrorCode::InvalidProgram);
            err.to_string()
        })
    }

    fn unplanned(value: &mut ValueSpec, data_buffer_idx: u32) {
        let ValueSpec::Tensor(TensorSpec { allocation, data_buffer_idx: index, .. }) = value else {
            panic!("a tensor")
        };
        *allocation = None;
        *index = data_buffer_idx;
    }

    #[test]
    fn planned_outputs_and_buffers_pass_and_a_constant_or_unbound_one_is_named() {
        assert_eq!(refusal(&decoder(|_| {})), None, "every written argument is planned");
        // A constant read by the delegate is an input: allowed (weights outside the delegate).
        assert_eq!(refusal(&decoder(|values| unplanned(&mut values[kv::INPUT_POS], 1))), None);
        let line =
            refusal(&decoder(|values| unplanned(&mut values[kv::K_NEW], 1))).expect("a constant output");
        let call =
            "method 'forward', chains[0].instructions[0] (DelegateCall to ReferenceBackend): argument 4 (";
        assert!(line.starts_with(call), "{line}");
        let why =
            "value 4) is an output the delegate writes, but it is not planned memory: it is constant data \
                   of the program (data_buffer_idx 1";
        assert!(line.contains(why), "{line}");
        let line =
            refusal(&decoder(|values| unplanned(&mut values[kv::K_CACHE], 0))).expect("an unbound buffer");
        assert!(
            line.contains("argument 2 (") && line.contains("a buffer the delegate updates in place"),
            "{line}"
        );
        assert!(line.contains("memory the caller binds at run time"), "{line}");
    }
}
