//! No input panics the reader: every single-byte mutation and every truncation of the fixtures, and random
//! mutations (proptest), either read (and then satisfy the fuzz invariants) or fail with a typed error.

#[path = "../fuzz/oracle.rs"]
mod oracle;

mod common;

use proptest::prelude::*;

fn fixtures() -> Vec<Vec<u8>> {
    let et = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/et_1_5_1_kv_decoder.pte");
    vec![common::kv_pte(), std::fs::read(et).expect("ExecuTorch fixture")]
}

#[test]
fn every_single_byte_mutation_and_truncation_is_handled() {
    for bytes in fixtures() {
        let mut read = 0usize;
        let mut refused = 0usize;
        for at in 0..bytes.len() {
            for value in [0x00, 0xFF, bytes[at] ^ 0x01, bytes[at] ^ 0x80, bytes[at].wrapping_add(0x40)] {
                let mut mutated = bytes.clone();
                mutated[at] = value;
                if oracle::check_pte(&mutated) {
                    read += 1;
                } else {
                    refused += 1;
                }
            }
        }
        for len in 0..bytes.len() {
            // Every cut ends inside the segment data the extended header declares.
            assert!(!oracle::check_pte(&bytes[..len]), "a file cut at {len} reads");
        }
        // Both outcomes happen: the test reaches the checks past the container, and detects corruption.
        assert!(read > 0 && refused > 0, "read {read}, refused {refused}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_mutations_never_panic(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..16),
        cut in any::<prop::sample::Index>(),
        which in 0usize..2,
    ) {
        let mut bytes = fixtures().swap_remove(which);
        for (at, value) in edits {
            let at = at.index(bytes.len());
            bytes[at] = value;
        }
        oracle::check_pte(&bytes);
        let cut = cut.index(bytes.len() + 1);
        oracle::check_pte(&bytes[..cut]);
    }

    #[test]
    fn arbitrary_bytes_with_the_identifier_never_panic(tail in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut bytes = vec![0x0c, 0, 0, 0];
        bytes.extend_from_slice(b"ET12");
        bytes.extend_from_slice(&tail);
        oracle::check_pte(&bytes);
        let mut with_header = bytes.clone();
        if with_header.len() >= 12 {
            with_header[8..12].copy_from_slice(b"eh00");
        }
        oracle::check_pte(&with_header);
    }
}
