//! The format and rule crates reach the workspace's vocabulary (et-error), never the plugin ABI: none of them
//! depends, even through another crate, on `delegate-abi` or `abi_stable`. A memory kind or dtype they name
//! is et-error's, the very type a plugin's arguments carry, so no conversion needs the ABI below them.

use std::path::Path;
use std::process::Command;

/// The crates that read and check formats and rules: what a tool that never loads a plugin links.
const FORMAT_AND_RULE_CRATES: [&str; 5] =
    ["blob-format", "alias-validate", "ref-graph", "program-manifest", "pte-format"];

/// Every crate `package` depends on for building, transitively (`cargo tree -e normal`), one name a line.
fn normal_dependencies(workspace: &Path, package: &str) -> Vec<String> {
    let output = Command::new(env!("CARGO"))
        .args(["tree", "--offline", "-e", "normal", "--prefix", "none", "--format", "{p}", "-p", package])
        .arg("--manifest-path")
        .arg(workspace.join("Cargo.toml"))
        .output()
        .expect("cargo runs");
    assert!(output.status.success(), "cargo tree -p {package}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn no_format_or_rule_crate_depends_on_the_plugin_abi() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut offending = Vec::new();
    for package in FORMAT_AND_RULE_CRATES {
        let dependencies = normal_dependencies(&workspace, package);
        assert!(dependencies.iter().any(|name| name == "et-error"), "{package} names the vocabulary");
        for abi in ["delegate-abi", "abi_stable"] {
            if dependencies.iter().any(|name| name == abi) {
                offending.push(format!("{package} -> {abi}"));
            }
        }
    }
    assert_eq!(offending, Vec::<String>::new(), "format and rule crates never reach the plugin ABI");
}
