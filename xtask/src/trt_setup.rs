//! `cargo xtask test` setup for the TensorRT crates: installs what the real-TensorRT tests need when missing.
//!
//! What it installs, and where:
//! - `libclang-dev` through `apt-get` (only when no `libclang*.so` is found): `trtx-sys` runs autocxx/bindgen at
//!   build time, which needs libclang (< 22). Without it `cargo build -p trt-exec` fails in `trtx-sys`'s build
//!   script. Needs root; a failed install is retried once after `apt-get update`.
//! - The TensorRT-RTX runtime library, from PyPI's `tensorrt-rtx-cu13-libs==1.7.1.116` wheel, downloaded with
//!   `python3 -m pip download --no-deps` into `<root>/.cache/tensorrt/` and unpacked there with Python's own
//!   `zipfile` (nothing is pip-installed into the system). The wheel's `libtensorrt_rtx.so.1` depends only on
//!   glibc/libstdc++ (`ldd`: librt, libdl, libpthread, libstdc++, libm, libgcc_s, libc); it loads CUDA itself
//!   at run time, so no CUDA wheel is needed for building engines on a CPU-only machine.
//!
//! Environment variables the TensorRT tests read (returned by [`TrtEnv::vars`]):
//! - [`TRT_LIB_ENV`] (`KV_TENSORRT_LIB`): full path of `libtensorrt_rtx.so.1`. `trt-exec` and the
//!   `tensorrt-delegate` plugin load the library from this path first, then from the standard loader path.
//! - `LD_LIBRARY_PATH`: the library's directory prepended, so a plain `dlopen("libtensorrt_rtx.so.1")` works too.
//! - `LIBCLANG_PATH`: the directory holding `libclang.so`, when it was found outside the default search path.
//!
//! Tests that need TensorRT fail (never silently pass) with a message naming `cargo xtask test` when
//! [`TRT_LIB_ENV`] is absent.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;

/// Name of the environment variable holding the full path of `libtensorrt_rtx.so.1`.
pub const TRT_LIB_ENV: &str = "KV_TENSORRT_LIB";

/// The PyPI wheel that carries the TensorRT-RTX runtime and builder.
pub const WHEEL_REQUIREMENT: &str = "tensorrt-rtx-cu13-libs==1.7.1.116";

/// File name of the library inside the wheel.
pub const LIB_NAME: &str = "libtensorrt_rtx.so.1";

/// What the TensorRT tests need in their environment.
#[derive(Debug, Clone)]
pub struct TrtEnv {
    /// Directory holding `libtensorrt_rtx.so.1`.
    pub lib_dir: PathBuf,
    /// Full path of `libtensorrt_rtx.so.1`.
    pub lib_path: PathBuf,
    /// Directory of `libclang.so`, when found outside the default search path.
    pub libclang_dir: Option<PathBuf>,
}

impl TrtEnv {
    /// Environment variables to set on `cargo test`/`cargo build` for the TensorRT crates.
    pub fn vars(&self) -> Vec<(String, String)> {
        let mut vars = vec![(TRT_LIB_ENV.to_owned(), self.lib_path.display().to_string())];
        let ld = match std::env::var("LD_LIBRARY_PATH") {
            Ok(old) if !old.is_empty() => format!("{}:{old}", self.lib_dir.display()),
            _ => self.lib_dir.display().to_string(),
        };
        vars.push(("LD_LIBRARY_PATH".to_owned(), ld));
        if let Some(dir) = &self.libclang_dir {
            vars.push(("LIBCLANG_PATH".to_owned(), dir.display().to_string()));
        }
        vars
    }

    /// Applies [`TrtEnv::vars`] to a command.
    pub fn apply(&self, cmd: &mut Command) {
        for (key, value) in self.vars() {
            cmd.env(key, value);
        }
    }
}

/// Installs what is missing and returns where things are. Idempotent: a second call does no network I/O.
pub fn ensure(root: &Path) -> anyhow::Result<TrtEnv> {
    let libclang_dir = ensure_libclang()?;
    let lib_path = ensure_wheel(root)?;
    let lib_dir = lib_path.parent().context("library path has no parent directory")?.to_path_buf();
    Ok(TrtEnv { lib_dir, lib_path, libclang_dir })
}

/// Finds `libclang*.so*`; installs `libclang-dev` through apt-get when none is found.
fn ensure_libclang() -> anyhow::Result<Option<PathBuf>> {
    if let Some(found) = find_libclang() {
        return Ok(found);
    }
    eprintln!("xtask: libclang not found; installing libclang-dev with apt-get (trtx-sys needs it to build)");
    crate::util::apt_install("libclang-dev")?;
    find_libclang().context("libclang-dev was installed but no libclang*.so was found under /usr/lib")
}

/// `Some(None)`: found on the default path (or `LIBCLANG_PATH` already set); `Some(Some(dir))`: found in `dir`.
fn find_libclang() -> Option<Option<PathBuf>> {
    if let Ok(dir) = std::env::var("LIBCLANG_PATH") {
        if has_libclang(Path::new(&dir)) {
            return Some(None);
        }
    }
    let mut candidates: Vec<PathBuf> =
        vec![PathBuf::from("/usr/lib/x86_64-linux-gnu"), PathBuf::from("/usr/lib")];
    if let Ok(entries) = std::fs::read_dir("/usr/lib") {
        let mut llvm: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("llvm-")))
            .map(|p| p.join("lib"))
            .collect();
        llvm.sort();
        llvm.reverse();
        candidates.extend(llvm);
    }
    candidates.into_iter().find(|dir| has_libclang(dir)).map(Some)
}

fn has_libclang(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries.filter_map(Result::ok).any(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with("libclang") && name.contains(".so") && !name.starts_with("libclang-cpp")
        })
    })
}

/// Downloads and unpacks the wheel into `<root>/.cache/tensorrt/` unless the library is already there.
fn ensure_wheel(root: &Path) -> anyhow::Result<PathBuf> {
    let cache = root.join(".cache").join("tensorrt");
    let unpacked = cache.join("tensorrt-rtx-1.7.1.116");
    let lib = unpacked.join("tensorrt_rtx_libs").join(LIB_NAME);
    crate::util::pip_wheel(&cache, WHEEL_REQUIREMENT, "tensorrt_rtx_cu13_libs-1.7.1.116", &unpacked, &lib)?;
    Ok(lib)
}
