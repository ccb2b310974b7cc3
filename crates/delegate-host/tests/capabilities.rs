//! Plugin capabilities at the CLI: `plugins` (and `--json`) shows them, a plugin from release 0.1.0 (built
//! before they existed) lists and loads with the defaults, and a manifest that claims other capabilities
//! than its library states is a mismatch like any other.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{dylib, host, run, stdout_json, test_plugin_dir};
use serde_json::{json, Value};

/// What `--json` shows for a plugin that states no capabilities (one built before them).
fn defaults() -> Value {
    json!({
        "in_place_memory_kinds": null,
        "caller_stream": false,
        "cuda_graph_capturable": false,
        "device_positions": false,
        "rewind_fork_without_reinit": false,
        "max_positions": 0,
    })
}

/// `plugins --json` over `dir` (`--probe`: loading every library): the one candidate found there (the
/// others are the host's embedded plugins).
fn only_candidate(dir: &Path, probe: bool) -> Value {
    let mut cmd = host();
    if probe {
        cmd.arg("--probe");
    }
    cmd.args(["plugins", "--json", "--plugin-dir"]).arg(dir).env_remove("DELEGATE_PLUGIN_PATH");
    let list = stdout_json(&run(&mut cmd));
    let found: Vec<&Value> = list
        .as_array()
        .expect("a list")
        .iter()
        .filter(|c| c["path"].as_str().is_some_and(|p| Path::new(p).starts_with(dir)))
        .collect();
    assert_eq!(found.len(), 1, "{list}");
    found[0].clone()
}

/// The built abi-test plugin copied into a fresh directory, with its manifest written there.
fn abi_test_with_manifest(dir: &Path) -> PathBuf {
    let library = dir.join(dylib("abi_test"));
    std::fs::copy(test_plugin_dir().join(dylib("abi_test")), &library).expect("built fixture");
    let out = run(host().arg("plugin-manifest").arg(&library));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    library
}

#[test]
fn the_listing_shows_the_capabilities_a_plugin_states() {
    let dir = tempfile::tempdir().expect("temp dir");
    abi_test_with_manifest(dir.path());
    let stated = json!({
        "in_place_memory_kinds": ["host", "pinned"],
        "caller_stream": false,
        "cuda_graph_capturable": false,
        "device_positions": false,
        "rewind_fork_without_reinit": true,
        "max_positions": 4096,
    });
    for probe in [false, true] {
        let candidate = only_candidate(dir.path(), probe);
        assert_eq!(candidate["capabilities"], stated, "probe {probe}: {candidate}");
    }
    // The manifest carries them too.
    let manifest: Value = serde_json::from_slice(
        &std::fs::read(dir.path().join("libabi_test.plugin.json")).expect("manifest written"),
    )
    .expect("JSON");
    assert_eq!(manifest["capabilities"], stated);
    // And the table, in words.
    let out =
        run(host().args(["plugins", "--plugin-dir"]).arg(dir.path()).env_remove("DELEGATE_PLUGIN_PATH"));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.lines().next().is_some_and(|h| h.contains(" CAPABILITIES ")), "{table}");
    assert!(table.contains("rewind-fork; in-place: host,pinned; max-positions 4096"), "{table}");
}

#[test]
fn a_manifest_claiming_a_capability_its_library_lacks_is_rejected_naming_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let library = abi_test_with_manifest(dir.path());
    let path = dir.path().join("libabi_test.plugin.json");
    let mut manifest: Value = serde_json::from_slice(&std::fs::read(&path).expect("manifest")).expect("JSON");
    manifest["capabilities"]["cuda_graph_capturable"] = json!(true);
    std::fs::write(&path, serde_json::to_string_pretty(&manifest).expect("JSON")).expect("write");
    let candidate = only_candidate(dir.path(), true);
    assert_eq!(candidate["status"], "rejected", "{candidate}");
    let reason = candidate["reason"].as_str().expect("a reason");
    assert_eq!(
        reason,
        format!(
            "the library disagrees with its manifest: capabilities.cuda_graph_capturable: manifest true, \
             library false; if you trust it, write its manifest again with `delegate-host plugin-manifest {}`",
            library.display()
        )
    );
}

#[test]
fn a_plugin_from_release_0_1_0_lists_and_loads_with_the_default_capabilities() {
    if !cfg!(all(target_os = "linux", target_arch = "x86_64")) {
        return; // The bundle was built for x86_64 Linux.
    }
    let bundle = "reference-delegate-dylib-0.1.0-x86_64-unknown-linux-gnu";
    let archive =
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../fixtures/releases/0.1.0/{bundle}.tar.gz"));
    let dir = tempfile::tempdir().expect("temp dir");
    let status = Command::new("tar").arg("-xzf").arg(&archive).arg("-C").arg(dir.path()).status();
    assert!(status.expect("tar runs").success(), "unpacking {}", archive.display());
    let plugin_dir = dir.path().join(bundle);
    // Its 0.1.0 manifest has no capabilities: listed with the defaults, without loading it. This host embeds
    // a newer reference delegate, which serves the backend instead (the highest version wins).
    let listed = only_candidate(&plugin_dir, false);
    let shadowed = (&json!("shadowed"), &json!("0.1.0"), &json!("(embedded)"));
    assert_eq!((&listed["status"], &listed["version"], &listed["shadowed_by"]), shadowed, "{listed}");
    assert_eq!(listed["capabilities"], defaults());
    // Loaded, its self-description (without the appended fields) agrees with the manifest: the defaults.
    let loaded = only_candidate(&plugin_dir, true);
    assert_eq!((&loaded["status"], &loaded["abi_version"]), (&json!("shadowed"), &json!(1)), "{loaded}");
    assert_eq!(loaded["capabilities"], defaults());
}
