use super::*;
use crate::plugin_manifest::PluginManifest;
use delegate_abi::PluginInfo;
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

fn in_process(registry: &Registry, backend: &str) -> Option<Arc<Plugin>> {
    registry.served(backend).and_then(|served| served.in_process().cloned())
}

fn dylib_name(stem: &str) -> String {
    format!("{}{stem}{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX)
}

/// The built `abi-test` plugin.
fn abi_test_plugin() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| test_plugin_dir().join(dylib_name("abi_test")))
}

/// The built test plugins: `$DELEGATE_TEST_PLUGIN_DIR`, else built once into `target/plugin-tests`.
fn test_plugin_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| match std::env::var_os("DELEGATE_TEST_PLUGIN_DIR") {
        // Relative to the workspace root (tests run in the crate directory).
        Some(dir) => Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(dir),
        None => {
            let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
            let target = root.join("target/plugin-tests");
            let status = Command::new(env!("CARGO"))
                .current_dir(&root)
                .args(["build", "--quiet", "-p", "abi-test", "-p", "crash-on-load", "-p", "panic-on-info"])
                .arg("--target-dir")
                .arg(&target)
                .status()
                .expect("cargo runs");
            assert!(status.success(), "building the test plugins failed");
            target.join("debug")
        }
    })
}

fn dir_with(files: &[(&str, Option<&[u8]>)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for (name, contents) in files {
        let path = dir.path().join(name);
        match contents {
            Some(bytes) => std::fs::write(&path, bytes).expect("write"),
            None => {
                std::fs::copy(abi_test_plugin(), &path).expect("copy plugin");
            }
        }
    }
    dir
}

fn statuses(registry: &Registry) -> Vec<(String, String)> {
    registry
        .candidates()
        .iter()
        .map(|c| {
            let name = c
                .path
                .as_ref()
                .and_then(|p| p.file_name())
                .map_or("(embedded)".into(), |n| n.to_string_lossy().into_owned());
            (name, c.status.to_string())
        })
        .collect()
}

#[test]
fn a_text_file_is_rejected_while_the_real_plugin_and_the_embedded_one_load() {
    let fake = dylib_name("fake");
    let real = dylib_name("abi_test");
    let dir = dir_with(&[(&fake, Some(b"not a library\n")), (&real, None), ("README.txt", Some(b"ignored"))]);
    let registry = with_reference(Registry::discover(Discovery::new().dirs([dir.path()]).probe(true)));
    let statuses = statuses(&registry);
    assert_eq!(statuses.len(), 3, "{statuses:?}");
    assert_eq!(statuses[0].0, real);
    assert_eq!(statuses[0].1, "loaded");
    assert_eq!(statuses[1].0, fake);
    assert!(statuses[1].1.starts_with("rejected: not a loadable library: "), "{}", statuses[1].1);
    assert_eq!(statuses[2], ("(embedded)".to_string(), "loaded".to_string()));

    let plugin = in_process(&registry, "AbiTestBackend").expect("served");
    assert_eq!(plugin.info().name, "abi-test");
    assert!(in_process(&registry, "ReferenceBackend").is_some(), "{:?}", registry.backends());
    assert!(in_process(&registry, "Nope").is_none());
    assert!(registry.backends().contains(&"AbiTestBackend".to_string()));
}

#[test]
fn things_named_like_libraries_that_are_not_files_are_listed_with_the_reason() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir(dir.path().join(dylib_name("a_directory"))).expect("mkdir");
    #[cfg(unix)]
    std::os::unix::fs::symlink(dir.path().join("nowhere"), dir.path().join(dylib_name("b_dangling")))
        .expect("symlink");
    let fifo = dir.path().join(dylib_name("c_fifo"));
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo runs");
    assert!(made.success());
    let registry = Registry::discover(Discovery::new().dirs([dir.path()]).probe(true));
    let statuses = statuses(&registry);
    assert_eq!(statuses.len(), 3, "{statuses:?}");
    assert_eq!(statuses[0].1, "rejected: not a regular file (it is a directory)");
    assert!(statuses[1].1.starts_with("rejected: cannot read it: "), "{}", statuses[1].1);
    assert!(statuses[1].1.ends_with("(a dangling symbolic link?)"), "{}", statuses[1].1);
    assert_eq!(statuses[2].1, "rejected: not a regular file (it is a FIFO)");
}

