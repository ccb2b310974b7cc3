//! Replays every committed fuzz seed (`fuzz/corpus/<target>/*`) through the same invariants the fuzz targets
//! check, so a regression on a seed or a past crasher fails CI on stable Rust, without libFuzzer.

#[path = "../fuzz/oracle.rs"]
mod oracle;

use std::path::PathBuf;

use blob_format::Blob;

#[test]
fn every_committed_seed_satisfies_the_fuzz_invariants() {
    let corpus = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz").join("corpus");
    let mut replayed = 0;
    let mut parsed = 0;
    for target in ["native", "upstream", "parse_any"] {
        let dir = corpus.join(target);
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|err| panic!("listing {}: {err}", dir.display()))
            .map(|entry| entry.expect("directory entry").path())
            .collect();
        files.sort();
        assert!(!files.is_empty(), "{} has no seeds", dir.display());
        for file in files {
            let data = std::fs::read(&file).unwrap_or_else(|err| panic!("reading {}: {err}", file.display()));
            // Every reader sees every seed: a native seed is a good negative case for the TR reader.
            oracle::check_native(&data);
            oracle::check_upstream(&data);
            oracle::check_parse_any(&data);
            replayed += 1;
            parsed += usize::from(Blob::parse(&data).is_ok());
        }
    }
    // The seeds include the upstream fixtures (engines cut to 2 KiB) and the golden native blobs, which read.
    assert!(replayed >= 18, "only {replayed} seeds replayed");
    assert!(parsed >= 14, "only {parsed} of {replayed} seeds parse; the corpus lost its valid blobs");
}

#[test]
fn upstream_fixture_seeds_keep_their_bindings() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/upstream");
    let data = std::fs::read(dir.join("fixture_tr02_kv_cache_engine2k.blob")).expect("seed present");
    let blob = Blob::parse(&data).expect("seed parses");
    let names: Vec<_> = blob.header.bindings.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, ["k_cache", "update", "write_idx", "k_cache_out", "logits"]);
    assert_eq!(blob.engine.len(), 2048);
}
