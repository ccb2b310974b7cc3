//! Kernel tuning for GPU sweeps (feature `tuning`, which `cargo xtask bench-gpu` builds the bundle with): the
//! NVRTC defines in `KV_CUDA_DEFINES` (e.g. `-DGEMV_PRE=2 -DATTN_U=2`) are added to every module's options, so
//! one session on the GPU measures several settings of the sources' tunables (the `#ifndef` defaults in
//! `kernels.cu` and `kernels/linear.cu`) with `run.sh sweep`. Without the feature the sources compile as
//! written, whatever the environment says.

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
