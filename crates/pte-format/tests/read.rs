//! The reader's view of programs laid out as ExecuTorch 1.5.1 writes them.

mod common;

use blob_format::Blob;
use pte_format::model::{
    Allocation, DataLocation, Instruction, ScalarType, ShapeDynamism, TensorDataLocation, Value,
};
use pte_format::testing::{self, kv, DelegateSpec, InstructionSpec, MethodSpec, TensorSpec, ValueSpec};
use pte_format::{Error, Program};

/// Asserts that `part` is a sub-slice of `whole` starting at `offset`: borrowed, not copied.
fn assert_borrowed(whole: &[u8], part: &[u8], offset: u64) {
    let start = part.as_ptr() as usize - whole.as_ptr() as usize;
    assert_eq!(start as u64, offset, "borrowed at its recorded offset");
    assert!(start + part.len() <= whole.len());
}

#[test]
fn kv_decoder_container_header_and_segments() {
    let blob = common::kv_blob();
    let bytes = common::kv_pte();
    assert_eq!(&bytes[4..8], b"ET12");
    assert_eq!(&bytes[8..12], b"eh00");
    let program = Program::parse(&bytes).expect("reads");
    assert_eq!(program.version, 0);
    let header = program.extended_header.expect("has a header");
    assert_eq!(header.length, 32);
    assert_eq!(header.program_size, program.program_size);
    assert!(header.program_size <= header.segment_base_offset);
    assert_eq!(header.segment_base_offset % 128, 0);
    assert_eq!(header.segment_base_offset + header.segment_data_size, bytes.len() as u64);

    assert_eq!(program.segments.len(), 2);
    assert!(program.segments[0].data.is_empty(), "the empty constant segment");
    assert_eq!(program.segments[1].offset, header.segment_base_offset);
    assert_eq!(program.segments[1].data, blob.as_slice());
    assert_borrowed(&bytes, program.segments[1].data, program.segments[1].offset);
    let constants = program.constant_segment.as_ref().expect("constant segment");
    assert_eq!((constants.segment_index, constants.offsets.as_slice()), (0, [0u64].as_slice()));
    assert!(program.mutable_data_segments.is_empty() && program.named_data.is_empty());
}

#[test]
fn kv_decoder_method_io_and_tensor_metadata() {
    let bytes = common::kv_pte();
    let program = Program::parse(&bytes).expect("reads");
    assert_eq!(program.methods.len(), 1);
    let forward = program.method("forward").expect("forward");
    assert!(program.method("decode").is_none());
    assert_eq!(forward.inputs, [kv::TOKENS, kv::INPUT_POS]);
    assert_eq!(forward.outputs, [kv::LOGITS]);
    let tokens = forward.tensor(kv::TOKENS).expect("tensor");
    assert_eq!(tokens.scalar_type, ScalarType::Long);
    assert_eq!(tokens.sizes, [1, 1]);
    assert_eq!(tokens.dim_order, [0, 1]);
    assert_eq!(tokens.allocation, Some(Allocation { mem_id: 1, offset: 0 }));
    assert_eq!(tokens.shape_dynamism, ShapeDynamism::Static);
    assert_eq!(tokens.fully_qualified_name(), None);
    assert_eq!(tokens.nbytes(), Some(8));
    let k = forward.tensor(kv::K_CACHE).expect("tensor");
    assert_eq!((k.scalar_type, k.sizes.as_slice()), (ScalarType::Float, [1, 2, 16, 8].as_slice()));
    assert_eq!(k.fully_qualified_name(), Some("k_cache"));
    assert_eq!(k.extra.expect("extra").location, TensorDataLocation::Segment);
    assert_eq!(k.nbytes(), Some(1024));
    assert_eq!(
        forward.tensor(kv::V_CACHE).and_then(|t| t.allocation),
        Some(Allocation { mem_id: 2, offset: 1024 })
    );
    assert_eq!(forward.values[8], Value::Null);
    assert_eq!(forward.values[9], Value::Bool(false));
    assert!(forward.tensor(8).is_none());
    assert_eq!(forward.non_const_buffer_sizes, [0, 2368, 2048]);
}

