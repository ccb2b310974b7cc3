//! Every malformed or unreadable blob gets a typed error with the right ExecuTorch code and a message that
//! names the problem. Data-driven: one case per line, all messages in one reviewed snapshot.

mod common;

use blob_format::{detect, native, upstream, Blob, Error};
use et_error::HasErrorCode;
use xxhash_rust::xxh3::xxh3_64;

/// A valid native blob, the start of its header, and its header length.
fn native_blob() -> (Vec<u8>, usize, usize) {
    let bytes = native::to_vec(&common::tr02_fixture_header(), &common::engine_bytes(300));
    let header_offset = u32::from_le_bytes(bytes[12..16].try_into().expect("4 bytes")) as usize;
    let header_len = u32::from_le_bytes(bytes[16..20].try_into().expect("4 bytes")) as usize;
    (bytes, header_offset, header_len)
}

/// Re-stamps the header checksum after a test edited header bytes.
fn rehash(bytes: &mut [u8], header_offset: usize, header_len: usize) {
    let sum = xxh3_64(&bytes[header_offset..header_offset + header_len]);
    bytes[24..32].copy_from_slice(&sum.to_le_bytes());
}

/// Replaces a u64 the header records (found by its unique value: the payload offset 512 or size 300) with
/// `value`, keeping the checksum valid.
fn with_header_u64(old: u64, value: u64) -> Vec<u8> {
    let (mut bytes, header_offset, header_len) = native_blob();
    let header = &mut bytes[header_offset..header_offset + header_len];
    let hits: Vec<_> = header.windows(8).enumerate().filter(|(_, w)| *w == old.to_le_bytes()).collect();
    assert_eq!(hits.len(), 1, "{old} occurs once in the header");
    let at = hits[0].0;
    header[at..at + 8].copy_from_slice(&value.to_le_bytes());
    rehash(&mut bytes, header_offset, header_len);
    bytes
}

/// A TR blob with explicit prefix fields.
fn tr(
    magic: &[u8; 4],
    metadata_offset: u32,
    json: &[u8],
    engine_offset: Option<u32>,
    engine_size: u64,
) -> Vec<u8> {
    let metadata_end = metadata_offset as usize + json.len();
    let engine_offset = engine_offset.unwrap_or(metadata_end.div_ceil(16) as u32 * 16);
    let mut out = Vec::new();
    out.extend_from_slice(magic);
    out.extend_from_slice(&metadata_offset.to_le_bytes());
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    out.extend_from_slice(&engine_offset.to_le_bytes());
    out.extend_from_slice(&engine_size.to_le_bytes());
    out.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0]);
    out.resize(metadata_offset.max(32) as usize, 0);
    out.extend_from_slice(json);
    out.resize(out.len().max(engine_offset as usize), 0);
    out.extend(std::iter::repeat_n(0xAB, engine_size.min(64) as usize));
    out
}

fn tr_json(json: &str) -> Vec<u8> {
    tr(b"TR02", 32, json.as_bytes(), None, 8)
}

/// Parses `bytes` and renders the refusal as `case: [code] message`; panics if it parses.
fn check(case: &str, bytes: &[u8]) -> String {
    let err: Error = match Blob::parse(bytes) {
        Ok(blob) => panic!("{case}: parsed, expected an error: {blob:?}"),
        Err(err) => err,
    };
    format!("{case}: [{}] {err}", err.error_code())
}

