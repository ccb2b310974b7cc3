//! Kernel tuning for GPU sweeps (feature `tuning`, which `cargo xtask bench-gpu` builds the bundle with): the
//! NVRTC defines in `KV_CUDA_DEFINES` (e.g. `-DGEMV_PRE=2 -DATTN_U=2`) are added to every module's options, so
//! one session on the GPU measures several settings of the sources' tunables (the `#ifndef` defaults in
//! `kernels.cu`, `kernels/attention_tc.cu` and `kernels/linear.cu`) with `run.sh sweep`. A few settings are
//! read on the host side too ([`override_of`]): waves of blocks, `-DKV_ATTN_CLUSTER_MAX=N`, the most
//! blocks an attention cluster may take (0: the ticket merge everywhere), `-DKV_ATTN_CLUSTER_TILES=N`, the
//! most tiles a warp of a cluster takes (1: clusters only where a tile a warp covers the cache), and
//! `-DKV_CARVEOUT=P`, the share of each SM's L1 every typed kernel prefers as shared memory (in percent;
//! unset: the driver's choice). Without the feature the sources compile as written, whatever the environment
//! says.
//!
//! Three defines are diagnostics, not settings. Two price the attention merge and give wrong outputs:
//! `-DKV_DIAG_NO_MERGE` ends every `attention_tc` block after its partial (no ticket, no merge),
//! `-DKV_DIAG_TICKET_ONLY` takes the ticket and skips the merge. With `-DKV_TRACE`, `-DKV_TRACE_MERGE` marks
//! a merging block's ticket and the end of its loads in the trace (`trace_summary.py --attention`).

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

/// With the `tuning` feature, the value of `-D<name>=<value>` in [`DEFINES_ENV`] when it is a number, else
/// `default`: a sweep also sets the few launch rules measured with it (e.g. `-DKV_GEMV_STAGE_MIN_BLOCKS=1024`),
/// which NVRTC receives as an unused define.
pub fn override_of(name: &str, default: u64) -> u64 {
    define_of(name).unwrap_or(default)
}

/// With the `tuning` feature, the value of `-D<name>=<value>` in [`DEFINES_ENV`] when it is a number; `None`
/// otherwise: for a setting with no default of its own (`-DKV_CARVEOUT`: unset, the driver chooses).
pub fn define_of(name: &str) -> Option<u64> {
    if !cfg!(feature = "tuning") {
        return None;
    }
    let defines = std::env::var(DEFINES_ENV).unwrap_or_default();
    let prefix = format!("-D{name}=");
    defines.split_whitespace().find_map(|word| word.strip_prefix(&prefix)?.parse().ok())
}

/// Where a tuning build writes the kernels' trace when the delegate is torn down (see `kernels/trace.cuh`).
pub const TRACE_ENV: &str = "KV_CUDA_TRACE";

/// With the `tuning` feature and [`TRACE_ENV`] set, writes `module`'s trace ring to `<TRACE_ENV>.<tag>`: the
/// number of records ever taken (u64, little-endian), then the ring (`KV_TRACE_CAP` records of four u64). A
/// module compiled without `-DKV_TRACE` has no ring, which is logged. Diagnostics only: nothing reads it back.
pub fn dump_trace(module: &Module, tag: &str) {
    if !cfg!(feature = "tuning") {
        return;
    }
    let Some(path) = std::env::var_os(TRACE_ENV) else { return };
    let mut path = std::path::PathBuf::from(path).into_os_string();
    path.push(format!(".{tag}"));
    let ring = module.read_global("kv_trace_n").and_then(|n| Ok((n, module.read_global("kv_trace")?)));
    let written = match ring {
        Ok((n, records)) => {
            let taken = n.get(..4).and_then(|b| b.try_into().ok()).map_or(0, u32::from_le_bytes);
            let mut bytes = u64::from(taken).to_le_bytes().to_vec();
            bytes.extend_from_slice(&records);
            std::fs::write(&path, bytes).map_err(|e| e.to_string())
        }
        Err(e) => Err(format!("no trace in the module (compiled without -DKV_TRACE?): {e}")),
    };
    if let Err(e) = written {
        tracing::warn!("{TRACE_ENV}: {}: {e}", path.to_string_lossy());
    }
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

    /// A sweep's defines reach NVRTC, and its numeric rule overrides the launches, only in a build with the
    /// `tuning` feature (the GPU bundle), and only the `-D` ones; any other build compiles the sources as
    /// written and keeps its rules, whatever the environment says. The only test that sets the variable, so
    /// no other test sees it.
    #[test]
    fn defines_and_overrides_apply_only_with_the_tuning_feature() {
        std::env::set_var(DEFINES_ENV, "-DGEMV_PRE=2 --use_fast_math -DATTN_U=2");
        let got = options(&["-DKV_F16"]);
        std::env::remove_var(DEFINES_ENV);
        if cfg!(feature = "tuning") {
            assert_eq!(got, ["-DKV_F16", "-DGEMV_PRE=2", "-DATTN_U=2"]);
        } else {
            assert_eq!(got, ["-DKV_F16"]);
        }
        std::env::set_var(DEFINES_ENV, "-DATTN_U=2 -DKV_RULE=7 -DKV_BAD=x");
        let rules = [override_of("KV_RULE", 3), override_of("KV_BAD", 3), override_of("KV_NONE", 3)];
        let settings = [define_of("KV_RULE"), define_of("KV_BAD"), define_of("KV_NONE")];
        std::env::remove_var(DEFINES_ENV);
        let want = if cfg!(feature = "tuning") { [7, 3, 3] } else { [3, 3, 3] };
        assert_eq!(rules, want, "a rule's override is a number, and only in a tuning build");
        let want = if cfg!(feature = "tuning") { [Some(7), None, None] } else { [None; 3] };
        assert_eq!(settings, want, "a setting is a number, set only in a tuning build");
    }
}