#[test]
fn kv_decoder_delegate_call_carries_a_native_blob_from_its_segment() {
    let bytes = common::kv_pte();
    let program = Program::parse(&bytes).expect("reads");
    let forward = &program.methods[0];
    assert_eq!(forward.delegates.len(), 1);
    let delegate = &forward.delegates[0];
    assert_eq!(delegate.id, "ReferenceBackend");
    assert_eq!(delegate.compile_specs.len(), 1);
    assert_eq!(
        (delegate.compile_specs[0].key, delegate.compile_specs[0].value),
        ("max_seq_len", b"16".as_slice())
    );
    assert_eq!(delegate.processed.location, DataLocation::Segment);
    assert_eq!(delegate.processed.index, 1);
    assert_borrowed(&bytes, delegate.processed.data, delegate.processed.offset);
    // The payload reports its own place: the bytes of `range()` are the payload.
    let range = delegate.processed.range();
    assert_eq!(&bytes[range.start as usize..range.end as usize], delegate.processed.data);
    assert_eq!(delegate.processed.label(), "segment 1");

    let calls: Vec<_> = forward.delegate_calls().collect();
    assert_eq!(calls.len(), 1);
    let (at, call) = calls[0];
    assert_eq!((at.chain, at.instruction), (0, 0));
    assert_eq!(call.delegate, 0);
    assert_eq!(
        call.args,
        [kv::INPUT_POS, kv::TOKENS, kv::K_CACHE, kv::V_CACHE, kv::K_NEW, kv::V_NEW, kv::LOGITS_RAW]
    );

    // The payload is a blob blob-format reads, whose bindings follow the DelegateCall's args.
    let blob = Blob::parse(delegate.processed.data).expect("the payload is a native blob");
    assert_eq!(blob.header, common::kv_blob_header());
    let names: Vec<_> = blob.header.bindings.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names.len(), call.args.len());
    let named: Vec<_> = call.args.iter().filter_map(|&v| forward.tensor(v)?.fully_qualified_name()).collect();
    assert_eq!(named, ["k_cache", "v_cache"]);
    assert_eq!((names[2], names[3]), ("k_cache", "v_cache"));
}

#[test]
fn kv_decoder_instructions_operators_and_mutable_buffers() {
    let bytes = common::kv_pte();
    let program = Program::parse(&bytes).expect("reads");
    let forward = &program.methods[0];
    assert_eq!(forward.chains.len(), 1);
    assert_eq!(forward.chains[0].inputs, [0, 1]);
    let kinds: Vec<_> = forward.instructions().map(|(_, i)| i.kind()).collect();
    assert_eq!(kinds, ["DelegateCall", "KernelCall", "KernelCall", "KernelCall"]);
    let kernels: Vec<_> =
        forward.kernel_calls().map(|(at, k)| (at.instruction, k.name, k.overload, k.args.clone())).collect();
    assert_eq!(
        kernels,
        [
            (1, "aten::copy_", "", vec![kv::K_CACHE, kv::K_NEW, 9, kv::K_CACHE]),
            (2, "aten::copy_", "", vec![kv::V_CACHE, kv::V_NEW, 9, kv::V_CACHE]),
            (3, "aten::clone", "out", vec![kv::LOGITS_RAW, 8, kv::LOGITS]),
        ]
    );
    assert_eq!(forward.operators[1].to_string(), "aten::clone.out");
    assert_eq!(forward.operators[0].to_string(), "aten::copy_");

    let buffers = forward.mutable_buffers();
    assert_eq!(buffers.len(), 2);
    assert_eq!(buffers[0].value, kv::K_CACHE);
    assert_eq!(buffers[0].name, Some("k_cache"));
    assert_eq!(buffers[0].allocation, Allocation { mem_id: 2, offset: 0 });
    assert_eq!(buffers[0].data_buffer_idx, 0);
    assert_eq!(buffers[0].write_backs.len(), 1);
    assert_eq!(buffers[0].write_backs[0].at.to_string(), "chains[0].instructions[1]");
    assert_eq!(buffers[0].write_backs[0].src, Some(kv::K_NEW));
    assert_eq!((buffers[1].value, buffers[1].name), (kv::V_CACHE, Some("v_cache")));
    assert_eq!(buffers[1].allocation, Allocation { mem_id: 2, offset: 1024 });
}

