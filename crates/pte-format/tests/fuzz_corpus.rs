//! Replays every committed fuzz seed (`fuzz/corpus/pte/*`) through the invariants the fuzz target checks, so
//! a regression on a seed or a past crasher fails CI on stable Rust, without libFuzzer.

#[path = "../fuzz/oracle.rs"]
mod oracle;

use std::path::PathBuf;

#[test]
fn every_committed_seed_satisfies_the_fuzz_invariants() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/pte");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|err| panic!("listing {}: {err}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .collect();
    files.sort();
    for file in &files {
        let data = std::fs::read(file).unwrap_or_else(|err| panic!("reading {}: {err}", file.display()));
        let name = file.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_owned();
        let ok = oracle::check_pte(&data);
        assert_eq!(
            ok,
            !name.starts_with("refused_"),
            "{name}: seeds named refused_* are refused, others read"
        );
    }
    assert!(files.len() >= 8, "only {} seeds", files.len());
}