#[test]
fn malformed_blobs() {
    let (valid, header_offset, header_len) = native_blob();
    let mut cases = vec![
        check("empty", b""),
        check("truncated native magic", &native::MAGIC[..5]),
        check("truncated native version", &valid[..10]),
        check("truncated native prefix", &valid[..20]),
        check("truncated TR magic", b"TR"),
        check("bad magic", b"\x89DLX\r\n\x1a\n and more bytes here"),
        check("torch-tensorrt 2.12 layout (no magic)", &[2, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0]),
        check("future upstream TR03", &tr(b"TR03", 32, b"{}", None, 0)),
    ];

    let mut newer = valid.clone();
    newer[8..10].copy_from_slice(&2u16.to_le_bytes());
    cases.push(check("newer native major", &newer));
    let mut zero = valid.clone();
    zero[8..10].copy_from_slice(&0u16.to_le_bytes());
    cases.push(check("native major 0", &zero));
    let mut header = common::tr02_fixture_header();
    header.device_id = -1;
    cases.push(check("native negative device_id", &native::to_vec(&header, &common::engine_bytes(300))));

    let mut flipped = valid.clone();
    flipped[header_offset + header_len - 1] ^= 0x40;
    cases.push(check("header checksum mismatch", &flipped));
    let mut inside = valid.clone();
    inside[12..16].copy_from_slice(&8u32.to_le_bytes());
    cases.push(check("header offset inside the prefix", &inside));
    let mut long = valid.clone();
    long[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
    cases.push(check("header length past the end", &long));
    let mut garbage = valid.clone();
    garbage[header_offset + 8..header_offset + header_len].fill(0xFF);
    rehash(&mut garbage, header_offset, header_len);
    cases.push(check("header fails flatbuffers verification", &garbage));
    let mut no_id = valid.clone();
    no_id[header_offset + 4..header_offset + 8].copy_from_slice(b"XXXX");
    rehash(&mut no_id, header_offset, header_len);
    cases.push(check("header without file identifier", &no_id));
    let mut tiny = valid[..32].to_vec();
    tiny[16..20].copy_from_slice(&0u32.to_le_bytes());
    tiny[24..32].copy_from_slice(&xxh3_64(b"").to_le_bytes());
    cases.push(check("empty header", &tiny));

    assert_eq!(Blob::parse(&valid).expect("valid").engine_offset(), 512);
    cases.push(check("payload extent overflow", &with_header_u64(300, u64::MAX)));
    cases.push(check("payload offset past the end", &with_header_u64(512, 1 << 40)));
    cases.push(check("payload offset misaligned", &with_header_u64(512, 257)));
    cases.push(check("payload inside the header", &with_header_u64(512, 0)));
    cases.push(check("payload out of bounds (truncated engine)", &valid[..valid.len() - 1]));

    cases.push(check("truncated TR prefix", &tr_json("{}")[..20]));
    cases.push(check("TR metadata offset inside the prefix", &tr(b"TR02", 8, b"{}", Some(48), 0)));
    cases.push(check("TR metadata past the end", &tr_json("{\"io_bindings\":[]}")[..40]));
    cases
        .push(check("TR engine before metadata end", &tr(b"TR01", 32, b"{\"io_bindings\":[]}", Some(40), 4)));
    cases.push(check(
        "TR engine extent overflow",
        &tr(b"TR01", 32, b"{\"io_bindings\":[]}", Some(64), u64::MAX),
    ));
    let mut cut = tr_json("{\"io_bindings\":[]}");
    cut.pop();
    cases.push(check("TR engine out of bounds", &cut));
    cases.push(check("TR bad JSON", &tr_json("{\"io_bindings\":[")));
    cases.push(check("TR bad UTF-8", &tr(b"TR02", 32, b"{\"io_bindings\":[{\"name\":\"\xff\"}]}", None, 0)));
    cases.push(check("TR missing io_bindings", &tr_json("{\"aliased_io\":[]}")));
    cases.push(check(
        "TR wrong type: is_input",
        &tr_json(r#"{"io_bindings":[{"name":"a","is_input":"yes"}]}"#),
    ));
    cases.push(check("TR wrong type: device_id", &tr_json(r#"{"io_bindings":[],"device_id":"0"}"#)));
    cases.push(check("TR wrong type: aliased_io", &tr_json(r#"{"io_bindings":[],"aliased_io":{}}"#)));
    cases.push(check("TR duplicate key", &tr_json(r#"{"io_bindings":[],"io_bindings":[]}"#)));
    cases.push(check("TR device_id out of range", &tr_json(r#"{"io_bindings":[],"device_id":4294967296}"#)));
    cases.push(check("TR negative device_id", &tr_json(r#"{"io_bindings":[],"device_id":-1}"#)));
    // Valid JSON, but more of it than a reader parses (a 35 MB TR02 with a million bindings took 8.7 s).
    let huge = format!("{{\"io_bindings\":[]{}}}", " ".repeat(upstream::MAX_METADATA_BYTES as usize));
    cases.push(check("TR metadata too large", &tr_json(&huge)));
    cases.push(check(
        "TR unknown dtype",
        &tr_json(r#"{"io_bindings":[{"name":"a","dtype":"float8","is_input":true}]}"#),
    ));
    cases.push(check(
        "TR negative extent",
        &tr_json(r#"{"io_bindings":[{"name":"a","shape":[2,-3],"is_input":true}]}"#),
    ));
    cases.push(check("TR top level not an object", &tr_json("[]")));

    insta::assert_snapshot!(cases.join("\n"));
}

#[test]
fn detect_reports_versions_it_cannot_read() {
    let (mut bytes, _, _) = native_blob();
    assert_eq!(detect(&bytes).expect("native"), blob_format::model::Format::Native { major: 1, minor: 0 });
    bytes[8..12].copy_from_slice(&[3, 0, 1, 0]);
    assert_eq!(detect(&bytes).expect("native"), blob_format::model::Format::Native { major: 3, minor: 1 });
    assert!(matches!(Blob::parse(&bytes), Err(Error::NewerMajor { major: 3, minor: 1 })));
    assert_eq!(detect(b"TR01").expect("TR01"), blob_format::model::Format::Tr01);
    assert_eq!(detect(b"TR02....").expect("TR02"), blob_format::model::Format::Tr02);
}
