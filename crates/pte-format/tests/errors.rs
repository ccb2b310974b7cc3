//! Every malformed or unreadable `.pte` gets a typed error with the right ExecuTorch code and a message that
//! names the field, index or offset. Data-driven: one case per line, all messages in one reviewed snapshot.

mod common;

use common::{kv_pte, patch_program_u64, set_u32, set_u64, strip_header, u64_at};
use et_error::HasErrorCode;
use pte_format::model::DataLocation;
use pte_format::testing::{self, InstructionSpec, ProgramSpec, ValueSpec};
use pte_format::Program;

/// Parses `bytes` and renders the refusal as `case: [code] message`; panics if it parses.
fn check(case: &str, bytes: &[u8]) -> String {
    match Program::parse(bytes) {
        Ok(program) => panic!("{case}: parsed, expected an error: {program:?}"),
        Err(err) => format!("{case}: [{}] {err}", err.error_code()),
    }
}

/// The KV decoder's spec with one change.
fn kv_with(change: impl FnOnce(&mut ProgramSpec)) -> Vec<u8> {
    let mut spec = testing::kv_decoder_spec(&common::kv_blob());
    change(&mut spec);
    spec.to_bytes()
}

#[test]
fn malformed_programs() {
    let valid = kv_pte();
    Program::parse(&valid).expect("the base case reads");
    let program_size = u64_at(&valid, 16);
    let base = u64_at(&valid, 24);
    let blob_len = common::kv_blob().len() as u64;
    let mut cases = vec![
        check("empty", b""),
        check("truncated identifier", &valid[..6]),
        check("identifier only", &valid[..8]),
        check("truncated extended header", &valid[..20]),
    ];

    let mut wrong = valid.clone();
    wrong[4..8].copy_from_slice(b"TFL3");
    cases.push(check("wrong identifier (a TFLite model)", &wrong));
    let mut future = valid.clone();
    future[4..8].copy_from_slice(b"ET13");
    cases.push(check("future container version", &future));

    let mut short = valid.clone();
    set_u32(&mut short, 12, 16);
    cases.push(check("header length below its fields", &short));
    let mut huge = valid.clone();
    set_u32(&mut huge, 12, u32::MAX);
    cases.push(check("header length past the program", &huge));
    let mut big = valid.clone();
    set_u64(&mut big, 16, valid.len() as u64 + 1);
    cases.push(check("program_size past the end", &big));
    let mut small = valid.clone();
    set_u64(&mut small, 16, 39);
    cases.push(check("program_size inside the header", &small));
    let mut tiny = valid.clone();
    set_u64(&mut tiny, 16, 64);
    cases.push(check("program_size cuts the flatbuffer", &tiny));
    let mut inside = valid.clone();
    set_u64(&mut inside, 24, program_size - 8);
    cases.push(check("segment base inside the program data", &inside));
    let mut past = valid.clone();
    set_u64(&mut past, 24, valid.len() as u64 + 128);
    cases.push(check("segment base past the end", &past));
    let mut data = valid.clone();
    set_u64(&mut data, 32, u64_at(&valid, 32) + 1);
    cases.push(check("segment data size past the end", &data));
    let mut overflow = valid.clone();
    set_u64(&mut overflow, 32, u64::MAX);
    cases.push(check("segment data size overflows", &overflow));
    cases.push(check("truncated segment data", &valid[..valid.len() - 1]));

    let mut grown = valid.clone();
    patch_program_u64(&mut grown, blob_len, blob_len + 1);
    cases.push(check("segment extent past the segment data", &grown));
    let mut far = valid.clone();
    patch_program_u64(&mut far, blob_len, u64::MAX - base + 1);
    cases.push(check("segment extent overflows", &far));
    // A 24-byte header has no segment data size: segments are bounded by the file.
    let mut old_header = valid.clone();
    set_u32(&mut old_header, 12, 24);
    old_header.pop();
    cases.push(check("segment past the end of the file (24-byte header)", &old_header));
    cases.push(check("segments without an extended header", &strip_header(&valid)));

    let mut garbage = valid.clone();
    garbage[40..program_size as usize].fill(0xFF);
    cases.push(check("flatbuffer fails verification", &garbage));
    let mut root = valid.clone();
    set_u32(&mut root, 0, 4096);
    cases.push(check("root offset past the program data", &root));

    cases.push(check("newer schema version", &kv_with(|s| s.version = 1)));
    cases.push(check(
        "delegate index out of range",
        &kv_with(|s| {
            s.methods[0].instructions[0] = InstructionSpec::Delegate { delegate: 3, args: vec![0] };
        }),
    ));
    cases.push(check(
        "DelegateCall arg out of range",
        &kv_with(|s| {
            s.methods[0].instructions[0] = InstructionSpec::Delegate { delegate: 0, args: vec![0, 99] };
        }),
    ));
    cases.push(check(
        "operator index out of range",
        &kv_with(|s| {
            s.methods[0].instructions[3] = InstructionSpec::Kernel { op: 9, args: vec![] };
        }),
    ));
    cases.push(check(
        "negative KernelCall arg",
        &kv_with(|s| {
            s.methods[0].instructions[1] = InstructionSpec::Kernel { op: 0, args: vec![2, -1] };
        }),
    ));
    cases.push(check(
        "jump past the chain",
        &kv_with(|s| {
            s.methods[0].instructions[3] = InstructionSpec::JumpFalse { cond: 9, destination: 4 };
        }),
    ));
    cases.push(check(
        "move from a missing value",
        &kv_with(|s| {
            s.methods[0].instructions[3] = InstructionSpec::Move { from: 10, to: 0 };
        }),
    ));
    cases.push(check(
        "free of a missing value",
        &kv_with(|s| {
            s.methods[0].instructions[3] = InstructionSpec::Free { value: -7 };
        }),
    ));
    cases.push(check("method input out of range", &kv_with(|s| s.methods[0].inputs = vec![0, 42])));
    cases.push(check("method output out of range", &kv_with(|s| s.methods[0].outputs = vec![10])));
    cases.push(check("delegate segment out of range", &kv_with(|s| s.methods[0].delegates[0].index = 7)));
    cases.push(check(
        "inline delegate data out of range",
        &kv_with(|s| {
            s.methods[0].delegates[0].location = DataLocation::Inline;
        }),
    ));
    cases.push(check("constant segment out of range", &kv_with(|s| s.constant_segment = Some((9, vec![0])))));
    cases.push(check("named data segment out of range", &kv_with(|s| s.named_data = vec![("w".into(), 5)])));
    cases.push(check(
        "TensorList item out of range",
        &kv_with(|s| {
            s.methods[0].values.push(ValueSpec::TensorList(vec![0, 11]));
        }),
    ));
    cases.push(check(
        "IntList item out of range",
        &kv_with(|s| {
            s.methods[0].values.push(ValueSpec::IntList(vec![-3]));
        }),
    ));
    cases.push(check(
        "OptionalTensorList item below -1",
        &kv_with(|s| {
            s.methods[0].values.push(ValueSpec::OptionalTensorList(vec![-1, -2]));
        }),
    ));
    cases.push(check("value without a kind", &kv_with(|s| s.methods[0].values.push(ValueSpec::RawKind(0)))));

    insta::assert_snapshot!(cases.join("\n"));
}

#[test]
fn codes_separate_unsupported_versions_from_malformed_files() {
    use et_error::ErrorCode;
    let valid = kv_pte();
    let code = |bytes: &[u8]| Program::parse(bytes).expect_err("refused").error_code();
    let mut future = valid.clone();
    future[4..8].copy_from_slice(b"ET99");
    assert_eq!(code(&future), ErrorCode::NotSupported);
    assert_eq!(code(&kv_with(|s| s.version = 7)), ErrorCode::NotSupported);
    let mut other = valid.clone();
    other[4..8].copy_from_slice(b"DLBH");
    assert_eq!(code(&other), ErrorCode::InvalidProgram);
    assert_eq!(code(&valid[..valid.len() - 1]), ErrorCode::InvalidProgram);
}
