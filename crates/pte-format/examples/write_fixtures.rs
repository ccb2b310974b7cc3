//! Writes the committed test fixtures and fuzz seeds:
//!
//! - `tests/fixtures/kv_blob.blob`: the native blob the KV decoder's delegate carries (`tests/common`);
//! - `tests/fixtures/kv_decoder.pte`: [`pte_format::testing::kv_decoder`] around that blob;
//! - `fuzz/corpus/pte/*.pte`: seeds for the `pte` fuzz target (the fixtures, variants reaching the other
//!   code paths, and a few refused files).
//!
//! `tests/fixtures/et_1_5_1_kv_decoder.pte` is the same program written by ExecuTorch 1.5.1's own
//! serializer; `tests/fixtures/README.md` says how to regenerate it from `kv_blob.blob`.
//!
//! Run: `cargo run -p pte-format --features testing --example write_fixtures`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::Path;

use pte_format::model::{DataLocation, ScalarType};
use pte_format::testing::{self, InstructionSpec, MethodSpec, ProgramSpec, TensorSpec, ValueSpec};

fn main() -> std::io::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let fixtures = root.join("tests/fixtures");
    let seeds = root.join("fuzz/corpus/pte");
    std::fs::create_dir_all(&fixtures)?;
    std::fs::create_dir_all(&seeds)?;
    std::fs::write(fixtures.join("kv_blob.blob"), common::kv_blob())?;
    std::fs::write(fixtures.join("kv_decoder.pte"), common::kv_pte())?;

    let kv = common::kv_pte();
    let mut files: Vec<(&str, Vec<u8>)> = vec![
        ("kv_decoder.pte", kv.clone()),
        ("et_1_5_1_kv_decoder.pte", std::fs::read(fixtures.join("et_1_5_1_kv_decoder.pte"))?),
        ("inline_delegate.pte", inline_delegate()),
        ("two_methods.pte", two_methods()),
        ("every_kind_no_header.pte", every_kind()),
    ];
    // A 24-byte extended header (no segment data size): segments are bounded by the file.
    let mut short_header = kv.clone();
    common::set_u32(&mut short_header, 12, 24);
    files.push(("header_24_bytes.pte", short_header));
    files.push(("refused_truncated_segment.pte", kv[..kv.len() - 1].to_vec()));
    files.push(("refused_no_header_with_segments.pte", common::strip_header(&kv)));
    for (name, bytes) in &files {
        std::fs::write(seeds.join(name), bytes)?;
    }
    println!("wrote the fixtures to {} and {} seeds to {}", fixtures.display(), files.len(), seeds.display());
    Ok(())
}

fn inline_delegate() -> Vec<u8> {
    let mut spec = testing::kv_decoder_spec(b"");
    spec.segments = vec![Vec::new()];
    spec.inline_data = vec![common::kv_blob()];
    spec.methods[0].delegates[0].location = DataLocation::Inline;
    spec.methods[0].delegates[0].index = 0;
    spec.to_bytes()
}

fn two_methods() -> Vec<u8> {
    let mut spec = testing::kv_decoder_spec(&common::kv_blob());
    let mut prefill = spec.methods[0].clone();
    prefill.name = "prefill".into();
    prefill.delegates[0].index = 2;
    spec.methods[0].name = "decode".into();
    spec.methods.push(prefill);
    spec.segments.push(common::kv_blob());
    spec.named_data = vec![("shared".into(), 2)];
    spec.to_bytes()
}

fn every_kind() -> Vec<u8> {
    ProgramSpec {
        methods: vec![MethodSpec {
            name: "forward".into(),
            values: vec![
                ValueSpec::Int(7),
                ValueSpec::Double(0.5),
                ValueSpec::String("mean".into()),
                ValueSpec::IntList(vec![0, 0]),
                ValueSpec::TensorList(vec![5]),
                ValueSpec::Tensor(TensorSpec::planned(ScalarType::Half, &[2, 3], 1, 8).named("state")),
                ValueSpec::OptionalTensorList(vec![5, -1]),
                ValueSpec::Bool(true),
                ValueSpec::Null,
            ],
            inputs: vec![0],
            outputs: vec![5],
            operators: vec![("aten::copy_".into(), String::new())],
            instructions: vec![
                InstructionSpec::JumpFalse { cond: 7, destination: 2 },
                InstructionSpec::Move { from: 5, to: 5 },
                InstructionSpec::Free { value: 5 },
                InstructionSpec::Kernel { op: 0, args: vec![5, 5] },
            ],
            ..Default::default()
        }],
        segments: vec![Vec::new()],
        constant_segment: Some((0, vec![0])),
        ..Default::default()
    }
    .to_bytes()
}
