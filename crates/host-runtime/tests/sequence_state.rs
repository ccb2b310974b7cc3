//! Rewind, restore and fork move a sequence by moving the caller's caches only, so each is refused, in one
//! line naming the action, the method, the call, the plugin and why, unless every call of the program can take
//! it: decided per instance (per blob), not per plugin. The reference delegate runs `owned_1m.pte`, whose graph
//! keeps its caches itself (ref-graph payload 1.2 `state`), and is refused; the same plugin running a program
//! whose caches are the caller's is not. A plugin that states nothing, and one built before instances answer
//! for themselves (release 0.1.0's), are refused too. A plain run after a run still gives the same tokens.

use std::path::{Path, PathBuf};
use std::process::Command;

use delegate_abi::host::HostConfig;
use et_error::{ErrorCode, HasErrorCode};
use host_runtime::generate::generate;
use host_runtime::manifest::Manifest;
use host_runtime::plugins::{Discovery, Registry};
use host_runtime::program::{Error, Mode, Program};

#[path = "support/in_place_blob.rs"]
mod in_place_blob;

#[path = "support/unstated.rs"]
mod unstated;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/executorch").join(name)
}

/// The fixtures' prompt and the 12 greedy tokens after it (`fixtures/executorch/expected.json`).
const PROMPT: [i64; 4] = [1, 7, 3, 12];
const TOKENS: [i64; 13] = [52, 19, 9, 6, 53, 30, 29, 53, 26, 44, 20, 63, 13];

fn load_pte(name: &str) -> Program {
    let registry = Registry::discover(Discovery::new().use_env(false))
        .with_embedded(reference_delegate::delegate_root(), &HostConfig::default());
    host_runtime::pte::load(&fixture(name), &registry, Mode::ZeroCopy, Some(&PROMPT)).expect("loads")
}

/// The refusal of `result`, checked to be `NotSupported` and one line.
fn refused<T: std::fmt::Debug>(result: Result<T, Error>) -> String {
    let err = result.expect_err("refused");
    assert_eq!(err.error_code(), ErrorCode::NotSupported, "{err}");
    let text = err.to_string();
    assert!(!text.contains('\n'), "one line: {text}");
    text
}

#[test]
fn a_delegate_owning_its_caches_is_refused_rewind_restore_and_fork() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut program = load_pte("owned_1m.pte");
    assert_eq!(generate(&mut program, 4, |_, _| Ok(())).expect("generates").tokens, TOKENS[..5]);
    let owner =
        "method 'forward', call 0 (ReferenceBackend) is served by plugin 'reference-delegate', whose \
                 instance says it keeps sequence state of its own (keeps_sequence_state), which";
    assert_eq!(
        refused(program.rewind(2)),
        format!("cannot rewind to position 2: {owner} a rewind does not carry")
    );
    assert_eq!(program.position(), Some(8), "a refused rewind changes nothing");
    // A saved file would hold the caller's caches (this program has none) and claim the position.
    let file = dir.path().join("cache.safetensors");
    assert_eq!(
        refused(program.save_cache(&file, 8, &[])),
        format!("cannot save cache file {}: {owner} a saved cache file does not carry", file.display())
    );
    assert!(!file.exists(), "a refused save writes nothing");
    assert_eq!(
        refused(program.restore_cache(&file)),
        format!("cannot restore cache file {}: {owner} a restored cache file does not carry", file.display())
    );
    let fork = format!("the program cannot fork its caches: {owner} a forked sequence does not carry");
    assert_eq!(refused(program.fork(2)), fork);
    assert_eq!(refused(program.new_caches()), fork);
}

#[test]
fn a_plain_run_after_a_run_gives_the_same_tokens_with_delegate_owned_caches() {
    // The graph's state is a causal cache indexed by position: a run from position 0 writes each row before
    // it reads it, as it does the caller's caches, so starting over needs no new `init`.
    let mut program = load_pte("owned_1m.pte");
    let first = generate(&mut program, 12, |_, _| Ok(())).expect("generates").tokens;
    assert_eq!(first, TOKENS);
    program.reset().expect("resets");
    assert_eq!(generate(&mut program, 12, |_, _| Ok(())).expect("generates again").tokens, TOKENS);
}

