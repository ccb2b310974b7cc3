//! Strict zero-copy in ExecuTorch's runtime ([`crate::runner::Protocol::require_zero_copy`], `et-run
//! --require-zero-copy`): a program any of whose calls would copy cache bytes on every step is refused before
//! ExecuTorch loads it, naming the method, the instruction, the buffer and the reason.
//!
//! Two ways a cache's bytes move per step in the bridge, both decided by the program and the plugin alone:
//! - an `aten::copy_` write-back of a buffer: ExecuTorch runs its kernel every step, which copies the whole
//!   source into the buffer (what [`crate::CopyStats::write_back_bytes`] counts). Its source placed elsewhere
//!   (the export's planning pass did not put the KV output at the buffer's `(mem_id, offset)`), the delegate
//!   gets two pointers and the copy moves the new cache; placed on the buffer, the copy is a self-copy that
//!   still copies every byte onto itself. `KvAliasMemoryPlanningPass` places the output and removes that
//!   self-copy, so a program it exported has no write-back for its caches;
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

/// A `copy_` write-back of a buffer: from a value placed elsewhere, or onto itself.
fn unplanned_write_back(method: &Method<'_>) -> Option<BridgeError> {
    let buffers = method.mutable_buffers();
    let (buffer, write_back, src) = buffers
        .iter()
        .find_map(|buffer| buffer.write_backs.iter().find_map(|w| w.src.map(|src| (buffer, w, src))))?;
    let bytes = method.tensor(src).and_then(|t| t.nbytes()).unwrap_or(0);
    let placed = method.tensor(src).and_then(|t| t.allocation);
    let reason = if placed == Some(buffer.allocation) {
        format!(
            "its write-back is a self-copy (value {src} is planned on the buffer), but ExecuTorch's copy_ kernel \
             still copies its {bytes} bytes onto the buffer every step (export with this repository's \
             KvAliasMemoryPlanningPass, which removes such write-backs)"
        )
    } else {
        format!(
            "its write-back copies {bytes} bytes from value {src} every step, because the planning pass did not \
             place that KV output on the buffer (export with KvAliasMemoryPlanningPass)"
        )
    };
    Some(BridgeError::NotZeroCopy {
        method: method.name.to_owned(),
        instruction: format!("{} (aten::copy_)", write_back.at),
        argument: buffer_name(buffer.value, buffer.name),
        reason,
    })
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
