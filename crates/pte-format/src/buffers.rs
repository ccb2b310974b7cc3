//! Which values of a method are mutable buffers ([`Method::mutable_buffers`]).
//!
//! ExecuTorch has no "mutable buffer" flag; a buffer is a convention of the exporter. The rule implemented
//! here, exactly: a value `v` of a method is a mutable buffer when
//!
//! 1. `v` is a `Tensor` with `allocation_info`: the memory planner placed it (`mem_id`, offset) in an arena
//!    that lives as long as the loaded method, so its contents persist from one call to the next;
//! 2. `v` is none of the method's inputs or outputs (those belong to the caller, even when planned); and
//! 3. either
//!    - `v` has `extra_tensor_info.fully_qualified_name` (ExecuTorch writes it for mutable buffers when
//!      exporting with `ExecutorchBackendConfig(emit_mutable_buffer_names=True)`; the other tensors that carry
//!      it, external constants, have no `allocation_info`), or
//!    - `v` is the first argument (`self`) of a `KernelCall` whose operator name is `aten::copy_`, any
//!      overload: the write-back ExecuTorch emits for every buffer the graph mutates.
//!
//! `data_buffer_idx` does not enter the rule: it is 0 for a buffer without a serialized initial value
//! (ExecuTorch's default; `Module` zero-fills its arenas) and non-zero when the export ran
//! `InitializedMutableBufferPass`, which stores the initial value in `mutable_data_segments`; both are
//! buffers, and [`MutableBuffer::data_buffer_idx`] says which.
//!
//! What the rule cannot see: state a delegate owns (exported with `tag_mutated_buffer`: the program then has
//! no buffer value at all) and a buffer that is neither named nor written back by `aten::copy_`.
//!
//! [`Method::mutable_buffers`]: crate::model::Method::mutable_buffers

use crate::model::{Method, MutableBuffer, Value, WriteBack};

/// The operator whose first argument a write-back targets.
pub const COPY_OPERATOR: &str = "aten::copy_";

pub(crate) fn mutable_buffers<'a>(method: &Method<'a>) -> Vec<MutableBuffer<'a>> {
    let mut write_backs: Vec<Vec<WriteBack>> = vec![Vec::new(); method.values.len()];
    for (at, call) in method.kernel_calls() {
        if call.name != COPY_OPERATOR {
            continue;
        }
        if let Some(&target) = call.args.first() {
            if let Some(list) = write_backs.get_mut(target) {
                list.push(WriteBack { at, src: call.args.get(1).copied() });
            }
        }
    }
    let mut buffers = Vec::new();
    for (value, (v, writes)) in method.values.iter().zip(write_backs).enumerate() {
        let Value::Tensor(tensor) = v else { continue };
        let Some(allocation) = tensor.allocation else { continue };
        if method.inputs.contains(&value) || method.outputs.contains(&value) {
            continue;
        }
        let name = tensor.fully_qualified_name();
        if name.is_none() && writes.is_empty() {
            continue;
        }
        buffers.push(MutableBuffer {
            value,
            name,
            allocation,
            data_buffer_idx: tensor.data_buffer_idx,
            write_backs: writes,
        });
    }
    buffers
}
