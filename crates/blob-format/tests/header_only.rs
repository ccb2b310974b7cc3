//! `parse_header` reads from a blob's first bytes what `Blob::parse` reads from all of it (issue 17, item 15:
//! `delegate-host inspect` of a 1 GiB blob reads its header, not the gigabyte).

mod common;

use blob_format::{header_extent, parse_header, Blob, Error, HEADER_EXTENT_BYTES};

/// Every golden blob (native of every version, TR01, TR02).
fn golden() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for dir in ["golden", "fixtures/upstream"] {
        for entry in std::fs::read_dir(common::test_path(dir)).expect("list") {
            let name = entry.expect("entry").file_name().to_string_lossy().into_owned();
            if name.ends_with(".blob") {
                out.push((format!("{dir}/{name}"), common::read(&format!("{dir}/{name}"))));
            }
        }
    }
    assert!(out.len() > 2, "golden blobs found");
    out
}

#[test]
fn the_header_read_from_the_first_bytes_is_the_whole_blobs() {
    for (name, bytes) in golden() {
        let blob = Blob::parse(&bytes).expect("reads");
        let first = &bytes[..bytes.len().min(HEADER_EXTENT_BYTES)];
        let extent = header_extent(first).unwrap_or_else(|err| panic!("{name}: {err}"));
        assert!(extent <= blob.engine_offset(), "{name}: the header ends before the engine");
        let head = &bytes[..extent as usize];
        let only = parse_header(head, bytes.len() as u64).unwrap_or_else(|err| panic!("{name}: {err}"));
        assert_eq!(only.format, blob.format, "{name}");
        assert_eq!(only.header, blob.header, "{name}");
        assert_eq!((only.engine_offset, only.engine_size), (blob.engine_offset(), blob.engine.len() as u64));
        // One byte short of the header is truncated, named; the engine's extent is checked against the length.
        let err = parse_header(&head[..head.len() - 1], bytes.len() as u64).expect_err("short");
        assert!(matches!(err, Error::Truncated { need, .. } if need == extent), "{name}: {err}");
        let err = parse_header(head, blob.engine_offset() + blob.engine.len() as u64 - 1).expect_err("cut");
        assert!(matches!(err, Error::OutOfBounds { .. }), "{name}: {err}");
    }
}

#[test]
fn an_oversized_upstream_metadata_is_refused_before_it_is_read() {
    let mut prefix = [0u8; 32];
    prefix[..4].copy_from_slice(b"TR02");
    prefix[4..8].copy_from_slice(&32u32.to_le_bytes());
    prefix[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    let err = header_extent(&prefix).expect_err("4 GiB of metadata");
    assert!(err.to_string().contains("a reader parses"), "{err}");
}