#[test]
fn equal_versions_first_found_wins_and_later_ones_are_shadowed() {
    let first = dir_with(&[(&dylib_name("abi_test_a"), None)]);
    let second = dir_with(&[(&dylib_name("abi_test_b"), None)]);
    let env = std::env::join_paths([second.path()]).expect("joins");
    let registry = Registry::discover(Discovery::new().dirs([first.path()]).probe(true).env_value(env));
    let winner = first.path().join(dylib_name("abi_test_a"));
    assert_eq!(registry.candidates()[0].status, Status::Loaded);
    assert_eq!(registry.candidates()[0].serves, ["AbiTestBackend"]);
    assert_eq!(registry.candidates()[1].status, Status::Shadowed { by: Some(winner.clone()) });
    assert_eq!(registry.candidates()[1].status.to_string(), format!("shadowed by {}", winner.display()));
    assert_eq!(
        in_process(&registry, "AbiTestBackend").and_then(|p| p.path().map(Path::to_path_buf)),
        Some(winner)
    );
}

#[test]
fn the_same_file_reached_twice_is_one_candidate_and_missing_dirs_are_reported() {
    let dir = dir_with(&[(&dylib_name("abi_test"), None)]);
    let missing = dir.path().join("does-not-exist");
    let env = std::env::join_paths([dir.path(), missing.as_path()]).expect("joins");
    let registry =
        Registry::discover(Discovery::new().dirs([dir.path(), missing.as_path()]).probe(true).env_value(env));
    let statuses = statuses(&registry);
    assert_eq!(statuses.len(), 2, "{statuses:?}");
    assert_eq!(statuses[0].1, "loaded");
    assert_eq!(registry.candidates()[1].path.as_deref(), Some(missing.as_path()));
    assert!(statuses[1].1.starts_with("rejected: cannot read plugin directory: "), "{}", statuses[1].1);
}

#[test]
fn an_incompatible_abi_is_rejected_with_both_ranges() {
    let dir = dir_with(&[(&dylib_name("abi_test"), None)]);
    let config = HostConfig::default().with_abi_range(delegate_abi::abi::AbiRange::new(2, 3));
    let registry = Registry::discover(Discovery::new().dirs([dir.path()]).probe(true).config(config));
    assert_eq!(
        registry.candidates()[0].status,
        Status::Rejected("plugin speaks ABI 1..=1, host 2..=3".into())
    );
    assert!(registry.backends().is_empty());
}

macro_rules! versioned {
    ($module:ident, $ty:ident, $version:literal, [$($backend:literal),*]) => {
        enum $ty {}
        impl delegate_abi::testing::Fixture for $ty {
            fn info() -> PluginInfo {
                PluginInfo::new(stringify!($ty), $version)$(.with_backend($backend))*
            }
        }
        mod $module {
            delegate_abi::export_delegate!(@embedded delegate_abi::testing::Scripted<super::$ty>);
        }
    };
}

versioned!(v1_0, V1_0, "1.0.0", ["X", "Y"]);
versioned!(v1_10, V1_10, "1.10.0", ["X"]);
versioned!(v1_2, V1_2, "1.2.0", ["X"]);

#[test]
fn the_highest_semver_version_serves_a_backend_per_backend() {
    let load = |root| Plugin::embedded(root).expect("embedded");
    let candidates = vec![
        Candidate::loaded(Some("a.so".into()), load(v1_0::delegate_root())),
        Candidate::loaded(Some("b.so".into()), load(v1_10::delegate_root())),
        Candidate::loaded(Some("c.so".into()), load(v1_2::delegate_root())),
    ];
    let registry = Registry::from_candidates(candidates, HostConfig::default());
    // 1.10.0 > 1.2.0 in semver order (not in string order).
    assert_eq!(in_process(&registry, "X").map(|p| p.info().name.clone()).as_deref(), Some("V1_10"));
    // The oldest still serves the backend nobody else offers.
    assert_eq!(in_process(&registry, "Y").map(|p| p.info().name.clone()).as_deref(), Some("V1_0"));
    let c = registry.candidates();
    assert_eq!((c[0].status.clone(), c[0].serves.clone()), (Status::Loaded, vec!["Y".to_string()]));
    assert_eq!((c[1].status.clone(), c[1].serves.clone()), (Status::Loaded, vec!["X".to_string()]));
    assert_eq!(c[2].status, Status::Shadowed { by: Some("b.so".into()) });
}

