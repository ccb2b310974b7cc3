//! `assign` (payload 1.3): a program's mutable buffer overwritten each call (as Hugging Face StaticCache sets
//! `cumulative_length` from `cache_position`), written by the delegate into the caller's argument in place,
//! so nothing is copied back after the call.

use delegate_abi::host::ArgList;
use delegate_abi::{DTypeCode, Delegate, ExecStats, ExecuteArgs, InitContext, MemoryKind};
use ref_graph::{ElemType, Graph, GraphBuilder};
use reference_delegate::{ReferenceDelegate, ReferenceHandle, BACKEND_ID};

/// `y = x + x`, and the buffer `length` (`i64 []`) set to `cache_position[0]` in place.
fn graph() -> Graph {
    let mut b = GraphBuilder::new();
    let pos = b.input("cache_position", ElemType::I64, &[1]).expect("fresh");
    let length = b.input("length", ElemType::I64, &[]).expect("fresh");
    let x = b.input("x", ElemType::F32, &[2]).expect("fresh");
    let y = b.add("y", x, x).expect("typed");
    let first = b.reshape("first", pos, &[]).expect("one element");
    let written = b.assign("length_out", length, first).expect("typed");
    b.output(y).expect("declared");
    b.output(written).expect("declared");
    b.finish().expect("valid")
}

fn blob(graph: &Graph) -> Vec<u8> {
    // Inputs `cache_position, length, x`, outputs `y, length_out` (graph order); `length_out` aliases `length`.
    delegate_pack::pack_graph(graph, BACKEND_ID).expect("packs")
}

fn init() -> ReferenceHandle {
    let blob = blob(&graph());
    ReferenceDelegate::new()
        .init(InitContext { blob: &blob, compile_specs: &[], runtime_specs: &[] })
        .expect("init")
}

/// One call at `position`; `separate` gives the buffer's output its own storage instead of the buffer's.
/// Returns `y`, the buffer, the separate output (or -1) and the call's statistics.
fn call(
    handle: &mut ReferenceHandle,
    length: &mut [i64; 1],
    position: i64,
    separate: bool,
) -> ([f32; 2], i64, ExecStats) {
    let (position, x) = ([position], [1.5f32, -2.0]);
    let (mut y, mut out) = ([0.0f32; 2], [-1i64]);
    let mut stats = ExecStats::default();
    {
        let host = MemoryKind::Host;
        let mut list = ArgList::new();
        list.push_input(bytemuck::cast_slice(&position), DTypeCode::I64, &[1], host).expect("sized");
        let slot =
            list.push_inout(bytemuck::cast_slice_mut(length), DTypeCode::I64, &[], host).expect("sized");
        list.push_input(bytemuck::cast_slice(&x), DTypeCode::F32, &[2], host).expect("sized");
        list.push_output(bytemuck::cast_slice_mut(&mut y), DTypeCode::F32, &[2], host).expect("sized");
        if separate {
            list.push_output(bytemuck::cast_slice_mut(&mut out), DTypeCode::I64, &[], host).expect("sized");
        } else {
            list.push_output_in_place(slot, DTypeCode::I64, &[]).expect("same storage");
        }
        // SAFETY: `ArgList` built every argument from live borrows (shared for inputs, exclusive for the
        // buffer and outputs) that outlive this block, and shares storage only between the buffer and its
        // in-place output at the same address and size: `ExecuteArgs::new`'s contract.
        let mut args = unsafe { ExecuteArgs::new(list.as_slice(), None, &mut stats) };
        ReferenceDelegate::new().execute(handle, &mut args).expect("execute");
    }
    (y, out[0], stats)
}

#[test]
fn an_assigned_buffer_is_written_in_place_each_call() {
    let mut handle = init();
    let mut length = [-7i64];
    for position in [0, 5, 9] {
        let (y, _, stats) = call(&mut handle, &mut length, position, false);
        assert_eq!(y, [3.0, -4.0]);
        assert_eq!(length, [position], "the buffer holds cache_position[0]");
        assert_eq!(stats.reflect_bytes, 0, "written in place, nothing copied back");
    }
}

#[test]
fn an_assigned_buffer_with_separate_output_storage_is_reflected() {
    let mut handle = init();
    let mut length = [0i64];
    let (_, out, stats) = call(&mut handle, &mut length, 4, true);
    assert_eq!((length, out), ([4], 4), "the buffer is written and the output slot receives its value");
    assert_eq!(stats.reflect_bytes, 8, "one i64 copied into the separate slot");
}
