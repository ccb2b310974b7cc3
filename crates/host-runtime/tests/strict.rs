//! Strict zero-copy (`Mode::RequireZeroCopy`): a program any of whose calls would copy cache bytes on every
//! step is refused at load, in one typed error naming the method, the call, the argument and the reason; the
//! same program loads in `Mode::ZeroCopy` and its counters show the bytes it copies per step. A program that
//! copies nothing runs under strict mode with zero bytes per step and the tokens of a plain zero-copy run.

#[path = "support/in_place_blob.rs"]
mod in_place_blob;
#[path = "support/kv_pte.rs"]
mod kv_pte;

use std::path::Path;

use delegate_abi::host::HostConfig;
use delegate_abi::testing::{self, Fixture, Scripted};
use delegate_abi::{DelegateError, ExecuteArgs, MemoryKind, PluginInfo};
use et_error::{ErrorCode, HasErrorCode};
use host_runtime::generate::generate;
use host_runtime::manifest::Manifest;
use host_runtime::plugins::{Discovery, Registry};
use host_runtime::program::{CopyReason, Error, Mode, Program};
use host_runtime::pte;

/// Bytes of one 4-float cache of [`in_place_blob::program`].
const CACHE_BYTES: u64 = 16;

/// A plugin that does not bind aliased outputs in place: the host gives it a separate output slot, which it
/// fills (the reflect upstream's delegates make) and the host writes back.
mod no_alias {
    use super::*;

    pub struct NoAlias;
    impl Fixture for NoAlias {
        fn info() -> PluginInfo {
            testing::info("no-alias", "NoAliasBackend").with_binds_aliases_in_place(false)
        }
    }
    delegate_abi::export_delegate!(@embedded Scripted<NoAlias>);
}

/// A plugin that runs on the GPU (it accepts device memory) and takes host memory too, which it stages into
/// its own device memory every call, as the CUDA and TensorRT delegates do, and says so in its counters.
mod stager {
    use super::*;

    pub struct Stager;
    impl Fixture for Stager {
        fn info() -> PluginInfo {
            testing::info("stager", "StagerBackend").with_memory_kinds([MemoryKind::Device, MemoryKind::Host])
        }
        fn execute(args: &mut ExecuteArgs<'_>) -> Result<(), DelegateError> {
            let staged = args.arg(0)?.nbytes;
            args.record_staging(staged);
            Ok(())
        }
    }
    delegate_abi::export_delegate!(@embedded Scripted<Stager>);
}

fn registry() -> Registry {
    let config = HostConfig::default();
    Registry::discover(Discovery::new())
        .with_embedded(no_alias::delegate_root(), &config)
        .with_embedded(stager::delegate_root(), &config)
        .with_embedded(reference_delegate::delegate_root(), &config)
}

fn load(dir: &Path, backend: &str, mode: Mode) -> Result<Program, Error> {
    let path = in_place_blob::program(dir, backend, &[("step", "cache")]);
    Program::load(Manifest::load(&path).expect("manifest"), &registry(), mode)
}

/// The refusal's fields, after checking it is the one typed error with its code.
fn refusal(err: Error) -> (String, String, String, CopyReason) {
    assert_eq!(err.error_code(), ErrorCode::NotSupported, "{err}");
    match err {
        Error::NotZeroCopy { method, call, argument, reason } => (method, call, argument, *reason),
        other => panic!("not a strict zero-copy refusal: {other:?}"),
    }
}

#[test]
fn a_plugin_that_does_not_bind_aliases_in_place_is_refused_for_its_write_back() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut program = load(dir.path(), "NoAliasBackend", Mode::ZeroCopy).expect("loads without strict mode");
    let copies = program.execute("step").expect("runs").copies;
    assert_eq!(copies.writeback_bytes, CACHE_BYTES, "the cache is written back every step: {copies:?}");

    let err = load(dir.path(), "NoAliasBackend", Mode::RequireZeroCopy).err().expect("refused at load");
    let message = err.to_string();
    let (method, call, argument, reason) = refusal(err);
    assert_eq!((method.as_str(), call.as_str()), ("step", "call 0 (NoAliasBackend)"));
    assert_eq!(argument, "argument 1 ('cache_out', bound to buffer 'cache')");
    assert_eq!(reason, CopyReason::WriteBack { plugin: "no-alias".to_owned() });
    assert!(message.contains("does not bind aliased outputs in place"), "{message}");
    assert!(message.contains("--require-zero-copy"), "{message}");
}

#[test]
fn a_buffer_in_memory_the_plugin_does_not_update_in_place_is_refused_for_its_staging() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut program = load(dir.path(), "StagerBackend", Mode::ZeroCopy).expect("loads without strict mode");
    let copies = program.execute("step").expect("runs").copies;
    assert_eq!(copies.staged_bytes, CACHE_BYTES, "the cache is staged every step: {copies:?}");

    let err = load(dir.path(), "StagerBackend", Mode::RequireZeroCopy).err().expect("refused at load");
    let (method, call, argument, reason) = refusal(err);
    assert_eq!((method.as_str(), call.as_str()), ("step", "call 0 (StagerBackend)"));
    assert_eq!(argument, "argument 0 ('cache', bound to buffer 'cache')");
    assert_eq!(reason, CopyReason::Staging { memory: MemoryKind::Host, plugin: "stager".to_owned() });
}

/// A `.pte` whose `aten::copy_` writes a method input into a buffer of its own: a host copy of cache bytes
/// every step (see tests/pte.rs).
#[test]
fn a_pte_host_copy_into_a_buffer_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let spec = kv_pte::spec_with_token_copy();
    let path = dir.path().join("copy.pte");
    std::fs::write(&path, spec.to_bytes()).expect("write");

    let mut program = pte::load(&path, &registry(), Mode::ZeroCopy, None).expect("loads without strict mode");
    let copies = program.execute("forward").expect("runs").copies;
    assert_eq!(copies.writeback_bytes, 8, "the host copies into the buffer every step: {copies:?}");

    let err = pte::load(&path, &registry(), Mode::RequireZeroCopy, None).err().expect("refused at load");
    let pte::Error::Load(err) = err else { panic!("not the program's error: {err:?}") };
    let (method, call, argument, reason) = refusal(err);
    assert_eq!(
        (method.as_str(), call.as_str(), argument.as_str()),
        ("forward", "the host copy after call 0", "buffer 'last_token'")
    );
    assert_eq!(reason, CopyReason::HostCopy);
}

#[test]
fn a_zero_copy_program_runs_under_strict_mode_copying_nothing_per_step() {
    let dir = tempfile::tempdir().expect("temp dir");
    let prompt = kv_pte::config().prompt;
    let path = dir.path().join("kv.pte");
    std::fs::write(&path, kv_pte::bytes(true)).expect("write");
    let run = |mode| {
        let mut program = pte::load(&path, &registry(), mode, Some(&prompt)).expect("loads");
        assert_eq!(program.mode(), mode);
        generate(&mut program, 8, |_, _| Ok(())).expect("generates")
    };
    let strict = run(Mode::RequireZeroCopy);
    assert_eq!(strict.mean_decode_copies().total(), 0, "{:?}", strict.mean_decode_copies());
    assert_eq!(strict.tokens, run(Mode::ZeroCopy).tokens);
    assert_eq!(strict.tokens, kv_pte::oracle_tokens(8));
}
