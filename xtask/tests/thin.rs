//! `cargo xtask demo` on a fresh machine compiles the `xtask` package first, before the demo's own build can
//! start: it must stay thin. What needs HTTP, archives, plots, semver checks or the workspace's own crates
//! belongs to `xtask-release` or `xtask-example`, built when a task needs them.

use std::process::Command;

/// Crates that once made `cargo xtask demo` compile for minutes before the demo started.
const HEAVY: [&str; 14] = [
    "ureq",
    "rustls",
    "ring",
    "plotters",
    "cargo_metadata",
    "toml_edit",
    "flate2",
    "tar",
    "object",
    "abi_stable",
    "jiff",
    "host-runtime",
    "kv-example",
    "delegate-abi",
];

/// What the package needs today (33 crates with itself), with room for a small helper or two.
const MOST_CRATES: usize = 40;

#[test]
fn xtask_compiles_only_a_few_light_crates() {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args(["tree", "-p", "xtask", "--edges", "normal,build", "--prefix", "none", "--format", "{p}"])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .expect("cargo tree runs");
    assert!(out.status.success(), "cargo tree failed: {}", String::from_utf8_lossy(&out.stderr));
    let tree = String::from_utf8(out.stdout).expect("cargo tree prints UTF-8");
    let mut crates: Vec<&str> = tree.lines().filter_map(|line| line.split_whitespace().next()).collect();
    crates.sort_unstable();
    crates.dedup();
    let heavy: Vec<&&str> = crates.iter().filter(|c| HEAVY.contains(c)).collect();
    assert!(heavy.is_empty(), "xtask compiles {heavy:?}: move the task that needs them to xtask-release");
    assert!(crates.len() <= MOST_CRATES, "xtask compiles {} crates: {crates:?}", crates.len());
}
