//! Compiles the C++ shim (`cpp/bridge.cpp`) against the ExecuTorch 1.5.1 wheel's headers and links the wheel's
//! `libexecutorch.so` and kernels library. The wheel comes from `cargo xtask test` (or `cargo xtask
//! executorch-setup`), which unpacks it under `.cache/executorch/` and sets `EXECUTORCH_ROOT`.

use std::path::PathBuf;

const ROOT_ENV: &str = "EXECUTORCH_ROOT";

fn main() {
    println!("cargo:rerun-if-env-changed={ROOT_ENV}");
    println!("cargo:rerun-if-changed=cpp/bridge.cpp");
    let root = match std::env::var_os(ROOT_ENV).map(PathBuf::from) {
        Some(root) if root.join("lib").join("libexecutorch.so").is_file() => root,
        other => {
            let found = match other {
                Some(root) => format!("{ROOT_ENV}={} has no lib/libexecutorch.so", root.display()),
                None => format!("{ROOT_ENV} is not set"),
            };
            // One clear line, not a wall of compiler errors (nor a panic's backtrace note).
            eprintln!(
                "error: executorch-bridge needs the ExecuTorch 1.5.1 wheel ({found}): run `cargo xtask test`, or \
                 `cargo xtask executorch-setup` and export the {ROOT_ENV} it prints (the wheel's `executorch/` \
                 directory)"
            );
            std::process::exit(1);
        }
    };
    let include = root.join("include");
    let lib = root.join("lib");
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .file("cpp/bridge.cpp")
        .define("C10_USING_CUSTOM_GENERATED_MACROS", None)
        // -isystem: the wheel's headers are not ours to warn about (unused parameters, deprecations).
        .flag("-isystem")
        .flag(include.display().to_string())
        .flag("-isystem")
        .flag(include.join("executorch/runtime/core/portable_type/c10").display().to_string())
        .compile("executorch_bridge_shim");
    println!("cargo:rustc-link-search=native={}", lib.display());
    // The kernels library registers its operators from static initialisers: without --no-as-needed the linker
    // drops it (nothing references it) and every KernelCall fails with OperatorMissing (0x14).
    println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
    println!("cargo:rustc-link-arg=-L{}", lib.display());
    println!("cargo:rustc-link-arg=-lexecutorch_kernels_optimized");
    println!("cargo:rustc-link-arg=-lexecutorch_threadpool");
    println!("cargo:rustc-link-arg=-Wl,--as-needed");
    println!("cargo:rustc-link-lib=dylib=executorch");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    println!("cargo:rustc-env={ROOT_ENV}={}", root.display());
}
