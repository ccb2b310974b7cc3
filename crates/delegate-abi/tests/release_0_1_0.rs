//! Old plugin, new host, over real libraries: the reference plugin as release 0.1.0 shipped it
//! (`fixtures/releases/0.1.0`, built before the capabilities were appended to `PluginInfoRecord`) loads in
//! this build's host, negotiates ABI 1, and reads the default capabilities. abi_stable alone refuses it
//! ("too many fields: expected 12, found 6"); `host::root` accepts a plugin whose layout is a prefix of ours.
//! Its table lacks the per-instance entry `keeps_sequence_state`: an instance of it is answered for by its
//! plugin-level capability, which it does not state, so it may keep sequence state of its own.

use std::path::{Path, PathBuf};
use std::process::Command;

use delegate_abi::host::{HostConfig, Plugin, SequenceState};
use delegate_abi::{Capabilities, InitContext, MemoryKind};

const BUNDLE: &str = "reference-delegate-dylib-0.1.0-x86_64-unknown-linux-gnu";

/// Unpacks release 0.1.0's reference plugin bundle into `into`; returns its library. `None` on a machine the
/// bundle was not built for.
fn unpack_0_1_0_reference(into: &Path) -> Option<PathBuf> {
    if !cfg!(all(target_os = "linux", target_arch = "x86_64")) {
        return None;
    }
    let archive = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/releases/0.1.0")
        .join(format!("{BUNDLE}.tar.gz"));
    let status =
        Command::new("tar").arg("-xzf").arg(&archive).arg("-C").arg(into).status().expect("tar runs");
    assert!(status.success(), "unpacking {}", archive.display());
    Some(into.join(BUNDLE).join("libreference_delegate_dylib.so"))
}

#[test]
fn a_plugin_from_release_0_1_0_loads_with_the_default_capabilities() {
    let dir = tempfile::tempdir().expect("temp dir");
    let Some(library) = unpack_0_1_0_reference(dir.path()) else { return };
    let plugin = Plugin::load(&library, &HostConfig::default()).expect("the 0.1.0 plugin loads in this host");
    assert_eq!(plugin.abi_version(), 1);
    let info = plugin.info();
    assert_eq!((info.name.as_str(), info.version.as_str()), ("reference-delegate", "0.1.0"));
    // The fields 0.1.0 had still read.
    assert_eq!(info.memory_kinds, [MemoryKind::Host, MemoryKind::Pinned, MemoryKind::Managed]);
    assert!(info.binds_aliases_in_place);
    // The appended ones read as their defaults.
    assert_eq!(info.capabilities, Capabilities::default());
    // And it still works: a header-only question answered by the old code.
    let answer = plugin.compatibility(b"not a blob").expect("answers");
    assert!(matches!(answer, delegate_abi::Compatibility::Unsupported { .. }), "{answer:?}");
}

#[test]
fn an_instance_of_a_plugin_from_release_0_1_0_is_answered_for_by_its_capability() {
    let dir = tempfile::tempdir().expect("temp dir");
    let Some(library) = unpack_0_1_0_reference(dir.path()) else { return };
    let plugin = Plugin::load(&library, &HostConfig::default()).expect("the 0.1.0 plugin loads in this host");
    // A blob 0.1.0's reference delegate runs: the tiny example decoder, caches in the caller's memory.
    let cfg = kv_example::Config::tiny();
    let weights = kv_example::Weights::generate(&cfg);
    let blob = kv_example::export::blob(&cfg, &weights, 1, kv_example::Backend::Reference).expect("blob");
    let instance = plugin
        .init(&InitContext { blob: &blob, compile_specs: &[], runtime_specs: &[] })
        .expect("the 0.1.0 plugin initialises it");
    // Its table has no `keeps_sequence_state`: not asked, answered by the capability it does not state.
    assert_eq!(
        instance.sequence_state().expect("answered"),
        SequenceState { keeps_own: true, per_instance: false }
    );
}
