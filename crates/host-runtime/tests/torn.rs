//! A run that fails partway leaves the caches it writes torn: the next run that reads them is refused with one
//! typed line naming the caches and the failed call, until the caller resets them; then it runs again.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use delegate_abi::host::HostConfig;
use et_error::{ErrorCode, HasErrorCode};
use host_runtime::manifest::Manifest;
use host_runtime::plugins::{Discovery, Registry};
use host_runtime::program::{Error, Mode, Program};

#[path = "support/in_place_blob.rs"]
mod in_place_blob;

#[path = "support/half_writer.rs"]
mod half_writer;

/// A program of one 4-float cache updated in place by one call (method `step`), and a method `other` whose
/// call reads and writes a second cache only.
fn program(dir: &Path) -> PathBuf {
    in_place_blob::program(dir, "HalfBackend", &[("step", "cache"), ("other", "other_cache")])
}

fn cache(program: &Program) -> Vec<f32> {
    let bytes = program.buffer("cache").expect("buffer");
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

#[test]
fn a_failed_call_tears_its_caches_until_the_caller_resets_them() {
    let dir = tempfile::tempdir().expect("temp dir");
    let registry = Registry::discover(Discovery::new())
        .with_embedded(half_writer::delegate_root(), &HostConfig::default());
    let mut program =
        Program::load(Manifest::load(&program(dir.path())).expect("manifest"), &registry, Mode::ZeroCopy)
            .expect("loads");
    program.execute("step").expect("runs");
    assert_eq!(cache(&program), [1.0; 4]);
    assert!(program.torn_buffers().is_empty());

    half_writer::FAIL.store(true, Ordering::SeqCst);
    let err = program.execute("step").expect_err("fails halfway");
    assert_eq!(err.error_code(), ErrorCode::Internal, "{err}");
    half_writer::FAIL.store(false, Ordering::SeqCst);
    assert_eq!(cache(&program), [2.0, 2.0, 1.0, 1.0], "the cache is half-written");
    assert_eq!(program.torn_buffers(), ["cache"]);

    // Every later run that reads the torn cache is refused, in one line, and changes nothing.
    for _ in 0..2 {
        let err = program.execute("step").expect_err("the cache is torn");
        assert!(matches!(err, Error::TornBuffers { .. }), "{err:?}");
        assert_eq!(err.error_code(), ErrorCode::InvalidState);
        assert_eq!(
            err.to_string(),
            "method 'step' reads buffer 'cache', which method 'step', call 0 (HalfBackend) may have left \
             half-written when it failed; start a new sequence with Program::reset (or zero them with \
             Program::reset_buffers) before running it again"
        );
        assert!(!err.to_string().contains('\n'));
        assert_eq!(cache(&program), [2.0, 2.0, 1.0, 1.0], "a refused run touches nothing");
    }
    // A method that does not read the torn cache still runs.
    program.execute("other").expect("reads another cache");

    // reset clears the mark without touching the cache; then the method runs again.
    program.reset().expect("reset");
    assert!(program.torn_buffers().is_empty());
    assert_eq!(cache(&program), [2.0, 2.0, 1.0, 1.0], "reset moves no cache bytes");
    program.execute("step").expect("runs after the reset");
    assert_eq!(cache(&program), [3.0, 3.0, 2.0, 2.0]);

    // reset_buffers clears the mark too (and zeroes the caches).
    half_writer::FAIL.store(true, Ordering::SeqCst);
    program.execute("step").expect_err("fails halfway");
    half_writer::FAIL.store(false, Ordering::SeqCst);
    assert!(program.execute("step").is_err(), "torn again");
    program.reset_buffers().expect("zeroes");
    program.execute("step").expect("runs after zeroing");
    assert_eq!(cache(&program), [1.0; 4]);
}

#[test]
fn reset_starts_a_token_generator_at_position_zero() {
    let dir = tempfile::tempdir().expect("temp dir");
    kv_example::export::reference(&kv_example::Config::tiny(), dir.path()).expect("export");
    let registry = Registry::discover(Discovery::new())
        .with_embedded(reference_delegate::delegate_root(), &HostConfig::default());
    let manifest = Manifest::load(&dir.path().join("program.toml")).expect("manifest");
    let g = manifest.generate.clone().expect("a token generator");
    let mut program = Program::load(manifest, &registry, Mode::ZeroCopy).expect("loads");
    for method in [&g.prefill, &g.decode] {
        program.write_input(method, &g.position_input, &7i64.to_le_bytes()).expect("position");
    }
    program.reset().expect("reset");
    for method in [&g.prefill, &g.decode] {
        let position = program.input_mut(method, &g.position_input).expect("host memory");
        assert_eq!(position, 0i64.to_le_bytes(), "method '{method}'");
    }
}
