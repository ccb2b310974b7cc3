//! Writes the bridge tests' own `.pte` programs (`buffers_{1m,2m}[_planned].pte`, kv-example's tiny decoder
//! around reference blobs, laid out as ExecuTorch lays out an export) into a directory, for `et-run`:
//!
//! ```sh
//! cargo run -p executorch-bridge --example write_programs -- /tmp/et-programs
//! et-run /tmp/et-programs/buffers_2m.pte --json
//! ```

#[path = "../tests/common/mod.rs"]
mod common;

fn main() {
    let dir =
        std::env::args_os().nth(1).map(std::path::PathBuf::from).unwrap_or_else(|| "et-programs".into());
    std::fs::create_dir_all(&dir).expect("create the directory");
    for case in common::own_cases(&dir) {
        println!("{}", case.path.display());
    }
}
