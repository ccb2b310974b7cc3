//! The plugin's `init` on this machine (CPU only): blobs from upstream and from our exporter are read and
//! validated, then TensorRT-RTX refuses to deserialize without a CUDA driver, and the plugin reports that
//! cleanly with TensorRT's own message, in-process and through the ABI from the built dylib.

#[path = "common/kv_blob.rs"]
mod kv_blob;

use std::path::PathBuf;

use blob_format::model::{Binding, Header, PayloadKind, Role, TENSORRT_BACKEND};
use delegate_abi::{Compatibility, Delegate, ErrorCode, InitContext};
use tensorrt_delegate::TensorRtDelegate;

/// Fails the test unless the TensorRT-RTX library is configured: a test that needs it never passes without.
fn require_tensorrt() {
    assert!(trt_exec::library::configured_path().is_some(), "{}", trt_exec::library::NOT_CONFIGURED);
}

/// Blobs written by Torch-TensorRT 2.14's own serializer, kept with blob-format's tests.
fn upstream_fixture(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../crates/blob-format/tests/fixtures/upstream")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|err| panic!("cannot read {}: {err}", path.display()))
}

/// The plugin library `tensorrt-delegate-dylib` builds: in `$DELEGATE_TEST_PLUGIN_DIR` (`cargo xtask test`
/// builds it there first), else built here into `target/plugin-tests` (the outer cargo holds the main
/// target dir's lock).
fn plugin_dylib() -> PathBuf {
    let file =
        format!("{}tensorrt_delegate_dylib{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX);
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    if let Some(dir) = std::env::var_os("DELEGATE_TEST_PLUGIN_DIR") {
        return root.join(dir).join(file);
    }
    let target = root.join("target/plugin-tests");
    let status = std::process::Command::new(env!("CARGO"))
        .current_dir(&root)
        .args(["build", "--quiet", "-p", "tensorrt-delegate-dylib", "--target-dir"])
        .arg(&target)
        .status()
        .expect("cargo runs");
    assert!(status.success(), "building tensorrt-delegate-dylib failed");
    target.join("debug").join(file)
}

fn ctx(blob: &[u8]) -> InitContext<'_> {
    InitContext { blob, compile_specs: &[], runtime_specs: &[] }
}

/// On a machine without a supported GPU, init must fail with NotSupported and TensorRT's message; on a
/// supported GPU it must succeed. Returns the message for the report.
fn expect_clean_init_failure(
    result: Result<impl std::fmt::Debug, delegate_abi::DelegateError>,
) -> Option<String> {
    match result {
        Ok(_) => None,
        Err(err) => {
            assert_eq!(err.code, ErrorCode::NotSupported, "{err}");
            assert!(err.message.starts_with("TensorRT cannot load this engine here:"), "{err}");
            assert!(err.message.contains("(TensorRT: "), "TensorRT's own message is attached: {err}");
            Some(err.message)
        }
    }
}

#[test]
fn init_on_an_upstream_tr02_blob_fails_cleanly_without_a_gpu() {
    require_tensorrt();
    let blob = upstream_fixture("tr02_kv_cache.blob");
    let delegate = TensorRtDelegate::new();
    assert_eq!(delegate.compatibility(&blob), Compatibility::Supported);
    if let Some(message) = expect_clean_init_failure(delegate.init(ctx(&blob))) {
        eprintln!("init(tr02_kv_cache.blob): NotSupported: {message}");
        assert!(message.contains("CUDA driver") || message.contains("compute capability"), "{message}");
    }
}

#[test]
fn init_on_our_exported_kv_blob_fails_cleanly_through_the_abi() {
    require_tensorrt();
    // A KV-cache engine built here with trt-build (kv-example's decoder cannot be linked into this test: see
    // `common/kv_blob.rs`).
    let blob = kv_blob::native_blob().expect("builds on CPU and exports");

    // In process, through the safe trait.
    let in_process = expect_clean_init_failure(TensorRtDelegate::new().init(ctx(&blob)));

    // Through the ABI, from the built dylib, as delegate-host loads it.
    let dylib = plugin_dylib();
    let plugin =
        delegate_abi::host::Plugin::load(&dylib, &delegate_abi::host::HostConfig::new()).expect("loads");
    assert_eq!(plugin.info().backends, [TENSORRT_BACKEND]);
    assert!(plugin.is_available(), "the dylib finds the library through KV_TENSORRT_LIB");
    let through_abi = expect_clean_init_failure(plugin.init(&ctx(&blob)));
    assert_eq!(in_process, through_abi, "the ABI carries code and message unchanged");
    assert!(plugin.poisoned().is_none(), "a clean error does not poison the plugin");
    if let Some(message) = through_abi {
        eprintln!("init(native KV blob) through the ABI: NotSupported: {message}");
    }
}

fn tr01_with_payload(payload: &[u8]) -> Vec<u8> {
    let header = Header::new(
        TENSORRT_BACKEND,
        PayloadKind::TensorRtPlan,
        vec![Binding::untyped("input", Role::Input), Binding::untyped("output", Role::Output)],
        vec![],
    );
    blob_format::upstream::write_tr02(&header, payload).expect("representable")
}

#[test]
fn a_tensorrt_plan_is_refused_by_the_tensorrt_rtx_build_before_loading_anything() {
    let blob = tr01_with_payload(b"ftrt\0\0\0\0 a TensorRT 10 plan");
    let delegate = TensorRtDelegate::new();
    let Compatibility::Unsupported { reason } = delegate.compatibility(&blob) else {
        panic!("must be refused")
    };
    assert!(reason.contains("TensorRT plan (magic 'ftrt')"), "{reason}");
    let err = delegate.init(ctx(&blob)).expect_err("refused");
    assert_eq!(err.code, ErrorCode::NotSupported);
    assert!(err.message.contains("this delegate is built for TensorRT-RTX, which cannot read it"), "{err}");
}

#[test]
fn a_payload_that_is_no_plan_is_an_invalid_program() {
    let blob = tr01_with_payload(b"not an engine");
    let err = TensorRtDelegate::new().init(ctx(&blob)).expect_err("refused");
    assert_eq!(err.code, ErrorCode::InvalidProgram);
    assert!(err.message.contains("is not a TensorRT-RTX plan (magic 'vtrt') nor a TensorRT plan"), "{err}");
}

#[test]
fn a_blob_for_another_backend_is_incompatible() {
    let mut bytes = tr01_with_payload(b"vtrt");
    // Same blob, native format, other backend.
    let blob = blob_format::Blob::parse(&bytes).expect("parses");
    let mut header = blob.header.clone();
    header.backend_id = "ReferenceBackend".into();
    bytes = blob_format::native::to_vec(&header, b"vtrt");
    let err = TensorRtDelegate::new().init(ctx(&bytes)).expect_err("refused");
    assert_eq!(err.code, ErrorCode::DelegateInvalidCompatibility);
    assert_eq!(
        err.message,
        "the blob is for backend 'ReferenceBackend', this delegate serves 'TensorRTBackend'"
    );
}