#[test]
fn an_application_embeds_more_plugins_under_the_same_duplicate_rule() {
    let load = |root| Plugin::embedded(root).expect("embedded");
    let registry = Registry::from_candidates(
        vec![Candidate::loaded(Some("a.so".into()), load(v1_2::delegate_root()))],
        HostConfig::default(),
    );
    let config = HostConfig::default();
    // An older embedded copy is shadowed by the discovered plugin ...
    let registry = registry.with_embedded(v1_0::delegate_root(), &config);
    let c = registry.candidates();
    assert_eq!((c[0].status.clone(), c[0].serves.clone()), (Status::Loaded, vec!["X".to_string()]));
    assert_eq!((c[1].path.clone(), c[1].serves.clone()), (None, vec!["Y".to_string()]), "serves Y alone");
    // ... and a newer one takes the backend over, the decision made again over every candidate.
    let registry = registry.with_embedded(v1_10::delegate_root(), &config);
    let c = registry.candidates();
    assert_eq!(c[0].status, Status::Shadowed { by: None });
    assert_eq!(c[1].serves, ["Y"]);
    assert_eq!((c[2].status.clone(), c[2].serves.clone()), (Status::Loaded, vec!["X".to_string()]));
    assert_eq!(in_process(&registry, "X").map(|p| p.info().name.clone()).as_deref(), Some("V1_10"));
    assert_eq!(registry.candidates().len(), 3);
}

#[test]
#[allow(deprecated)]
fn release_0_1_0s_for_backend_still_answers_as_served_does() {
    let registry = Registry::from_candidates(vec![], HostConfig::default())
        .with_embedded(v1_2::delegate_root(), &HostConfig::default());
    let plugin = registry.for_backend("X").expect("served in this process");
    assert_eq!(plugin.info().name, "V1_2");
    assert!(registry.for_backend("Nobody").is_none());
}

#[test]
fn search_path_puts_explicit_dirs_before_the_environment() {
    let env = std::env::join_paths(["/b", "", "/c"]).expect("joins");
    let path = search_path(&[PathBuf::from("/a")], Some(&env));
    assert_eq!(
        path,
        [(PathBuf::from("/a"), true), (PathBuf::from("/b"), false), (PathBuf::from("/c"), false)]
    );
}

#[test]
fn a_plugin_whose_manifest_asks_for_isolation_never_loads_into_a_host_without_workers() {
    let dir = dir_with_manifest(|m| m.isolate = true);
    let registry = discover_manifests(dir.path());
    assert!(registry.served("AbiTestBackend").is_none());
    assert!(registry.candidates()[0].plugin().is_none(), "the library was not opened");
    let reasons: Vec<(String, String)> = registry.unavailable_for("AbiTestBackend").collect();
    assert_eq!(
        reasons,
        [(
            "abi-test".to_owned(),
            "its manifest asks to run it in a worker process, and this host runs none".to_owned()
        )]
    );
    // With workers, it is served isolated (still without opening the library here).
    let isolated = Registry::discover(Discovery::new().dirs([dir.path()]).isolation(no_worker()));
    match isolated.served("AbiTestBackend") {
        Some(Served::Isolated(plugin)) => assert_eq!(plugin.info.name, "abi-test"),
        other => panic!("expected an isolated plugin, got {other:?}"),
    }
    assert!(isolated.candidates()[0].plugin().is_none());
    // Without the manifest's flag, only `all` isolates it.
    let plain = dir_with_manifest(|_| {});
    let here = Registry::discover(Discovery::new().dirs([plain.path()]).isolation(no_worker()));
    assert!(matches!(here.served("AbiTestBackend"), Some(Served::InProcess(_))));
}

