//! host-runtime embeds without plugins: no plugin crate among its normal dependencies, and an application
//! that links one plugin (`examples/embed.rs`, compiled here from its source) runs a program through it.

use std::path::Path;
use std::process::Command;

use host_runtime::plugins::{Discovery, Registry};
use serde_json::Value;

#[allow(dead_code)] // its `main`: the test calls the example's functions.
#[path = "../examples/embed.rs"]
mod embed;

/// The normal dependencies (`kind` null in `cargo metadata`) of host-runtime that are path dependencies
/// under the workspace's `plugins/` directory.
fn plugin_dependencies() -> Vec<String> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let output = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline", "--manifest-path"])
        .arg(&manifest)
        .output()
        .expect("cargo runs");
    assert!(output.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&output.stderr));
    let metadata: Value = serde_json::from_slice(&output.stdout).expect("cargo metadata prints JSON");
    let plugins = Path::new(metadata["workspace_root"].as_str().expect("workspace root")).join("plugins");
    let packages = metadata["packages"].as_array().expect("packages");
    let host = packages.iter().find(|p| p["name"] == "host-runtime").expect("host-runtime is a package");
    host["dependencies"]
        .as_array()
        .expect("dependencies")
        .iter()
        .filter(|d| d["kind"].is_null())
        .filter(|d| d["path"].as_str().is_some_and(|path| Path::new(path).starts_with(&plugins)))
        .map(|d| d["name"].as_str().unwrap_or("?").to_owned())
        .collect()
}

#[test]
fn host_runtime_links_no_plugin_crate() {
    assert_eq!(plugin_dependencies(), Vec::<String>::new(), "plugins are the application's to link");
}

#[test]
fn discovery_alone_embeds_no_plugin() {
    let registry = Registry::discover(Discovery::new());
    assert!(registry.candidates().is_empty(), "{:?}", registry.candidates());
    assert!(registry.served("ReferenceBackend").is_none());
}

#[test]
fn an_application_that_links_the_reference_delegate_runs_the_example_program() {
    let dir = tempfile::tempdir().expect("temp dir");
    let exported = kv_example::export::reference(&kv_example::Config::tiny(), dir.path()).expect("export");
    let registry = embed::registry(Discovery::new());
    let served = registry.candidate_for_backend("ReferenceBackend").expect("the embedded plugin serves");
    assert_eq!(
        (served.path.as_deref(), served.serves.as_slice()),
        (None, ["ReferenceBackend".to_owned()].as_slice())
    );
    let generation = embed::run(Discovery::new(), &exported.manifest_path, 4).expect("runs");
    // Prefill's token, then one per decode step.
    let methods: Vec<&str> = generation.steps.iter().map(|s| s.method.as_str()).collect();
    assert_eq!(methods, ["prefill", "decode", "decode", "decode", "decode"]);
    assert_eq!(generation.tokens.len(), 5, "{generation:?}");
    let vocab = kv_example::Config::tiny().vocab as i64;
    assert!(generation.tokens.iter().all(|t| (0..vocab).contains(t)), "{:?}", generation.tokens);
}
