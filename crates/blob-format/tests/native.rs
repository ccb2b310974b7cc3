//! The native format: golden blobs of every version ever written, zero-copy, payload integrity.
//!
//! Golden blobs are regenerated with `UPDATE_GOLDEN=1 cargo test -p blob-format --test native` only when a
//! new version is added; a byte change to an existing golden file means the writer changed the 1.0 format.

mod common;

use blob_format::model::Format;
use blob_format::{native, Blob, Error};
use common::{engine_bytes, golden_cases, read, test_path};

#[test]
fn golden_blobs_are_reproduced_byte_for_byte_and_read_back() {
    for (file, header, engine_len) in golden_cases() {
        let engine = engine_bytes(engine_len);
        let written = native::to_vec(&header, &engine);
        let rel = format!("golden/{file}");
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            std::fs::write(test_path(&rel), &written).expect("writing golden blob");
        }
        let golden = read(&rel);
        assert!(written == golden, "{file}: the 1.0 writer no longer reproduces the committed golden blob");

        let blob = Blob::parse(&golden).unwrap_or_else(|err| panic!("{file}: {err}"));
        assert_eq!(blob.format, Format::Native { major: 1, minor: 0 }, "{file}");
        assert_eq!(blob.header, header, "{file}");
        assert_eq!(blob.engine, engine.as_slice(), "{file}");
        assert_eq!(blob.engine_offset() % native::PAYLOAD_ALIGN, 0, "{file}");
        blob.verify_payload().unwrap_or_else(|err| panic!("{file}: {err}"));
    }
}

#[test]
fn golden_prefix_layout_is_as_documented() {
    let golden = read("golden/native_1_0_full.blob");
    assert_eq!(golden[..8], *b"\x89DLB\r\n\x1a\n");
    assert_eq!(golden[..8], native::MAGIC);
    assert_eq!(u16::from_le_bytes([golden[8], golden[9]]), 1, "major");
    assert_eq!(u16::from_le_bytes([golden[10], golden[11]]), 0, "minor");
    let header_offset = u32::from_le_bytes(golden[12..16].try_into().expect("4 bytes")) as usize;
    let header_len = u32::from_le_bytes(golden[16..20].try_into().expect("4 bytes")) as usize;
    assert_eq!(header_offset, native::PREFIX_LEN);
    assert_eq!(golden[20..24], [0; 4], "reserved");
    let header = &golden[header_offset..header_offset + header_len];
    assert_eq!(&header[4..8], b"DLBH", "FlatBuffers file identifier");
    let blob = Blob::parse(&golden).expect("golden parses");
    let offset = blob.engine_offset() as usize;
    assert_eq!(offset, (header_offset + header_len).div_ceil(256) * 256, "payload at the next 256 boundary");
    assert!(golden[header_offset + header_len..offset].iter().all(|&b| b == 0), "zero padding");
    assert_eq!(offset + blob.engine.len(), golden.len());
}

#[test]
fn engine_is_borrowed_at_engine_offset() {
    let engine = engine_bytes(4096);
    let bytes = native::to_vec(&common::full_header(), &engine);
    let blob = Blob::parse(&bytes).expect("parses");
    let offset = blob.engine_offset() as usize;
    assert!(bytes.as_ptr_range().contains(&blob.engine.as_ptr()));
    assert_eq!(blob.engine.as_ptr(), bytes[offset..].as_ptr());
    assert_eq!(blob.engine.len(), engine.len());
    // 256-byte alignment holds relative to the blob start.
    assert_eq!(offset % 256, 0);
    // Debug shows where the engine is, never its bytes (engines are gigabytes).
    let debug = format!("{blob:?}");
    assert!(debug.contains("engine_len: 4096") && debug.len() < 4096, "{debug}");
}

#[test]
fn write_streams_the_same_bytes_as_to_vec() {
    let engine = engine_bytes(1000);
    let header = common::full_header();
    let mut streamed = Vec::new();
    native::write(&header, &engine, &mut streamed).expect("writing to a Vec");
    assert_eq!(streamed, native::to_vec(&header, &engine));
}

#[test]
fn verify_payload_catches_a_flipped_engine_byte_that_parse_does_not_read() {
    let engine = engine_bytes(1000);
    let mut bytes = native::to_vec(&common::full_header(), &engine);
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    let blob = Blob::parse(&bytes).expect("parse is O(header) and does not read the engine");
    let err = blob.verify_payload().expect_err("engine byte flipped");
    assert!(matches!(err, Error::PayloadChecksum { size: 1000, .. }), "{err:?}");
    assert_eq!(et_error::HasErrorCode::error_code(&err), et_error::ErrorCode::InvalidProgram);
    assert!(err.to_string().starts_with("engine payload checksum mismatch: header says 0x"), "{err}");
}

#[test]
fn trailing_bytes_after_the_payload_are_ignored() {
    let engine = engine_bytes(10);
    let mut bytes = native::to_vec(&common::minimal_header(), &engine);
    bytes.extend_from_slice(b"appended by a future minor");
    let blob = Blob::parse(&bytes).expect("parses");
    assert_eq!(blob.engine, engine.as_slice());
    blob.verify_payload().expect("payload intact");
}

#[test]
fn native_parse_refuses_upstream_blobs() {
    let bytes = read("fixtures/upstream/tr01_relu.blob");
    let err = native::parse(&bytes).expect_err("not native");
    assert!(matches!(err, Error::UnknownMagic { .. }), "{err:?}");
    let native_bytes = native::to_vec(&common::minimal_header(), b"");
    let err = blob_format::upstream::parse(&native_bytes).expect_err("not upstream");
    assert!(matches!(err, Error::UnknownMagic { .. }), "{err:?}");
}
