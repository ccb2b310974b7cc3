//! `--require-zero-copy` on `delegate-host run` and `bench`: a program a call of which would copy cache bytes
//! on every step is refused at load in one line naming the method, the call, the argument and the reason;
//! without the flag the same program runs (and its counters show the copies); a zero-copy program runs under
//! the flag copying nothing per step.

#[path = "../../host-runtime/tests/support/kv_pte.rs"]
mod kv_pte;

use std::path::{Path, PathBuf};
use std::process::Command;

use kv_example::export::{Backend, Target};
use program_manifest::MemoryKind;

mod common;
use common::{one_line_error, run, stdout_json};

/// The binary without `DELEGATE_PLUGIN_PATH`, so the embedded reference and CUDA delegates serve.
fn host() -> Command {
    let mut cmd = common::host();
    cmd.env_remove("DELEGATE_PLUGIN_PATH");
    cmd
}

/// kv-example's tiny decoder for the reference delegate, in host memory.
fn tiny_reference(dir: &Path) -> PathBuf {
    kv_example::export::reference(&kv_example::Config::tiny(), dir).expect("export");
    dir.join("program.toml")
}

#[test]
fn a_zero_copy_program_runs_under_the_flag_copying_nothing_per_step() {
    let dir = tempfile::tempdir().expect("temp dir");
    let program = tiny_reference(dir.path());
    let generate = |strict: bool| {
        let mut cmd = host();
        cmd.arg("run").arg(&program).args(["--json", "--steps", "4"]);
        if strict {
            cmd.arg("--require-zero-copy");
        }
        stdout_json(&run(&mut cmd))
    };
    let strict = generate(true);
    assert_eq!(strict["stats"]["mean_decode_bytes_copied_total"], 0, "{strict}");
    assert_eq!(strict["tokens"], generate(false)["tokens"]);

    let report = stdout_json(&run(host().arg("bench").arg(&program).args([
        "--json",
        "--steps",
        "2",
        "--runs",
        "2",
        "--require-zero-copy",
    ])));
    let modes = report["modes"].as_array().expect("modes");
    assert_eq!(modes[0]["mode"], "require-zero-copy", "{report}");
    assert_eq!(modes[0]["bytes_copied_per_step"], 0, "{report}");
    assert_eq!(modes[1]["mode"], "copy-back", "the baseline row still runs: {report}");
}

#[test]
fn the_flag_contradicts_copy_back_mode() {
    let dir = tempfile::tempdir().expect("temp dir");
    let program = tiny_reference(dir.path());
    let line = one_line_error(&run(host().arg("run").arg(&program).args([
        "--mode",
        "copy-back",
        "--require-zero-copy",
    ])));
    assert!(line.contains("--mode copy-back") && line.ends_with("[InvalidArgument]"), "{line}");
}

/// A `.pte` whose `aten::copy_` writes the token input into a buffer of its own after the delegate call: a
/// host copy of cache bytes every step.
#[test]
fn a_host_copy_into_a_buffer_is_refused_naming_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let spec = kv_pte::spec_with_token_copy();
    let path = dir.path().join("copy.pte");
    std::fs::write(&path, spec.to_bytes()).expect("write");

    let once = stdout_json(&run(host().arg("run").arg(&path).arg("--json")));
    assert_eq!(once["bytes_copied"]["writeback_bytes"], 8, "copied without the flag: {once}");

    let line = one_line_error(&run(host().arg("run").arg(&path).arg("--require-zero-copy")));
    assert!(
        line.contains(
            "method 'forward', the host copy after call 0: buffer 'last_token' would be copied on every step"
        ),
        "{line}"
    );
    assert!(line.ends_with("[NotSupported]"), "{line}");
}

/// Caches in host memory for the CUDA delegate, which runs on the GPU and does not update host memory in
/// place: refused at load under the flag. Without it the load goes on, and the delegate's residency gate
/// refuses the host caches mid-run, at the first call (the staging counters of a plugin that stages caches are
/// host-runtime's tests/strict.rs, with a stand-in plugin on the CPU).
#[test]
#[ignore = "needs an NVIDIA GPU and driver (the CUDA delegate is unavailable without one): `cargo test -p delegate-host --test strict -- --include-ignored` on one"]
fn caches_the_plugin_would_stage_are_refused_naming_the_argument() {
    let dir = tempfile::tempdir().expect("temp dir");
    let target = Target { backend: Backend::Cuda, memory: MemoryKind::Host };
    kv_example::export::program(&kv_example::Config::tiny(), dir.path(), &target).expect("export");
    let program = dir.path().join("program.toml");

    let line = one_line_error(&run(host().arg("run").arg(&program).arg("--require-zero-copy")));
    assert!(line.contains("method 'prefill', call 0 (CudaBackend): argument"), "{line}");
    assert!(line.contains("bound to buffer 'k_cache_0'"), "{line}");
    assert!(
        line.contains("a staging copy, because plugin 'cuda-delegate' does not update host memory in place"),
        "{line}"
    );
    assert!(line.ends_with("[NotSupported]"), "{line}");

    let line = one_line_error(&run(host().arg("run").arg(&program).args(["--steps", "1"])));
    assert!(line.contains("execute failed"), "without the flag it fails only when it runs: {line}");
}
