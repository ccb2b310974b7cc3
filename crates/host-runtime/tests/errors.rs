//! Each failure names its own cause with its own ExecuTorch code: `Usage` (`InvalidArgument`) is left to the
//! caller's own mistakes.

use std::path::{Path, PathBuf};

use delegate_abi::host::HostConfig;
use et_error::{ErrorCode, HasErrorCode};
use host_runtime::generate::{device_loop_refusal, generate, generate_with, Options};
use host_runtime::manifest::Manifest;
use host_runtime::plugins::{Discovery, Registry};
use host_runtime::program::{Error, Mode, Program};

fn export(dir: &Path) -> PathBuf {
    kv_example::export::reference(&kv_example::Config::tiny(), dir).expect("export");
    dir.join("program.toml")
}

fn load(path: &Path) -> Program {
    let registry = Registry::discover(Discovery::new())
        .with_embedded(reference_delegate::delegate_root(), &HostConfig::default());
    Program::load(Manifest::load(path).expect("manifest"), &registry, Mode::ZeroCopy).expect("loads")
}

#[test]
fn a_graph_of_a_program_without_cuda_memory_is_not_supported_not_a_bad_argument() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut program = load(&export(dir.path()));
    let err = program.capture("decode").expect_err("no stream to capture");
    assert!(matches!(err, Error::NoStream { what: "capturing a CUDA graph" }), "{err:?}");
    assert_eq!(err.error_code(), ErrorCode::NotSupported);
    assert_eq!(err.to_string(), "capturing a CUDA graph needs CUDA memory, but the program declares none");
}

#[test]
fn a_graph_the_device_loop_cannot_run_is_not_supported() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut program = load(&export(dir.path()));
    let why = device_loop_refusal(&program).expect("a generator").expect("host memory: no device loop");
    let mut options = Options::steps(1);
    options.cuda_graph = true;
    let err = generate_with(&mut program, &options, |_, _| Ok(())).expect_err("no device loop");
    assert!(matches!(&err, Error::GraphNeedsDeviceLoop { why: reason } if *reason == why), "{err:?}");
    assert_eq!(err.error_code(), ErrorCode::NotSupported);
}

#[test]
fn a_program_without_generate_is_not_a_generator() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = export(dir.path());
    let text = std::fs::read_to_string(&path).expect("manifest");
    let start = text.find("[generate]").expect("the example generates");
    let end = text[start + 1..].find("\n[").map_or(text.len(), |i| start + 1 + i + 1);
    std::fs::write(&path, format!("{}{}", &text[..start], &text[end..])).expect("write");
    let mut program = load(&path);
    let err = generate(&mut program, 1, |_, _| Ok(())).expect_err("nothing to generate");
    assert!(matches!(err, Error::NotAGenerator), "{err:?}");
    assert_eq!(err.error_code(), ErrorCode::InvalidArgument);
    assert!(matches!(device_loop_refusal(&program), Err(Error::NotAGenerator)));
}

#[test]
fn decode_steps_past_the_caches_stay_the_callers_mistake() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut program = load(&export(dir.path()));
    let err = generate(&mut program, 1 << 20, |_, _| Ok(())).expect_err("too many steps");
    assert!(matches!(err, Error::Usage(_)), "{err:?}");
    assert_eq!(err.error_code(), ErrorCode::InvalidArgument);
}
