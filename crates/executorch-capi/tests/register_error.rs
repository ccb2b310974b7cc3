//! A registration that fails: `DELEGATE_PLUGIN_PATH` lists the reference delegate's library with a manifest
//! asking for isolation, which ExecuTorch's in-process delegates cannot honour. `kvd_register_backends`
//! returns `NotSupported`, registers nothing, says why through `kvd_last_error` (cut to the caller's buffer),
//! and succeeds when retried without it. One test in its own binary: it sets the process's environment, and
//! registration happens once per process.

use std::ffi::CStr;
use std::path::PathBuf;

use delegate_abi::host::HostConfig;
use host_runtime::plugin_manifest::PluginManifest;
use kv_delegate::{kvd_backend_count, kvd_backend_name, kvd_last_error, kvd_register_backends};

const LIBRARY: &str = "libreference_delegate_dylib.so";

/// `$DELEGATE_TEST_PLUGIN_DIR` (set by `cargo xtask test`): the built plugin libraries.
fn plugin_dir() -> PathBuf {
    let dir = std::env::var_os("DELEGATE_TEST_PLUGIN_DIR").map(PathBuf::from).expect(
        "DELEGATE_TEST_PLUGIN_DIR is set to the directory of libreference_delegate_dylib.so (cargo xtask test \
         sets it and builds the library)",
    );
    assert!(dir.join(LIBRARY).is_file(), "{} has no {LIBRARY}: run cargo xtask test", dir.display());
    dir
}

/// A directory holding (a link to) the reference delegate's library and a manifest written from it now
/// (`delegate-host plugin-manifest --isolate LIB`), asking for isolation.
fn asks_isolation() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let library = dir.path().join(LIBRARY);
    std::os::unix::fs::symlink(plugin_dir().join(LIBRARY), &library).expect("a link to the library");
    let described = host_runtime::plugins::describe_library(&library, &HostConfig::default())
        .unwrap_or_else(|err| panic!("{}: {err}", library.display()));
    let manifest = PluginManifest { isolate: true, ..described };
    std::fs::write(PluginManifest::path_for(&library), manifest.to_json()).expect("the manifest written");
    dir
}

/// The whole message and what a buffer of `cap` bytes receives.
fn last_error_into(cap: usize) -> (usize, Vec<u8>) {
    let mut buf = vec![b'x'; cap];
    // SAFETY: `buf` is writable for `cap` bytes.
    let len = unsafe { kvd_last_error(buf.as_mut_ptr().cast(), cap) };
    (len, buf)
}

#[test]
fn a_plugin_that_must_run_isolated_fails_registration_with_its_reason_and_a_retry_without_it_succeeds() {
    let dir = asks_isolation();
    // Before any registration in this process (this binary's only test).
    std::env::set_var("DELEGATE_PLUGIN_PATH", dir.path());

    assert_eq!(kvd_register_backends(), 0x10, "NotSupported");
    assert_eq!(kvd_backend_count(), 0, "nothing is listed as registered");
    let (len, buf) = last_error_into(8);
    assert_eq!(&buf[..], b"kvd_reg\0", "cut to 7 bytes and a NUL");
    // Measured only (a null buffer), it stays.
    // SAFETY: a null buffer is allowed.
    assert_eq!(unsafe { kvd_last_error(std::ptr::null_mut(), 0) }, len);
    let (whole, buf) = last_error_into(len + 1);
    assert_eq!(whole, len);
    let message = CStr::from_bytes_with_nul(&buf).expect("one NUL, at the end").to_str().expect("UTF-8");
    assert_eq!(message.len(), len);
    for part in ["kvd_register_backends: ", "backend 'ReferenceBackend'", "must run isolated", LIBRARY] {
        assert!(message.contains(part), "'{part}' not in: {message}");
    }
    // Copied whole, it is forgotten: a later failure's reader never gets it.
    assert_eq!(last_error_into(len + 1).0, 0);

    // A failure may be retried: without that library the embedded delegates register.
    std::env::remove_var("DELEGATE_PLUGIN_PATH");
    assert_eq!(kvd_register_backends(), 0, "{:?}", kv_delegate::last_error());
    let names: Vec<String> = (0..kvd_backend_count())
        // SAFETY: an index below the count gives a NUL-terminated id alive for the process.
        .map(|i| unsafe { CStr::from_ptr(kvd_backend_name(i)) }.to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().any(|n| n == "ReferenceBackend"), "{names:?}");
}