/// A directory with the abi-test plugin and its manifest as the tool writes it; `edit` changes the manifest.
fn dir_with_manifest(edit: impl FnOnce(&mut PluginManifest)) -> tempfile::TempDir {
    let real = dylib_name("abi_test");
    let dir = dir_with(&[(&real, None)]);
    let library = dir.path().join(&real);
    let plugin = Plugin::load(&library, &HostConfig::default()).expect("the test plugin loads");
    let mut manifest = PluginManifest::describe(&plugin, &library).expect("hashable");
    edit(&mut manifest);
    std::fs::write(PluginManifest::path_for(&library), manifest.to_json()).expect("write manifest");
    dir
}

fn discover_manifests(dir: &Path) -> Registry {
    Registry::discover(Discovery::new().dirs([dir]))
}

/// `registry` with the reference delegate embedded, as `delegate-host` ships it.
fn with_reference(registry: Registry) -> Registry {
    registry.with_embedded(reference_delegate::delegate_root(), &HostConfig::default())
}

/// Isolation settings whose worker is never started by these tests.
fn no_worker() -> crate::isolate::Isolation {
    crate::isolate::Isolation::new("/nonexistent/worker", ["worker"])
}

#[test]
fn manifests_list_plugins_without_loading_and_a_backend_loads_on_first_use() {
    let dir = dir_with_manifest(|_| {});
    let registry = discover_manifests(dir.path());
    let candidate = &registry.candidates()[0];
    assert_eq!(candidate.status, Status::Listed);
    assert_eq!(candidate.serves, ["AbiTestBackend"], "the duplicate rule runs on the manifest");
    assert!(candidate.plugin().is_none() && candidate.abi_version.is_none(), "nothing loaded yet");
    let plugin = in_process(&registry, "AbiTestBackend").expect("loads on demand");
    assert_eq!(plugin.info().name, "abi-test");
    assert!(registry.candidates()[0].plugin().is_some(), "kept for the next caller");
    assert!(Arc::ptr_eq(&plugin, &in_process(&registry, "AbiTestBackend").expect("served")), "loaded once");
}

#[test]
fn a_manifest_that_cannot_apply_is_refused_without_loading() {
    type Edit = fn(&mut PluginManifest);
    let cases: [(Edit, &str); 4] = [
        (
            |m| m.abi = crate::plugin_manifest::AbiSpan { min: 2, max: 3 },
            "plugin speaks ABI 2..=3, host 1..=1",
        ),
        (|m| m.target = "sparc-plan9".into(), "built for sparc-plan9, this machine is"),
        (|m| m.library = "libother.so".into(), "describes library 'libother.so', not 'libabi_test.so'"),
        (|m| m.manifest_version = 2, "manifest version 2 (this build reads 1)"),
    ];
    for (edit, reason) in cases {
        let dir = dir_with_manifest(edit);
        let registry = discover_manifests(dir.path());
        let candidate = &registry.candidates()[0];
        assert!(
            matches!(&candidate.status, Status::Rejected(r) if r.contains(reason)),
            "{:?} lacks {reason}",
            candidate.status
        );
        assert!(in_process(&registry, "AbiTestBackend").is_none());
    }
}

#[test]
fn a_library_that_differs_from_its_manifest_serves_nothing_and_says_why() {
    let dir = dir_with_manifest(|m| m.backends.push("ExtraBackend".into()));
    let registry = discover_manifests(dir.path());
    assert!(in_process(&registry, "AbiTestBackend").is_none(), "refused when loaded");
    // Not listed as served once it failed (a run's error said "loaded: AbiTestBackend").
    assert!(!registry.backends().contains(&"AbiTestBackend".to_owned()), "{:?}", registry.backends());
    let reasons: Vec<(String, String)> = registry.unavailable_for("AbiTestBackend").collect();
    let library = dir.path().join(dylib_name("abi_test"));
    let expected = format!(
        "the library disagrees with its manifest: backends: manifest AbiTestBackend,ExtraBackend, library \
         AbiTestBackend; if you trust it, write its manifest again with `delegate-host plugin-manifest {}`",
        library.display()
    );
    assert_eq!(reasons, [("abi-test".to_owned(), expected.clone())]);
    // Probing loads it at once and rejects it for the same reason.
    let probed = Registry::discover(Discovery::new().dirs([dir.path()]).probe(true));
    assert_eq!(probed.candidates()[0].status, Status::Rejected(expected));
}

