//! f16 and bf16 graphs on this delegate (issue 18): supported from the header, computed in f32 with each
//! op's result rounded to the graph's type, caches updated in place with their type's alignment.

use delegate_abi::host::ArgList;
use delegate_abi::{Compatibility, DTypeCode, Delegate, ErrorCode, MemoryKind};
use ref_graph::{ElemType, GraphBuilder};
use reference_delegate::ReferenceDelegate;

#[path = "support/calls.rs"]
mod calls;
use calls::{expect_code, init, plain_blob, run_list};

/// f16 and bf16 blobs are this delegate's too (issue 18): supported from the header, and run in f32 with each
/// op's result rounded to the graph's type. `y = x * w + x` with an f16 (bf16) constant `w`: each product and
/// sum is rounded at store, so the expected values are computed here step by step from the same roundings.
#[test]
fn half_blobs_run_with_each_result_rounded_to_their_type() {
    use ref_graph::half::{bf16, f16};
    let delegate = ReferenceDelegate::new();
    let x_values = [1.0f32, -2.5, 3.0e-3, 1000.7];
    let w_values = [0.1f32, 3.0, -7.25, 0.333];
    for (dtype, code) in [(ElemType::F16, DTypeCode::F16), (ElemType::Bf16, DTypeCode::BF16)] {
        let round = |v: f32| match dtype {
            ElemType::F16 => f16::from_f32(v).to_f32(),
            _ => bf16::from_f32(v).to_f32(),
        };
        let mut b = GraphBuilder::new();
        let x = b.input("x", dtype, &[1, 4]).expect("fresh");
        let w = match dtype {
            ElemType::F16 => b.constant_f16("w", &[4], w_values.map(f16::from_f32).to_vec()),
            _ => b.constant_bf16("w", &[4], w_values.map(bf16::from_f32).to_vec()),
        };
        let xw = b.mul("xw", x, w.expect("4 values")).expect("typed");
        let y = b.add("y", xw, x).expect("typed");
        b.output(y).expect("declared");
        let graph = b.finish().expect("valid");
        let blob = plain_blob(&graph, &["x"], &["y"]);
        assert_eq!(delegate.compatibility(&blob), Compatibility::Supported, "{dtype}");
        let mut handle = init(&delegate, &blob).expect("a half graph initialises");

        // Native-endian 16-bit values, as a caller holds them.
        let to_bits = |v: f32| match dtype {
            ElemType::F16 => f16::from_f32(v).to_bits(),
            _ => bf16::from_f32(v).to_bits(),
        };
        let x_bits = x_values.map(to_bits);
        let mut y_bits = [0u16; 4];
        let mut list = ArgList::new();
        list.push_input(bytemuck::cast_slice(&x_bits), code, &[1, 4], MemoryKind::Host).expect("sized");
        list.push_output(bytemuck::cast_slice_mut(&mut y_bits), code, &[1, 4], MemoryKind::Host)
            .expect("sized");
        run_list(&delegate, &mut handle, &list).expect("runs");
        drop(list);

        let from_bits = |bits: u16| match dtype {
            ElemType::F16 => f16::from_bits(bits).to_f32(),
            _ => bf16::from_bits(bits).to_f32(),
        };
        let expected: Vec<f32> = x_values
            .iter()
            .zip(w_values)
            .map(|(&x, w)| {
                let (x, w) = (round(x), round(w));
                round(round(x * w) + x)
            })
            .collect();
        assert_eq!(y_bits.map(from_bits).to_vec(), expected, "{dtype}");
        // Not the f32 result: the roundings at store are visible.
        let exact: Vec<f32> = x_values.iter().zip(w_values).map(|(&x, w)| x * w + x).collect();
        assert_ne!(expected, exact, "{dtype}");
    }
}

/// A bf16 cache updated in place needs 2-byte alignment, not f32's 4: a cache at an odd address is refused
/// naming the need, one at an address that is 2 but not 4 modulo 4 runs (and its row is written).
#[test]
fn half_caches_need_the_alignment_of_their_type() {
    use ref_graph::half::bf16;
    let mut b = GraphBuilder::new();
    let pos = b.input("input_pos", ElemType::I64, &[1]).expect("fresh");
    let cache = b.input("k_cache", ElemType::Bf16, &[1, 2, 2]).expect("fresh");
    let row = b.input("k", ElemType::Bf16, &[1, 2]).expect("fresh");
    let updated = b.kv_cache_update("k_cache_out", cache, row, pos).expect("typed");
    b.output(updated).expect("declared");
    let graph = b.finish().expect("valid");
    let blob = plain_blob(&graph, &["input_pos", "k_cache", "k"], &["k_cache_out"]);
    let delegate = ReferenceDelegate::new();
    let mut handle = init(&delegate, &blob).expect("valid blob");
    let (position, k) = ([1i64], [bf16::from_f32(1.5).to_bits(), bf16::from_f32(-2.0).to_bits()]);
    // Storage aligned to 4: byte offset 2 is 2 (not 4) aligned, offset 1 is not 2 aligned.
    let mut storage = [0u32; 3];
    for (offset, runs) in [(2usize, true), (1, false)] {
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut storage);
        let cache_bytes = &mut bytes[offset..offset + 8];
        let mut list = ArgList::new();
        list.push_input(bytemuck::cast_slice(&position), DTypeCode::I64, &[1], MemoryKind::Host)
            .expect("sized");
        let slot =
            list.push_inout(cache_bytes, DTypeCode::BF16, &[1, 2, 2], MemoryKind::Host).expect("sized");
        list.push_input(bytemuck::cast_slice(&k), DTypeCode::BF16, &[1, 2], MemoryKind::Host).expect("sized");
        list.push_output_in_place(slot, DTypeCode::BF16, &[1, 2, 2]).expect("same storage");
        let result = run_list(&delegate, &mut handle, &list);
        drop(list);
        if runs {
            result.expect("2-byte alignment is enough for bf16");
            let bytes: &[u8] = bytemuck::cast_slice(&storage);
            let value = |i: usize| bf16::from_ne_bytes([bytes[offset + 2 * i], bytes[offset + 2 * i + 1]]);
            assert_eq!((0..4).map(|i| value(i).to_f32()).collect::<Vec<_>>(), [0.0, 0.0, 1.5, -2.0]);
        } else {
            expect_code(result, ErrorCode::InvalidArgument, "is not 2-byte aligned, which bf16 caches");
        }
    }
}
