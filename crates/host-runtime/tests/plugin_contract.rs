//! What a plugin declares, the host honours: an unavailable plugin is listed with its reason and serves
//! nothing, a blob the plugin calls incompatible is refused before `init`, and a plugin that does not bind
//! aliased outputs in place gets copy-back semantics (a separate output slot the host writes back).

use std::path::{Path, PathBuf};

use delegate_abi::host::HostConfig;
use delegate_abi::testing::{self, Fixture, Scripted};
use delegate_abi::{Compatibility, DelegateError, ExecuteArgs, PluginInfo};
use et_error::{ErrorCode, HasErrorCode};
use host_runtime::manifest::Manifest;
use host_runtime::plugins::{Discovery, Registry, Status};
use host_runtime::program::{Error, Mode, Program};

#[path = "support/in_place_blob.rs"]
mod in_place_blob;

/// Reads the cache (argument 0) and writes `cache + 1` into its output slot (argument 1) only, never into
/// the cache itself: its update reaches the caller only if the host writes the slot back.
mod slot_writer {
    use super::*;

    pub struct SlotWriter;
    impl Fixture for SlotWriter {
        fn info() -> PluginInfo {
            testing::info("slot-writer", "SlotBackend").with_binds_aliases_in_place(false)
        }
        fn execute(args: &mut ExecuteArgs<'_>) -> Result<(), DelegateError> {
            let ([cache], [slot]) = args.borrow_typed::<f32, 1, 1>([0], [1])?;
            for (out, value) in slot.iter_mut().zip(cache) {
                *out = value + 1.0;
            }
            Ok(())
        }
    }
    delegate_abi::export_delegate!(@embedded Scripted<SlotWriter>);
}

mod unavailable {
    use super::*;

    pub struct Unavailable;
    impl Fixture for Unavailable {
        fn info() -> PluginInfo {
            testing::info("needs-hardware", "SlotBackend")
        }
        fn availability() -> Result<(), DelegateError> {
            Err(DelegateError::not_supported("no frobnicator on this machine; install one"))
        }
    }
    delegate_abi::export_delegate!(@embedded Scripted<Unavailable>);
}

mod picky {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    pub static INITIALISED: AtomicBool = AtomicBool::new(false);

    pub struct Picky;
    impl Fixture for Picky {
        fn info() -> PluginInfo {
            testing::info("picky", "SlotBackend")
        }
        fn init(_ctx: &delegate_abi::InitContext<'_>) -> Result<(), DelegateError> {
            INITIALISED.store(true, Ordering::SeqCst);
            Ok(())
        }
        fn compatibility(_blob: &[u8]) -> Compatibility {
            Compatibility::Unsupported { reason: "the engine was built for another GPU".to_owned() }
        }
    }
    delegate_abi::export_delegate!(@embedded Scripted<Picky>);
}

/// A program of one 4-float cache updated by one call whose output aliases it.
fn program(dir: &Path) -> PathBuf {
    in_place_blob::program(dir, "SlotBackend", &[("step", "cache")])
}

fn registry_with(root: delegate_abi::abi::DelegateRootRef) -> Registry {
    Registry::discover(Discovery::new()).with_embedded(root, &HostConfig::default())
}

fn cache(program: &Program) -> Vec<f32> {
    let bytes = program.buffer("cache").expect("buffer");
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

#[test]
fn a_plugin_that_does_not_bind_in_place_gets_its_output_slot_written_back_in_either_mode() {
    let dir = tempfile::tempdir().expect("temp dir");
    let manifest = program(dir.path());
    let registry = registry_with(slot_writer::delegate_root());
    for mode in [Mode::ZeroCopy, Mode::CopyBack] {
        let mut program = Program::load(Manifest::load(&manifest).expect("manifest"), &registry, mode)
            .unwrap_or_else(|err| panic!("{mode:?}: {err}"));
        for step in 1..=3 {
            let stats = program.execute("step").unwrap_or_else(|err| panic!("{mode:?}: {err}"));
            // The update persists only through the host's write-back of the slot into the buffer.
            assert_eq!(cache(&program), [step as f32; 4], "{mode:?}, step {step}");
            assert_eq!(stats.copies.writeback_bytes, 16, "{mode:?}: the counters show the write-back");
        }
    }
}

#[test]
fn an_unavailable_plugin_is_listed_with_its_reason_and_serves_nothing() {
    let registry = registry_with(unavailable::delegate_root());
    let candidate = &registry.candidates()[0];
    assert_eq!(
        candidate.status,
        Status::Unavailable("no frobnicator on this machine; install one".to_owned())
    );
    assert!(registry.served("SlotBackend").is_none());
    assert_eq!(registry.unavailable_for("SlotBackend").count(), 1);

    let dir = tempfile::tempdir().expect("temp dir");
    let manifest = Manifest::load(&program(dir.path())).expect("manifest");
    let err = Program::load(manifest, &registry, Mode::ZeroCopy).err().expect("no plugin serves it");
    assert_eq!(err.error_code(), ErrorCode::NotFound);
    assert!(
        err.to_string().contains(
            "no loaded plugin serves backend 'SlotBackend' (loaded: none); plugin needs-hardware offers it but \
             is unavailable: no frobnicator on this machine; install one"
        ),
        "{err}"
    );
}

#[test]
fn a_blob_the_plugin_calls_incompatible_is_refused_before_init() {
    let dir = tempfile::tempdir().expect("temp dir");
    let manifest = Manifest::load(&program(dir.path())).expect("manifest");
    let registry = registry_with(picky::delegate_root());
    let err = Program::load(manifest, &registry, Mode::ZeroCopy).err().expect("refused");
    assert!(matches!(err, Error::Incompatible { .. }), "{err:?}");
    assert_eq!(err.error_code(), ErrorCode::DelegateInvalidCompatibility);
    assert!(err
        .to_string()
        .ends_with("plugin picky cannot run this blob: the engine was built for another GPU"));
    assert!(!picky::INITIALISED.load(std::sync::atomic::Ordering::SeqCst), "refused before init");
}

/// A library found without a manifest is never opened, so nobody knows whether it serves the backend a
/// program asks for: the refusal names it and the command that writes its manifest.
#[test]
fn a_backend_nobody_serves_names_each_library_without_a_manifest_and_the_fix() {
    let plugins = tempfile::tempdir().expect("temp dir");
    // Never opened: any bytes do.
    let library = plugins.path().join(format!(
        "{}unknown{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    ));
    std::fs::write(&library, b"not opened").expect("library");
    let registry = Registry::discover(Discovery::new().dirs(vec![plugins.path().to_path_buf()]));
    assert_eq!(registry.without_manifest().collect::<Vec<_>>(), [library.as_path()]);
    assert_eq!(registry.unavailable_for("SlotBackend").count(), 0, "nothing is known to offer it");

    let dir = tempfile::tempdir().expect("temp dir");
    let manifest = Manifest::load(&program(dir.path())).expect("manifest");
    let err = Program::load(manifest, &registry, Mode::ZeroCopy).err().expect("no plugin serves it");
    assert_eq!(err.error_code(), ErrorCode::NotFound);
    assert!(
        err.to_string().contains(&format!(
            "; library {} has no manifest, so this host never opens it and does not know whether it serves \
             'SlotBackend' (write one with `delegate-host plugin-manifest {}`)",
            library.display(),
            library.display()
        )),
        "{err}"
    );
}