#[test]
fn without_a_manifest_a_library_is_listed_and_loaded_only_by_probing() {
    let dir = dir_with(&[(&dylib_name("abi_test"), None)]);
    let registry = discover_manifests(dir.path());
    assert_eq!(registry.candidates()[0].status, Status::NoManifest);
    assert!(in_process(&registry, "AbiTestBackend").is_none());
    let probed = Registry::discover(Discovery::new().dirs([dir.path()]).probe(true));
    assert_eq!(probed.candidates()[0].status, Status::Loaded);
}

/// Copies the built `stem` into `dir` beside a manifest claiming `ReferenceBackend` at 9.0.0, with the
/// given SHA-256 (`None`: the copy's own); returns the copy's path.
fn claims_reference_9(dir: &Path, stem: &str, sha256: Option<&str>) -> PathBuf {
    let library = dir.join(dylib_name(stem));
    std::fs::copy(test_plugin_dir().join(dylib_name(stem)), &library).expect("built fixture");
    let sha256 = match sha256 {
        Some(sha) => sha.to_owned(),
        None => crate::plugin_manifest::sha256_file(&library).expect("hashable"),
    };
    let manifest = PluginManifest {
        manifest_version: crate::plugin_manifest::MANIFEST_VERSION,
        library: dylib_name(stem),
        sha256,
        name: stem.into(),
        version: "9.0.0".into(),
        abi: crate::plugin_manifest::AbiSpan { min: 1, max: 1 },
        backends: vec!["ReferenceBackend".into()],
        wire_formats: vec![],
        memory_kinds: vec!["host".into()],
        binds_aliases_in_place: true,
        target: crate::plugin_manifest::host_target(),
        rustc: None,
        capabilities: Default::default(),
        isolate: false,
    };
    std::fs::write(PluginManifest::path_for(&library), manifest.to_json()).expect("write manifest");
    library
}

fn served_by_embedded(registry: &Registry) {
    let served = in_process(registry, "ReferenceBackend").expect("the embedded plugin serves");
    assert_eq!((served.path(), served.info().name.as_str()), (None, "reference-delegate"));
    assert_eq!(registry.candidate_for_backend("ReferenceBackend").map(|c| c.path.clone()), Some(None));
    assert!(registry.backends().contains(&"ReferenceBackend".to_owned()));
}

#[test]
fn a_library_whose_bytes_differ_from_its_manifest_never_runs_and_the_embedded_plugin_serves() {
    // crash-on-load aborts this test process the moment any of its code runs.
    let dir = tempfile::tempdir().expect("temp dir");
    let wrong = "ab".repeat(32);
    let library = claims_reference_9(dir.path(), "crash_on_load", Some(&wrong));
    for probe in [false, true] {
        let registry = with_reference(Registry::discover(Discovery::new().dirs([dir.path()]).probe(probe)));
        let candidate = &registry.candidates()[0];
        let status = candidate.status.to_string();
        assert!(status.starts_with(&format!("rejected: sha256: manifest {wrong}, library ")), "{status}");
        assert!(
            status.ends_with(&format!("`delegate-host plugin-manifest {}`", library.display())),
            "{status}"
        );
        assert!(candidate.plugin().is_none() && candidate.serves.is_empty());
        served_by_embedded(&registry);
        let reasons: Vec<(String, String)> = registry.unavailable_for("ReferenceBackend").collect();
        assert_eq!(reasons.len(), 1, "{reasons:?}");
        assert_eq!(reasons[0].0, "crash_on_load");
        assert!(reasons[0].1.starts_with("sha256: manifest "), "{reasons:?}");
    }
}

