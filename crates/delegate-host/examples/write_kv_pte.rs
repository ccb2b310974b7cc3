//! Writes `buffers_1m.pte` and `buffers_2m.pte` into a directory: kv-example `tiny`'s reference-graph blobs in
//! `.pte` programs laid out as ExecuTorch's `to_executorch` lays out a decoder with program mutable buffers
//! (the programs the CLI tests run), for trying `delegate-host run PROGRAM.pte` before real exports exist.
//!
//! Run: `cargo run -p delegate-host --example write_kv_pte -- DIR`, then
//! `delegate-host run DIR/buffers_2m.pte --prompt 1,7,3,12 --steps 12 [--mode copy-back]`.

#[path = "../../host-runtime/tests/support/kv_pte.rs"]
mod kv_pte;

fn main() -> std::io::Result<()> {
    let dir = std::path::PathBuf::from(std::env::args_os().nth(1).unwrap_or_else(|| ".".into()));
    std::fs::create_dir_all(&dir)?;
    for (name, two) in [("buffers_1m.pte", false), ("buffers_2m.pte", true)] {
        let path = dir.join(name);
        std::fs::write(&path, kv_pte::bytes(two))?;
        println!("{}", path.display());
    }
    Ok(())
}
