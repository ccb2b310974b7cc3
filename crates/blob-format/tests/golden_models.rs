//! Every committed blob of every wire-format version reads to the same model, release after release.
//!
//! Each file under `tests/golden/` (native, every version ever written) and `tests/fixtures/upstream/` (TR01,
//! TR02) is parsed and its decoded model (format, header, engine extent, checksum) compared with its committed
//! snapshot `snapshots/golden_models__<file>.snap`. The files are found by listing the directories, so a new
//! golden blob without a snapshot fails (write it with `INSTA_UPDATE=always cargo test -p blob-format --test
//! golden_models` and review it), and a snapshot whose blob was deleted fails too: a released blob stays
//! forever. `cargo xtask compat` runs this test.

mod common;

use std::path::Path;

use blob_format::Blob;
use common::test_path;

/// The blob files of `tests/<dir>`, sorted.
fn blobs(dir: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(test_path(dir))
        .unwrap_or_else(|err| panic!("reading tests/{dir}: {err}"))
        .map(|entry| entry.expect("directory entry").file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".blob"))
        .collect();
    names.sort();
    names
}

#[test]
fn every_golden_blob_reads_to_its_committed_model() {
    let mut seen = Vec::new();
    for dir in ["golden", "fixtures/upstream"] {
        let names = blobs(dir);
        assert!(!names.is_empty(), "tests/{dir} has no blobs");
        for name in names {
            let bytes = common::read(&format!("{dir}/{name}"));
            let blob =
                Blob::parse(&bytes).unwrap_or_else(|err| panic!("{dir}/{name} no longer reads: {err}"));
            blob.verify_payload().unwrap_or_else(|err| panic!("{dir}/{name}: {err}"));
            let stem = Path::new(&name).file_stem().expect("a file name").to_string_lossy().into_owned();
            insta::assert_debug_snapshot!(stem.clone(), blob);
            seen.push(stem);
        }
    }
    // A snapshot without its blob: the blob was deleted, which no release may do.
    let snapshots = test_path("snapshots");
    for entry in std::fs::read_dir(&snapshots).expect("tests/snapshots") {
        let name = entry.expect("directory entry").file_name().to_string_lossy().into_owned();
        if let Some(stem) = name.strip_prefix("golden_models__").and_then(|n| n.strip_suffix(".snap")) {
            assert!(
                seen.iter().any(|s| s == stem),
                "snapshots/{name} has no blob: a golden blob was deleted"
            );
        }
    }
}