#[test]
fn the_same_plugin_rewinds_a_program_whose_caches_are_the_callers() {
    let mut program = load_pte("buffers_1m_planned.pte");
    assert_eq!(generate(&mut program, 4, |_, _| Ok(())).expect("generates").tokens, TOKENS[..5]);
    program.rewind(2).expect("each instance keeps nothing of its own: decided per blob, not per plugin");
    program.fork(2).expect("forks");
}

#[test]
fn a_plugin_that_states_nothing_is_refused_rewind_and_restore() {
    let dir = tempfile::tempdir().expect("temp dir");
    let registry = Registry::discover(Discovery::new().use_env(false))
        .with_embedded(unstated::delegate_root(), &HostConfig::default());
    let manifest = in_place_blob::program(dir.path(), "UnstatedBackend", &[("step", "cache")]);
    let mut program = Program::load(Manifest::load(&manifest).expect("manifest"), &registry, Mode::ZeroCopy)
        .expect("loads");
    program.execute("step").expect("runs");
    let file = dir.path().join("cache.safetensors");
    let unstated =
        "method 'step', call 0 (UnstatedBackend) is served by plugin 'unstated', whose instance says \
                    it keeps sequence state of its own (keeps_sequence_state), which";
    assert_eq!(
        refused(program.rewind(0)),
        format!("cannot rewind to position 0: {unstated} a rewind does not carry")
    );
    assert_eq!(
        refused(program.save_cache(&file, 1, &[])),
        format!("cannot save cache file {}: {unstated} a saved cache file does not carry", file.display())
    );
    assert_eq!(
        refused(program.restore_cache(&file)),
        format!(
            "cannot restore cache file {}: {unstated} a restored cache file does not carry",
            file.display()
        )
    );
    // Starting over is no reuse: reset, and the plugin runs on.
    program.reset().expect("resets");
    program.execute("step").expect("runs again");
}

/// Unpacks release 0.1.0's reference plugin (library and manifest) into `into`; returns its directory. `None`
/// on a machine the bundle was not built for.
fn unpack_0_1_0_reference(into: &Path) -> Option<PathBuf> {
    if !cfg!(all(target_os = "linux", target_arch = "x86_64")) {
        return None;
    }
    let bundle = "reference-delegate-dylib-0.1.0-x86_64-unknown-linux-gnu";
    let archive =
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../fixtures/releases/0.1.0/{bundle}.tar.gz"));
    let status = Command::new("tar").arg("-xzf").arg(&archive).arg("-C").arg(into).status();
    assert!(status.expect("tar runs").success(), "unpacking {}", archive.display());
    Some(into.join(bundle))
}

#[test]
fn a_plugin_from_release_0_1_0_is_refused_rewind_and_restore() {
    let dir = tempfile::tempdir().expect("temp dir");
    let Some(plugins) = unpack_0_1_0_reference(dir.path()) else { return };
    // The 0.1.0 library alone serves ReferenceBackend: no embedded plugin.
    let registry = Registry::discover(Discovery::new().dirs([&plugins]).use_env(false));
    let cfg = kv_example::Config::tiny();
    let program_dir = dir.path().join("program");
    kv_example::export::reference(&cfg, &program_dir).expect("export");
    let manifest = Manifest::load(&program_dir.join("program.toml")).expect("manifest");
    let mut program =
        Program::load(manifest, &registry, Mode::ZeroCopy).expect("loads with the 0.1.0 plugin");
    generate(&mut program, 2, |_, _| Ok(())).expect("generates");
    let old = "method 'decode', call 0 (ReferenceBackend) is served by plugin 'reference-delegate', which \
               predates per-instance answers and does not state the capability rewind_fork_without_reinit (it \
               may keep sequence state of its own)";
    assert_eq!(refused(program.rewind(2)), format!("cannot rewind to position 2: {old}"));
    let file = dir.path().join("cache.safetensors");
    assert_eq!(
        refused(program.save_cache(&file, 6, &[])),
        format!("cannot save cache file {}: {old}", file.display())
    );
    assert_eq!(
        refused(program.restore_cache(&file)),
        format!("cannot restore cache file {}: {old}", file.display())
    );
}
