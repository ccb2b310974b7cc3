//! What every fuzz input must satisfy, shared by the fuzz targets and by the main crate's
//! `tests/fuzz_corpus.rs`, which replays the committed corpus on stable Rust.
//!
//! Beyond "no panic, no hang, no out-of-bounds read", an accepted blob must have its engine inside the
//! input at `engine_offset`, and re-writing its model must read back to the same model and engine.

#![allow(dead_code)] // each fuzz target uses one of the checks

use blob_format::{detect, native, upstream, Blob};

/// Invariants of any successfully parsed blob.
fn check_blob(data: &[u8], blob: &Blob<'_>) {
    let offset = usize::try_from(blob.engine_offset()).expect("engine offset fits usize");
    let end = offset.checked_add(blob.engine.len()).expect("engine end fits usize");
    assert!(end <= data.len(), "engine [{offset}, {end}) outside the {}-byte input", data.len());
    assert_eq!(blob.engine.as_ptr(), data[offset..].as_ptr(), "engine is borrowed at engine_offset");
    let _ = blob.verify_payload();
}

/// The native reader, on the input and on the input with its header checksum re-stamped, so that mutations
/// of the header reach the FlatBuffers verifier and the model conversion instead of stopping at the checksum.
pub fn check_native(data: &[u8]) {
    check_native_as_is(data);
    if let Some(restamped) = restamp_header_checksum(data) {
        check_native_as_is(&restamped);
    }
}

/// A copy of `data` whose native header checksum matches its header bytes, if it has a native prefix and
/// an in-bounds header.
fn restamp_header_checksum(data: &[u8]) -> Option<Vec<u8>> {
    if !data.starts_with(&native::MAGIC) || data.len() < native::PREFIX_LEN {
        return None;
    }
    let u32_at =
        |at: usize| u32::from_le_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]]) as usize;
    let (offset, len) = (u32_at(12), u32_at(16));
    let header = data.get(offset..offset.checked_add(len)?)?;
    let mut copy = data.to_vec();
    copy[24..32].copy_from_slice(&xxhash_rust::xxh3::xxh3_64(header).to_le_bytes());
    Some(copy)
}

fn check_native_as_is(data: &[u8]) {
    let Ok(blob) = native::parse(data) else { return };
    check_blob(data, &blob);
    let bytes = native::to_vec(&blob.header, blob.engine);
    let again = native::parse(&bytes).expect("a re-written native blob parses");
    assert_eq!(again.header, blob.header, "native write/parse round trip");
    assert_eq!(again.engine, blob.engine);
    again.verify_payload().expect("a re-written native blob carries a matching payload checksum");
}

/// The TR01/TR02 reader.
pub fn check_upstream(data: &[u8]) {
    let Ok(blob) = upstream::parse(data) else { return };
    check_blob(data, &blob);
    if !upstream::unrepresentable(&blob.header).is_empty() {
        return;
    }
    let bytes = upstream::write_tr02(&blob.header, blob.engine).expect("a representable header writes");
    let again = upstream::parse(&bytes).expect("a re-written TR blob parses");
    assert_eq!(again.header, blob.header, "TR02 write/parse round trip");
    assert_eq!(again.engine, blob.engine);
}

/// Format detection plus whichever reader it picks.
pub fn check_parse_any(data: &[u8]) {
    let detected = detect(data);
    if let Ok(blob) = Blob::parse(data) {
        check_blob(data, &blob);
        assert_eq!(detected.ok(), Some(blob.format), "parse reads the format detect reports");
    }
}