#[test]
fn a_winner_that_fails_when_loaded_is_passed_over_for_the_next_verified_candidate() {
    // Both hash right and claim 9.0.0, so each wins on paper; loading finds abi-test disagreeing with the
    // manifest, and panic-on-info's self-description panicking.
    for (stem, failure) in [
        ("abi_test", "the library disagrees with its manifest: name: manifest abi_test, library abi-test"),
        ("panic_on_info", "plugin refused the handshake: "),
    ] {
        let dir = tempfile::tempdir().expect("temp dir");
        let library = claims_reference_9(dir.path(), stem, None);
        let registry = with_reference(Registry::discover(Discovery::new().dirs([dir.path()])));
        assert_eq!(registry.candidates()[0].status, Status::Listed);
        assert_eq!(registry.candidates()[0].serves, ["ReferenceBackend"]);
        assert_eq!(
            registry.why_serves("ReferenceBackend").as_deref(),
            Some("the highest version (9.0.0) of 2 verified candidates")
        );
        served_by_embedded(&registry);
        let reason = registry.candidates()[0].load_failure().expect("recorded").to_owned();
        assert!(reason.starts_with(failure), "{reason}");
        let why = registry.why_serves("ReferenceBackend").expect("served");
        assert_eq!(
            why,
            format!(
                "the last verified candidate that offers it; {} was passed over: {reason}",
                library.display()
            )
        );
    }
}

#[test]
fn a_probe_never_loads_a_library_whose_manifest_asks_for_isolation() {
    let asks = dir_with_manifest(|m| m.isolate = true);
    let probed = Registry::discover(Discovery::new().dirs([asks.path()]).probe(true));
    assert_eq!(probed.candidates()[0].status, Status::Listed);
    assert!(probed.candidates()[0].plugin().is_none());
    assert!(probed.served("AbiTestBackend").is_none(), "no workers here");
    let isolated =
        Registry::discover(Discovery::new().dirs([asks.path()]).probe(true).isolation(no_worker()));
    assert!(isolated.served("AbiTestBackend").is_some_and(|s| s.is_isolated()));
    assert!(isolated.runs_isolated(&isolated.candidates()[0]));
}

#[test]
fn isolating_every_plugin_refuses_one_a_probe_already_loaded() {
    let plain = dir_with_manifest(|_| {});
    let registry = Registry::discover(
        Discovery::new().dirs([plain.path()]).probe(true).isolation(no_worker().all(true)),
    );
    assert_eq!(registry.candidates()[0].status, Status::Loaded);
    assert!(registry.served("AbiTestBackend").is_none(), "never silently in process");
    let reasons: Vec<(String, String)> = registry.unavailable_for("AbiTestBackend").collect();
    assert_eq!(reasons.len(), 1);
    assert!(reasons[0].1.starts_with("a probe loaded it into this process"), "{reasons:?}");
}

#[test]
fn a_library_without_a_manifest_is_named_with_the_command_that_writes_one() {
    let dir = dir_with(&[(&dylib_name("abi_test"), None)]);
    let registry = discover_manifests(dir.path());
    let library = dir.path().join(dylib_name("abi_test"));
    assert_eq!(registry.unavailable_for("AnyBackend").count(), 0, "nothing is known to offer it");
    let without: Vec<&Path> = registry.without_manifest().collect();
    assert_eq!(without, [library.as_path()]);
}

#[test]
fn a_shadowed_library_serves_when_the_better_one_fails_when_loaded() {
    // Both hash right; the first claims a newer version than the library says, so it fails when loaded.
    let newer = dir_with_manifest(|m| m.version = "9.0.0".into());
    let plain = dir_with_manifest(|_| {});
    let dirs = [newer.path().to_path_buf(), plain.path().to_path_buf()];
    let registry = Registry::discover(Discovery::new().dirs(&dirs));
    let second = plain.path().join(dylib_name("abi_test"));
    assert!(matches!(registry.candidates()[1].status, Status::Shadowed { .. }));
    let served = in_process(&registry, "AbiTestBackend").expect("the shadowed one serves");
    assert_eq!(served.path(), Some(second.as_path()));
    assert_eq!(registry.candidate_for_backend("AbiTestBackend").and_then(|c| c.path.clone()), Some(second));
    assert!(registry.candidates()[0].load_failure().is_some_and(|r| r.contains("version: manifest 9.0.0")));
}
