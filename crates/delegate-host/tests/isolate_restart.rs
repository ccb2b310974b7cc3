//! After an isolated plugin's worker dies, the host carries on: the failed call is one error, and the next
//! call starts a new worker that initialises again and computes what an in-process plugin computes.
//!
//! Its own test binary: it sets `MISBEHAVE` for the workers it starts, in its own environment.

use host_runtime::isolate::Isolation;
use host_runtime::plugins::{Discovery, Registry};
use host_runtime::program::{Mode, Program};

mod common;
use common::{dylib, host, run, test_plugin_dir};

/// The registry `discovery` finds, with the reference delegate embedded as `delegate-host` ships it.
fn with_reference(discovery: Discovery) -> Registry {
    Registry::discover(discovery).with_embedded(reference_delegate::delegate_root(), &Default::default())
}

#[test]
fn the_call_after_a_worker_dies_starts_a_new_worker_that_decodes_like_the_host() {
    let plugins = tempfile::tempdir().expect("temp dir");
    let library = plugins.path().join(dylib("misbehave_delegate"));
    std::fs::copy(test_plugin_dir().join(dylib("misbehave_delegate")), &library).expect("copy the plugin");
    assert!(run(host().arg("plugin-manifest").arg(&library)).status.success());
    let example = tempfile::tempdir().expect("temp dir");
    let cfg = kv_example::Config::tiny();
    kv_example::export::reference(&cfg, example.path()).expect("export");
    let manifest = program_manifest::Manifest::load(&example.path().join("program.toml")).expect("manifest");

    // The first execute of the first worker aborts; every later one behaves.
    let marker = plugins.path().join("aborted");
    // SAFETY (of the environment): this test binary runs this one test; nothing reads the environment
    // concurrently.
    std::env::set_var("MISBEHAVE", format!("abort-once:{}", marker.display()));

    let isolation = Isolation::new(env!("CARGO_BIN_EXE_delegate-host"), ["worker"]).all(true);
    let isolated = with_reference(Discovery::new().dirs([plugins.path()]).isolation(isolation));
    let mut program = Program::load(manifest.clone(), &isolated, Mode::ZeroCopy).expect("loads");
    // A worker answers each call after synchronising: nothing of the method could be captured as a CUDA graph.
    let refusal = program.capture_refusal("decode").expect("a method").expect("a refusal");
    assert!(refusal.contains("in a worker process"), "{refusal}");
    let err = program.execute("prefill").expect_err("the worker aborts");
    let text = err.to_string();
    assert!(
        text.contains("killed by signal 6 (SIGABRT)") && text.contains("the next call starts a new one"),
        "{text}"
    );
    assert_eq!(et_error::HasErrorCode::error_code(&err), et_error::ErrorCode::Internal, "{text}");
    assert!(marker.exists());
    // The killed call may have left the caches half-written: nothing reads them until the caller resets.
    let torn = host_runtime::generate::generate(&mut program, 1, |_, _| Ok(())).expect_err("torn caches");
    assert_eq!(et_error::HasErrorCode::error_code(&torn), et_error::ErrorCode::InvalidState, "{torn}");
    assert!(torn.to_string().contains("buffers 'k_cache_0', 'v_cache_0'"), "{torn}");
    program.reset().expect("a new sequence");

    let isolated_run = host_runtime::generate::generate(&mut program, cfg.max_decode_steps(), |_, _| Ok(()))
        .expect("the next calls start a new worker");
    let embedded = with_reference(Discovery::new());
    let mut here = Program::load(manifest, &embedded, Mode::ZeroCopy).expect("loads");
    let here_run =
        host_runtime::generate::generate(&mut here, cfg.max_decode_steps(), |_, _| Ok(())).expect("runs");
    assert_eq!(isolated_run.tokens, here_run.tokens);
    for cache in ["k_cache_0", "v_cache_0"] {
        assert_eq!(program.buffer(cache).expect("cache"), here.buffer(cache).expect("cache"), "{cache}");
    }
}
