//! Gives this crate's test binaries a run path to the executorch wheel's `lib/` (from `EXECUTORCH_ROOT`, as
//! executorch-bridge's build script reads it), so they start without `LD_LIBRARY_PATH`. The libraries this
//! crate ships record no build-machine path: `libkv_delegate.so`'s only run path is `$ORIGIN`, so a
//! `libexecutorch.so` installed beside it is found (the application chooses where).

fn main() {
    // `$ORIGIN` reaches the linker as written (cargo starts it without a shell).
    println!("cargo:rustc-link-arg-cdylib=-Wl,-rpath,$ORIGIN");
    println!("cargo:rerun-if-env-changed=EXECUTORCH_ROOT");
    // Without it executorch-bridge's build script stops the build with the one line that says what to do.
    if let Some(root) = std::env::var_os("EXECUTORCH_ROOT") {
        let lib = std::path::Path::new(&root).join("lib");
        println!("cargo:rustc-link-arg-tests=-Wl,-rpath,{}", lib.display());
    }
}
