//! Locates (building if needed) the real `abi-test` plugin dylib.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// `libabi_test.so` / `libabi_test.dylib` / `abi_test.dll`.
pub fn dylib_name(stem: &str) -> String {
    format!("{}{stem}{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX)
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The directory holding the built `abi-test` plugin: `$DELEGATE_TEST_PLUGIN_DIR` when set (by
/// `cargo xtask test`), else built once per test process into `target/plugin-tests` (a separate target dir,
/// so the outer cargo's lock is not contended).
pub fn plugin_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Some(dir) = std::env::var_os("DELEGATE_TEST_PLUGIN_DIR") {
            // A relative value is relative to the workspace root (tests run in the crate directory).
            let dir = workspace_root().join(dir);
            assert!(
                dir.join(dylib_name("abi_test")).is_file(),
                "DELEGATE_TEST_PLUGIN_DIR={} has no {}",
                dir.display(),
                dylib_name("abi_test")
            );
            return dir;
        }
        build(false)
    })
}

/// Builds `abi-test` into `target/plugin-tests`, returning the profile's output directory.
fn build(release: bool) -> PathBuf {
    let root = workspace_root();
    let target = root.join("target/plugin-tests");
    let mut cargo = Command::new(env!("CARGO"));
    cargo.current_dir(&root).args(["build", "--quiet", "-p", "abi-test", "--target-dir"]).arg(&target);
    if release {
        cargo.arg("--release");
    }
    let status = cargo.status().expect("cargo runs");
    assert!(status.success(), "building abi-test failed");
    target.join(if release { "release" } else { "debug" })
}

/// The `abi-test` plugin built with optimizations (for benchmarks), always built here.
pub fn abi_test_plugin_release() -> PathBuf {
    build(true).join(dylib_name("abi_test"))
}

/// Path of the shared `abi-test` dylib.
pub fn abi_test_plugin() -> PathBuf {
    plugin_dir().join(dylib_name("abi_test"))
}

/// A private copy of the plugin in a fresh temp dir: the dynamic loader loads it as a separate library,
/// so poisoning it does not affect other tests.
pub fn private_copy() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join(dylib_name("abi_test_private"));
    std::fs::copy(abi_test_plugin(), &path).expect("copy plugin");
    (dir, path)
}
