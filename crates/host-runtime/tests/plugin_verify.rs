//! Verify first, then load (issue 17): a plugin library's bytes are checked against its manifest before any
//! of its code runs, a backend falls back to the next verified candidate, and every path that runs a program
//! (here the `.pte` one) honours a manifest that asks for isolation. The fixture is `crash-on-load`, which
//! aborts this test process the moment any of its code runs: a test that loads it does not fail, it dies.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use delegate_abi::host::HostConfig;
use host_runtime::generate::generate;
use host_runtime::plugin_manifest::{host_target, sha256_file, AbiSpan, PluginManifest, MANIFEST_VERSION};
use host_runtime::plugins::{Discovery, Registry, Status};
use host_runtime::program::Mode;

const CRASH: &str = "crash_on_load";

fn dylib(stem: &str) -> String {
    format!("{}{stem}{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX)
}

/// The built fixtures: `$DELEGATE_TEST_PLUGIN_DIR`, else built once into `target/plugin-tests`.
fn test_plugin_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        if let Some(dir) = std::env::var_os("DELEGATE_TEST_PLUGIN_DIR") {
            return root.join(dir);
        }
        let target = root.join("target/plugin-tests");
        let status = Command::new(env!("CARGO"))
            .current_dir(&root)
            .args(["build", "--quiet", "-p", "crash-on-load", "--target-dir"])
            .arg(&target)
            .status()
            .expect("cargo runs");
        assert!(status.success(), "building crash-on-load failed");
        target.join("debug")
    })
}

/// A directory with crash-on-load beside a manifest claiming `ReferenceBackend` at 9.0.0 (so it would win
/// over the embedded reference delegate), with `sha256` (`None`: the library's own) and `isolate`.
fn crash_claiming_reference(sha256: Option<&str>, isolate: bool) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let library = dir.path().join(dylib(CRASH));
    std::fs::copy(test_plugin_dir().join(dylib(CRASH)), &library).expect("built fixture");
    let manifest = PluginManifest {
        manifest_version: MANIFEST_VERSION,
        library: dylib(CRASH),
        sha256: sha256.map_or_else(|| sha256_file(&library).expect("hashable"), str::to_owned),
        name: "crash-on-load".into(),
        version: "9.0.0".into(),
        abi: AbiSpan { min: 1, max: 1 },
        backends: vec!["ReferenceBackend".into()],
        wire_formats: vec![],
        memory_kinds: vec!["host".into()],
        binds_aliases_in_place: true,
        target: host_target(),
        rustc: None,
        capabilities: Default::default(),
        isolate,
    };
    std::fs::write(PluginManifest::path_for(&library), manifest.to_json()).expect("write manifest");
    (dir, library)
}

fn buffers_2m() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/executorch/buffers_2m.pte")
}

/// Loads and runs `buffers_2m.pte` for two steps; which plugin served it.
/// The registry `discovery` finds, with the reference delegate embedded (as `delegate-host` ships it).
fn with_reference(discovery: Discovery) -> Registry {
    Registry::discover(discovery).with_embedded(reference_delegate::delegate_root(), &HostConfig::default())
}

fn run_pte(registry: &Registry) -> Result<Option<PathBuf>, host_runtime::pte::Error> {
    let mut program = host_runtime::pte::load(&buffers_2m(), registry, Mode::ZeroCopy, Some(&[1, 7, 3, 12]))?;
    generate(&mut program, 2, |_, _| Ok(())).expect("generates");
    Ok(registry.candidate_for_backend("ReferenceBackend").and_then(|c| c.path.clone()))
}

#[test]
fn a_library_whose_hash_differs_from_its_manifest_is_rejected_before_any_of_its_code_runs() {
    let wrong = "ab".repeat(32);
    let (dir, library) = crash_claiming_reference(Some(&wrong), false);
    for probe in [false, true] {
        let registry = with_reference(Discovery::new().dirs([dir.path()]).probe(probe));
        let candidate = &registry.candidates()[0];
        assert_eq!(candidate.path.as_deref(), Some(library.as_path()));
        match &candidate.status {
            Status::Rejected(reason) => {
                assert!(reason.starts_with(&format!("sha256: manifest {wrong}, library ")), "{reason}")
            }
            other => panic!("expected a sha256 rejection, got {other:?}"),
        }
        assert!(candidate.plugin().is_none(), "never opened");
        // The embedded reference delegate keeps serving the backend the manifest claimed.
        assert_eq!(run_pte(&registry).expect("runs"), None);
    }
}

#[test]
fn a_pte_program_never_loads_a_plugin_whose_manifest_asks_for_isolation_into_the_host() {
    // Its hash is right and it claims the newest ReferenceBackend: the `.pte` path must ask the same one
    // function as a TOML program does, which never loads it here.
    let (dir, _) = crash_claiming_reference(None, true);
    // Without workers it cannot serve, so the embedded plugin does.
    let registry = with_reference(Discovery::new().dirs([dir.path()]));
    assert_eq!(registry.candidates()[0].status, Status::Listed);
    assert_eq!(run_pte(&registry).expect("runs"), None);
    assert!(registry.candidates()[0].plugin().is_none());
    // With workers (here one that cannot start), it is placed in a worker and the load fails cleanly.
    let isolation = host_runtime::isolate::Isolation::new("/nonexistent/worker", ["worker"]);
    let isolated = with_reference(Discovery::new().dirs([dir.path()]).isolation(isolation));
    assert!(isolated.served("ReferenceBackend").is_some_and(|s| s.is_isolated()));
    assert!(run_pte(&isolated).is_err(), "the worker cannot start");
    assert!(isolated.candidates()[0].plugin().is_none());
}