/// A one-method program with the given values and instructions and no delegates.
fn method(
    values: Vec<ValueSpec>,
    inputs: Vec<i32>,
    instructions: Vec<InstructionSpec>,
) -> testing::ProgramSpec {
    testing::ProgramSpec {
        methods: vec![MethodSpec {
            name: "forward".into(),
            values,
            inputs,
            outputs: vec![],
            operators: vec![("aten::copy_".into(), "".into()), ("aten::add".into(), "out".into())],
            instructions,
            ..Default::default()
        }],
        ..Default::default()
    }
}

#[test]
fn mutable_buffer_rule_named_or_written_back_planned_non_io_tensors() {
    use ScalarType::Float;
    let planned = |offset| ValueSpec::Tensor(TensorSpec::planned(Float, &[4], 1, offset));
    let values = vec![
        planned(0),  // 0: method input, written back
        planned(16), // 1: unnamed, written back: buffer
        ValueSpec::Tensor(TensorSpec::planned(Float, &[4], 1, 32).named("state")), // 2: named: buffer
        planned(48), // 3: planned, not named or written
        ValueSpec::Tensor(TensorSpec {
            allocation: None,
            ..TensorSpec::planned(Float, &[4], 0, 0).named("w")
        }), // 4: named constant
        planned(64), // 5: the source
        ValueSpec::Tensor(TensorSpec {
            data_buffer_idx: 1,
            ..TensorSpec::planned(Float, &[4], 1, 80).named("init")
        }), // 6: initialised buffer
    ];
    let instructions = vec![
        InstructionSpec::Kernel { op: 0, args: vec![0, 5] },
        InstructionSpec::Kernel { op: 0, args: vec![1, 5] },
        InstructionSpec::Kernel { op: 1, args: vec![3, 5, 3] },
        InstructionSpec::Kernel { op: 0, args: vec![1] },
    ];
    let bytes = method(values, vec![0], instructions).to_bytes();
    let program = Program::parse(&bytes).expect("reads");
    assert!(program.extended_header.is_none(), "no segment data, no header");
    let buffers = program.methods[0].mutable_buffers();
    let summary: Vec<_> = buffers
        .iter()
        .map(|b| {
            (
                b.value,
                b.name,
                b.data_buffer_idx,
                b.write_backs.iter().map(|w| (w.at.instruction, w.src)).collect::<Vec<_>>(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (1, None, 0, vec![(1, Some(5)), (3, None)]),
            (2, Some("state"), 0, vec![]),
            (6, Some("init"), 1, vec![]),
        ]
    );
}

#[test]
fn inline_delegate_data_is_borrowed_from_the_flatbuffer() {
    let mut spec = testing::kv_decoder_spec(b"");
    spec.segments = vec![Vec::new()];
    spec.inline_data = vec![b"first".to_vec(), common::kv_blob()];
    spec.methods[0].delegates[0] = DelegateSpec {
        id: "TensorRTBackend".into(),
        location: DataLocation::Inline,
        index: 1,
        compile_specs: vec![],
    };
    let bytes = spec.to_bytes();
    let program = Program::parse(&bytes).expect("reads");
    assert!(program.extended_header.is_none(), "only an empty segment: no segment data, no header");
    assert_eq!(program.segments.len(), 1);
    let processed = program.methods[0].delegates[0].processed;
    assert_eq!((processed.location, processed.index), (DataLocation::Inline, 1));
    assert_eq!(processed.data, common::kv_blob().as_slice());
    assert_borrowed(&bytes, processed.data, processed.offset);
    assert!(processed.offset < program.program_size);
    let range = processed.range();
    assert_eq!(&bytes[range.start as usize..range.end as usize], processed.data);
    assert_eq!(processed.label(), "inline 1");
    Blob::parse(processed.data).expect("the inline payload is a blob");
}

#[test]
fn two_methods_share_buffers_by_mem_id() {
    let mut spec = testing::kv_decoder_spec(&common::kv_blob());
    let mut prefill = spec.methods[0].clone();
    prefill.name = "prefill".into();
    if let ValueSpec::Tensor(t) = &mut prefill.values[kv::TOKENS] {
        t.sizes = vec![1, 4];
    }
    spec.methods.insert(0, prefill);
    spec.methods[1].name = "decode".into();
    spec.methods[1].delegates[0].index = 2;
    spec.segments.push(common::kv_blob());
    let bytes = spec.to_bytes();
    let program = Program::parse(&bytes).expect("reads");
    let names: Vec<_> = program.methods.iter().map(|m| m.name).collect();
    assert_eq!(names, ["prefill", "decode"]);
    assert_eq!(program.segments[2].offset % 128, 0, "every segment aligned");
    assert_ne!(program.segments[1].offset, program.segments[2].offset);
    assert_eq!(
        program.method("prefill").and_then(|m| m.tensor(kv::TOKENS)).map(|t| t.sizes.clone()),
        Some(vec![1, 4])
    );
    let shared = |m: &str| -> Vec<_> {
        program.method(m).expect("method").mutable_buffers().iter().map(|b| (b.name, b.allocation)).collect()
    };
    assert_eq!(shared("prefill"), shared("decode"));
}

#[test]
fn every_value_and_instruction_kind_reads() {
    let values = vec![
        ValueSpec::Int(7),
        ValueSpec::Double(0.5),
        ValueSpec::String("mean".into()),
        ValueSpec::IntList(vec![0, 0]),
        ValueSpec::TensorList(vec![5, 5]),
        ValueSpec::Tensor(TensorSpec::planned(ScalarType::BFloat16, &[2, 3], 1, (1 << 32) + 8)),
        ValueSpec::OptionalTensorList(vec![5, -1]),
        ValueSpec::Bool(true),
        ValueSpec::RawKind(200),
    ];
    let instructions = vec![
        InstructionSpec::JumpFalse { cond: 7, destination: 2 },
        InstructionSpec::Move { from: 5, to: 5 },
        InstructionSpec::Free { value: 5 },
    ];
    let bytes = method(values, vec![], instructions).to_bytes();
    let program = Program::parse(&bytes).expect("reads");
    let m = &program.methods[0];
    assert_eq!(m.values[0], Value::Int(7));
    assert_eq!(m.values[1], Value::Double(0.5));
    assert_eq!(m.values[2], Value::String("mean"));
    assert_eq!(m.values[3], Value::IntList(vec![0, 0]));
    assert_eq!(m.values[4], Value::TensorList(vec![5, 5]));
    assert_eq!(m.values[6], Value::OptionalTensorList(vec![Some(5), None]));
    assert_eq!(m.values[8], Value::Unknown { kind: 200 });
    let t = m.tensor(5).expect("tensor");
    assert_eq!(
        t.allocation,
        Some(Allocation { mem_id: 1, offset: (1 << 32) + 8 }),
        "high and low words combine"
    );
    assert_eq!((t.scalar_type.name(), t.nbytes()), ("BFloat16", Some(12)));
    assert_eq!(
        m.chains[0].instructions,
        [
            Instruction::JumpFalse { condition: 7, destination: 2 },
            Instruction::Move { from: 5, to: 5 },
            Instruction::Free { value: 5 },
        ]
    );
    assert!(m.mutable_buffers().is_empty());
}

#[test]
fn identifiers_and_detection() {
    let bytes = common::kv_pte();
    assert!(pte_format::is_program(&bytes));
    let mut future = bytes.clone();
    future[4..8].copy_from_slice(b"ET13");
    assert!(pte_format::is_program(&future), "any ExecuTorch container version is a program");
    assert!(matches!(Program::parse(&future), Err(Error::UnsupportedIdentifier { .. })));
    assert!(!pte_format::is_program(&common::kv_blob()), "a native blob is not");
    assert!(!pte_format::is_program(b"ET12"), "too short to hold the identifier at 4..8");
}
