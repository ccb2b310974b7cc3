//! The committed fixtures: the builder's are current, and ExecuTorch 1.5.1's own serializer writes a file
//! that reads to the same program as the builder's.

mod common;

use std::path::PathBuf;

use pte_format::Program;

fn fixture(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    std::fs::read(&path).unwrap_or_else(|err| panic!("reading {}: {err}", path.display()))
}

#[test]
fn builder_fixtures_are_current() {
    let hint = "run `cargo run -p pte-format --features testing --example write_fixtures`";
    assert!(fixture("kv_blob.blob") == common::kv_blob(), "kv_blob.blob is stale: {hint}");
    assert!(fixture("kv_decoder.pte") == common::kv_pte(), "kv_decoder.pte is stale: {hint}");
}

#[test]
fn executorch_written_program_reads_like_the_builders() {
    let et_bytes = fixture("et_1_5_1_kv_decoder.pte");
    let ours_bytes = common::kv_pte();
    let et = Program::parse(&et_bytes).expect("ExecuTorch's file reads");
    let ours = Program::parse(&ours_bytes).expect("the builder's file reads");

    let header = et.extended_header.expect("ExecuTorch inserts the extended header");
    assert_eq!(header.length, 32);
    assert_eq!(header.segment_base_offset % 128, 0);
    assert_eq!(header.segment_base_offset + header.segment_data_size, et_bytes.len() as u64);
    assert_eq!(et.version, ours.version);

    let data = |p: &Program<'_>| p.segments.iter().map(|s| s.data.to_vec()).collect::<Vec<_>>();
    assert_eq!(data(&et), data(&ours));
    assert_eq!(et.segments[1].data, common::kv_blob().as_slice());
    assert_eq!(et.segments[1].offset, header.segment_base_offset);

    let (a, b) = (&et.methods[0], &ours.methods[0]);
    assert_eq!(a.name, b.name);
    assert_eq!(a.values, b.values);
    assert_eq!((&a.inputs, &a.outputs), (&b.inputs, &b.outputs));
    assert_eq!(a.chains, b.chains);
    assert_eq!(a.operators, b.operators);
    assert_eq!(a.non_const_buffer_sizes, b.non_const_buffer_sizes);
    assert_eq!(a.delegates.len(), 1);
    let (da, db) = (&a.delegates[0], &b.delegates[0]);
    assert_eq!((da.id, &da.compile_specs), (db.id, &db.compile_specs));
    assert_eq!((da.processed.location, da.processed.index), (db.processed.location, db.processed.index));
    assert_eq!(da.processed.data, db.processed.data);
    assert_eq!(a.mutable_buffers(), b.mutable_buffers());
    assert_eq!(a.mutable_buffers().len(), 2);
}

#[test]
fn executorch_writes_the_empty_constant_segment_first() {
    let bytes = fixture("et_1_5_1_kv_decoder.pte");
    let program = Program::parse(&bytes).expect("reads");
    let constants = program.constant_segment.expect("constant_segment");
    assert_eq!((constants.segment_index, constants.offsets), (0, vec![0]));
    assert!(program.segments[0].data.is_empty());
    assert_eq!(program.methods[0].delegates[0].processed.index, 1, "the delegate payload is segment 1");
}
