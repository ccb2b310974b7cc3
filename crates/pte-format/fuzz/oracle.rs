//! What every fuzz input must satisfy, shared by the fuzz target and by the main crate's
//! `tests/fuzz_corpus.rs` and `tests/mutation.rs`, which replay inputs on stable Rust.
//!
//! Beyond "no panic, no hang, no out-of-bounds read": an accepted program borrows every payload from the
//! input at the offset it reports, every index it hands out is inside its table, the mutable buffers follow
//! the documented rule, and reading is deterministic.

#![allow(dead_code)]

use pte_format::model::{Instruction, Value};
use pte_format::Program;

/// Asserts that a non-empty `part` lies inside `data` at `offset`.
fn assert_borrowed(data: &[u8], part: &[u8], offset: u64, what: &str) {
    if part.is_empty() {
        return;
    }
    let start = (part.as_ptr() as usize).wrapping_sub(data.as_ptr() as usize);
    assert_eq!(start as u64, offset, "{what} is borrowed at its reported offset");
    assert!(start.checked_add(part.len()).is_some_and(|end| end <= data.len()), "{what} inside the input");
}

/// Parses `data`; when it reads, checks every invariant of the result. Returns whether it read.
pub fn check_pte(data: &[u8]) -> bool {
    let Ok(program) = Program::parse(data) else { return false };
    let file_len = data.len() as u64;
    assert!(program.program_size <= file_len);
    if let Some(header) = program.extended_header {
        assert!(header.length >= 24);
        assert_eq!(header.program_size, program.program_size);
    }
    for (i, segment) in program.segments.iter().enumerate() {
        assert_borrowed(data, segment.data, segment.offset, &format!("segments[{i}]"));
        if !segment.data.is_empty() {
            assert!(segment.offset >= program.program_size, "segments[{i}] after the program data");
        }
    }
    for sub in program.constant_segment.iter().chain(&program.mutable_data_segments) {
        assert!(sub.segment_index < program.segments.len());
    }
    for named in &program.named_data {
        assert!(named.segment_index < program.segments.len());
    }
    for method in &program.methods {
        let n = method.values.len();
        assert!(method.inputs.iter().chain(&method.outputs).all(|&v| v < n));
        for value in &method.values {
            match value {
                Value::IntList(items) | Value::TensorList(items) => assert!(items.iter().all(|&v| v < n)),
                Value::OptionalTensorList(items) => assert!(items.iter().flatten().all(|&v| v < n)),
                _ => {}
            }
        }
        for delegate in &method.delegates {
            assert_borrowed(data, delegate.processed.data, delegate.processed.offset, delegate.id);
            let range = delegate.processed.range();
            assert_eq!(data.get(range.start as usize..range.end as usize), Some(delegate.processed.data));
        }
        for chain in &method.chains {
            assert!(chain.inputs.iter().chain(&chain.outputs).all(|&v| v < n));
            for instruction in &chain.instructions {
                match instruction {
                    Instruction::Kernel(call) => {
                        let op = method.operators[call.operator];
                        assert_eq!((op.name, op.overload), (call.name, call.overload));
                        assert!(call.args.iter().all(|&v| v < n));
                    }
                    Instruction::Delegate(call) => {
                        assert!(call.delegate < method.delegates.len());
                        assert!(call.args.iter().all(|&v| v < n));
                    }
                    Instruction::Move { from, to } => assert!(*from < n && *to < n),
                    Instruction::JumpFalse { condition, destination } => {
                        assert!(*condition < n && *destination < chain.instructions.len());
                    }
                    Instruction::Free { value } => assert!(*value < n),
                    _ => {}
                }
            }
        }
        for buffer in method.mutable_buffers() {
            let tensor = method.tensor(buffer.value).expect("a mutable buffer is a tensor");
            assert_eq!(tensor.allocation, Some(buffer.allocation));
            assert!(!method.inputs.contains(&buffer.value) && !method.outputs.contains(&buffer.value));
            assert!(buffer.name.is_some() || !buffer.write_backs.is_empty());
        }
    }
    // Compared through `Debug`: a `Double` value may be NaN, which `PartialEq` never finds equal.
    let debug = format!("{program:?}");
    let again = Program::parse(data).map(|p| format!("{p:?}"));
    assert_eq!(again.as_ref(), Ok(&debug), "reading is deterministic");
    check_prefix(data, &program);
    true
}

/// The program read from its first bytes only (what `delegate-host inspect` reads) is the program read
/// whole, each payload located and sized the same and holding a prefix of its bytes.
fn check_prefix(data: &[u8], program: &Program<'_>) {
    let file_len = data.len() as u64;
    let first = &data[..data.len().min(pte_format::PROGRAM_EXTENT_BYTES)];
    let extent = pte_format::program_extent(first, file_len).expect("an accepted program has its extent");
    assert_eq!(extent, program.program_size);
    let head = &data[..usize::try_from(extent).expect("inside the input")];
    let prefix = Program::parse_prefix(head, file_len).expect("the program data reads alone");
    assert_eq!(prefix.segments.len(), program.segments.len());
    for (cut, whole) in prefix.segments.iter().zip(&program.segments) {
        assert_eq!((cut.offset, cut.size), (whole.offset, whole.size));
        assert_eq!(whole.size, whole.data.len() as u64, "a whole read holds every byte");
        assert!(whole.data.starts_with(cut.data));
    }
    assert_eq!(prefix.methods.len(), program.methods.len());
    for (cut, whole) in prefix.methods.iter().zip(&program.methods) {
        assert_eq!(format!("{:?}", cut.values), format!("{:?}", whole.values));
        for (c, w) in cut.delegates.iter().zip(&whole.delegates) {
            let (c, w) = (&c.processed, &w.processed);
            assert_eq!((c.location, c.index, c.offset, c.size), (w.location, w.index, w.offset, w.size));
            assert!(w.data.starts_with(c.data));
        }
    }
}
