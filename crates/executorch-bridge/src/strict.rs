//! Strict zero-copy in ExecuTorch's runtime ([`crate::runner::Protocol::require_zero_copy`], `et-run
//! --require-zero-copy`): a program any of whose calls would copy cache bytes on every step is refused before
//! ExecuTorch loads it, naming the method, the instruction, the buffer and the reason.
//!
//! Two ways a cache's bytes move per step in the bridge, both decided by the program and the plugin alone:
//! - an `aten::copy_` write-back whose source is not placed on its buffer: the export's planning pass
//!   (`KvAliasMemoryPlanningPass`) did not put the KV output at the buffer's `(mem_id, offset)`, so ExecuTorch
//!   hands the delegate two pointers and the `copy_` copies the output back (what [`crate::CopyStats::write_back_bytes`]
//!   counts when the pointers differ); a planned program's `copy_` is a self-copy, which copies nothing;
//! - a DelegateCall reading a buffer whose plugin does not bind aliased outputs in place: the bridge gives it
//!   a scratch output and writes it back every call.

use pte_format::model::Method;
use pte_format::Program;

use crate::BridgeError;

/// The first call of `program` that would copy cache bytes per step, as [`BridgeError::NotZeroCopy`];
/// `binds_in_place(backend)` says whether the plugin serving a backend binds aliased outputs in place.
pub fn zero_copy_refusal(
    program: &Program<'_>,
    binds_in_place: impl Fn(&str) -> bool,
) -> Option<BridgeError> {
    program.methods.iter().find_map(|method| {
        unplanned_write_back(method).or_else(|| scratch_write_back(method, &binds_in_place))
    })
}

/// A `copy_` write-back of a buffer from a value placed elsewhere.
fn unplanned_write_back(method: &Method<'_>) -> Option<BridgeError> {
    for buffer in method.mutable_buffers() {
        for write_back in &buffer.write_backs {
            let Some(src) = write_back.src else { continue };
            let placed = method.tensor(src).and_then(|t| t.allocation);
            if placed == Some(buffer.allocation) {
                continue; // a self-copy: the planning pass put the KV output on the buffer
            }
            let bytes = method.tensor(src).and_then(|t| t.nbytes()).unwrap_or(0);
            return Some(BridgeError::NotZeroCopy {
                method: method.name.to_owned(),
                instruction: format!("{} (aten::copy_)", write_back.at),
                argument: buffer_name(buffer.value, buffer.name),
                reason: format!(
                    "its write-back copies {bytes} bytes from value {src} every step, because the planning pass \
                     did not place that KV output on the buffer (export with KvAliasMemoryPlanningPass)"
                ),
            });
        }
    }
    None
}

/// A DelegateCall reading a buffer, served by a plugin that does not bind aliased outputs in place.
fn scratch_write_back(method: &Method<'_>, binds_in_place: &impl Fn(&str) -> bool) -> Option<BridgeError> {
    let buffers = method.mutable_buffers();
    for (at, call) in method.delegate_calls() {
        let backend = method.delegates.get(call.delegate).map(|d| d.id).unwrap_or_default();
        if binds_in_place(backend) {
            continue;
        }
        let Some(buffer) = buffers.iter().find(|b| call.args.contains(&b.value)) else { continue };
        return Some(BridgeError::NotZeroCopy {
            method: method.name.to_owned(),
            instruction: format!("{at} (DelegateCall to {backend})"),
            argument: buffer_name(buffer.value, buffer.name),
            reason: format!(
                "the plugin serving '{backend}' does not bind aliased outputs in place, so the bridge gives it a \
                 separate output and writes it back into the buffer every step"
            ),
        });
    }
    None
}

fn buffer_name(value: usize, name: Option<&str>) -> String {
    match name {
        Some(name) => format!("buffer '{name}' (value {value})"),
        None => format!("buffer value {value}"),
    }
}
