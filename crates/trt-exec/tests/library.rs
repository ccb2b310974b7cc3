//! Finding the TensorRT-RTX library.

use et_error::{ErrorCode, HasErrorCode};
use trt_exec::library;

#[test]
fn a_missing_library_is_not_supported_and_says_how_to_get_it() {
    let err =
        library::probe(std::path::Path::new("/nonexistent/libtensorrt_rtx.so.1")).expect_err("no such file");
    assert_eq!(err.error_code(), ErrorCode::NotSupported);
    assert_eq!(
        err.to_string(),
        "TensorRT-RTX library not found (tried /nonexistent/libtensorrt_rtx.so.1): dlopen failed: \
         /nonexistent/libtensorrt_rtx.so.1: \
         cannot open shared object file: No such file or directory; set KV_TENSORRT_LIB to the path of \
         libtensorrt_rtx.so.1 (`cargo xtask test` installs it into .cache/tensorrt)"
    );
}

#[test]
fn a_file_that_is_no_tensorrt_library_is_refused() {
    // libc is loadable but has no getInferLibVersion.
    let err = library::probe(std::path::Path::new("libc.so.6")).expect_err("not TensorRT");
    assert!(err.to_string().contains("getInferLibMajorVersion"), "{err}");
}

#[test]
fn the_configured_library_is_tensorrt_rtx_1_7() {
    let path = library::configured_path().expect(library::NOT_CONFIGURED);
    let version = library::probe(&path).expect("loads");
    assert_eq!((version.major, version.minor), (1, 7));
    assert!(version.reports_aliases());
    assert_eq!(library::load().expect("loads").version, version);
}
