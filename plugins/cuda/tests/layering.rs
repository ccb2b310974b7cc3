//! The CUDA delegate depends on no other delegate: the reference-graph contract it shares with the reference
//! delegate is `ref-graph-contract`, and the reference delegate is only a dev-dependency (the CPU oracle of its
//! tests).

use std::path::Path;
use std::process::Command;

#[test]
fn cuda_delegate_depends_on_no_other_delegate() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    // Direct normal dependencies, one a line: `name vX.Y.Z (path)` for a path dependency.
    let output = Command::new(env!("CARGO"))
        .args(["tree", "--offline", "-e", "normal", "--depth", "1", "--prefix", "none", "--manifest-path"])
        .arg(&manifest)
        .output()
        .expect("cargo runs");
    assert!(output.status.success(), "cargo tree: {}", String::from_utf8_lossy(&output.stderr));
    let tree = String::from_utf8_lossy(&output.stdout);
    let delegates: Vec<&str> = tree
        .lines()
        .skip(1)
        .filter(|line| line.contains("/plugins/") || line.contains("-delegate "))
        .collect();
    assert_eq!(delegates, Vec::<&str>::new(), "delegates share contracts, not each other");
}
