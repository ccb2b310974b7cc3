//! Kernel tuning for GPU sweeps (feature `tuning`, which `cargo xtask bench-gpu` builds the bundle with): the
//! NVRTC defines in `KV_CUDA_DEFINES` (e.g. `-DGEMV_PRE=2 -DATTN_U=2`) are added to every module's options, so
//! one session on the GPU measures several settings of the sources' tunables (the `#ifndef` defaults in
//! `kernels.cu` and `kernels/linear.cu`) with `run.sh sweep`. Without the feature the sources compile as
//! written, whatever the environment says.

use std::sync::Arc;

use cuda_rt::{Context, Module};

/// The variable a sweep sets.
pub const DEFINES_ENV: &str = "KV_CUDA_DEFINES";

/// `base` and, with the `tuning` feature, the `-D` options of [`DEFINES_ENV`] (anything else there is left
/// out, with a warning).
pub fn options(base: &[&str]) -> Vec<String> {
    let mut options: Vec<String> = base.iter().map(|&o| o.to_owned()).collect();
    if cfg!(feature = "tuning") {
        let defines = std::env::var(DEFINES_ENV).unwrap_or_default();
        for word in defines.split_whitespace() {
            if word.starts_with("-D") {
                options.push(word.to_owned());
            } else {
                tracing::warn!("{DEFINES_ENV}: '{word}' is not a -D define; left out");
            }
        }
    }
    options
}

/// `source` compiled on `ctx`'s device with [`options`] of `base` (through `cuda-rt`'s module cache).
pub fn compile_module(ctx: &Context, source: &str, base: &[&str]) -> cuda_rt::Result<Arc<Module>> {
    let options = options(base);
    let options: Vec<&str> = options.iter().map(String::as_str).collect();
    ctx.compile_module(source, &options)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sweep's defines reach NVRTC only in a build with the `tuning` feature (the GPU bundle), and only the
    /// `-D` ones; any other build compiles the sources as written whatever the environment says. The only
    /// test that sets the variable, so no other test sees it.
    #[test]
    fn defines_apply_only_with_the_tuning_feature() {
        std::env::set_var(DEFINES_ENV, "-DGEMV_PRE=2 --use_fast_math -DATTN_U=2");
        let got = options(&["-DKV_F16"]);
        std::env::remove_var(DEFINES_ENV);
        if cfg!(feature = "tuning") {
            assert_eq!(got, ["-DKV_F16", "-DGEMV_PRE=2", "-DATTN_U=2"]);
        } else {
            assert_eq!(got, ["-DKV_F16"]);
        }
    }
}
