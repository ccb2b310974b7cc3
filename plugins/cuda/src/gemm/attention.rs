//! The prefill's attention on tensor cores (`kernels/prefill_attention.cu`): flash attention of a chunk of
//! many query rows over the caches, each row causal at its own position. An attention step of
//! [`PREFILL_ATTENTION_MIN_ROWS`] rows or more that the engine lowers to the tensor-core attention
//! (`attention_tc`, one block per query row and head block, each reading its whole prefix of the cache) runs
//! this kernel instead, with the same parameters: a block takes [`PREFILL_ROWS`] query rows of one head and
//! reads each cache tile once for all of them. Decode steps (one row) never do.

use cuda_rt::{Context, Function, LaunchConfig};

use crate::kernels::{self, AttnP, Kernels, Launch};
use crate::plan::Float;

/// Fewest query rows an attention takes the prefill kernel at: a block's warp of 16 rows full (fewer keep the
/// decode kernels, whose blocks a row each spread a short chunk over more of the GPU).
pub const PREFILL_ATTENTION_MIN_ROWS: u32 = 16;
/// Query rows a block of the prefill kernel takes (`PF_ROWS` in the source).
pub const PREFILL_ROWS: u32 = 64;
/// Threads of a block (`PF_WARPS` warps).
const PREFILL_THREADS: u32 = 128;

/// The prefill kernel's entries (heads of 64 and 128 values) in each typed module of an engine, by the module's
/// index, where the module has them (f16 and bf16 on sm_80 and later: [`kernels::has_attention_tc`]).
#[derive(Debug)]
pub(crate) struct PrefillAttention {
    entries: Vec<Option<[Function; 2]>>,
}

impl PrefillAttention {
    /// The entries of `typed`'s modules (taken from the process's module cache: the modules `typed` loaded).
    pub(crate) fn load(ctx: &Context, typed: &[(Float, Kernels)]) -> cuda_rt::Result<PrefillAttention> {
        let entries = typed
            .iter()
            .map(|&(float, _)| {
                if !kernels::has_attention_tc(float, ctx.compute_capability()) {
                    return Ok(None);
                }
                let module = kernels::tuning::compile_module(ctx, kernels::SOURCE, kernels::options(float))?;
                Ok(Some([module.function("attention_prefill64")?, module.function("attention_prefill128")?]))
            })
            .collect::<cuda_rt::Result<_>>()?;
        Ok(PrefillAttention { entries })
    }

    /// The prefill kernel's launch in place of `launch` (module `module`'s), when it is a tensor-core attention
    /// of [`PREFILL_ATTENTION_MIN_ROWS`] rows or more without a soft cap.
    pub(crate) fn replacing(&self, module: usize, launch: &Launch) -> Option<(LaunchConfig, AttnP)> {
        let (Launch::AttentionTc(_, p) | Launch::AttentionTcCluster(_, p)) = launch else { return None };
        let has = self.entries.get(module).is_some_and(Option::is_some);
        prefill_config(p, has).map(|config| (config, *p))
    }

    /// The entry of module `module` for `p`'s heads (a launch [`PrefillAttention::replacing`] gave), which
    /// the engine's launches queue with `p` (the crate's FFI layer).
    pub(crate) fn entry(&self, module: usize, p: &AttnP) -> cuda_rt::Result<&Function> {
        let missing = || cuda_rt::Error::OutOfRange {
            call: "launching attention_prefill",
            what: "a module without the prefill attention".into(),
        };
        let entries = self.entries.get(module).and_then(Option::as_ref).ok_or_else(missing)?;
        Ok(&entries[usize::from(p.dh == 128)])
    }
}

/// The prefill kernel's launch for an attention `p` (a module that `has` the kernel): blocks of
/// [`PREFILL_ROWS`] query rows by query heads; `None` for fewer than [`PREFILL_ATTENTION_MIN_ROWS`] rows, a
/// soft cap, or heads other than 64 or 128 values. Every parameter is named (none is `..`): one added to the
/// attention is a compile error here until the prefill kernel honours it or refuses it.
fn prefill_config(p: &AttnP, has: bool) -> Option<LaunchConfig> {
    // What the kernel reads: the tensors, the position and error word, the extents, strides, group and scale.
    // What it needs not: the ranges and their merge (`o_part`, `ml`, `counters`, `splits`, `hpb`), the lanes
    // of the decode kernel's rows (`lanes`), reading ahead (`early`: it waits first); `vec_ok` is the tensor-core
    // attention's own condition, which the launch it replaces met.
    let AttnP {
        q: _,
        k: _,
        v: _,
        out: _,
        pos: _,
        o_part: _,
        ml: _,
        counters: _,
        err: _,
        tq,
        h,
        l: _,
        dh,
        splits: _,
        vec_ok,
        scale: _,
        lanes: _,
        q_ts: _,
        q_hs: _,
        group: _,
        early: _,
        hpb: _,
        softcap,
    } = *p;
    let rows = u32::try_from(tq).ok()?;
    let fits =
        has && vec_ok != 0 && rows >= PREFILL_ATTENTION_MIN_ROWS && softcap == 0.0 && matches!(dh, 64 | 128);
    let grid = (rows.div_ceil(PREFILL_ROWS), u32::try_from(h).ok()?, 1);
    fits.then_some(LaunchConfig { grid, block: (PREFILL_THREADS, 1, 1), shared_mem_bytes: 0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attn(tq: i32, h: i32, dh: i32, softcap: f32) -> AttnP {
        AttnP {
            q: 0,
            k: 0,
            v: 0,
            out: 0,
            pos: 0,
            o_part: 0,
            ml: 0,
            counters: 0,
            err: 0,
            tq,
            h,
            l: 4096,
            dh,
            splits: 1,
            vec_ok: 1,
            scale: 0.125,
            lanes: 8,
            q_ts: h * dh,
            q_hs: dh,
            group: 4,
            early: 0,
            hpb: 4,
            softcap,
        }
    }

    /// A chunk of 16 rows or more takes the prefill kernel, a block per 64 rows and query head; a decode step,
    /// a short chunk, a soft cap, another head size or a module without the kernel keeps the launch it had.
    #[test]
    fn long_chunks_take_the_prefill_kernel() {
        let config = prefill_config(&attn(1000, 32, 64, 0.0), true).expect("a prefill of 1000 rows");
        assert_eq!((config.grid, config.block, config.shared_mem_bytes), ((16, 32, 1), (128, 1, 1), 0));
        assert_eq!(prefill_config(&attn(16, 8, 128, 0.0), true).map(|c| c.grid), Some((1, 8, 1)));
        for (p, has) in [
            (attn(1, 32, 64, 0.0), true),
            (attn(15, 32, 64, 0.0), true),
            (attn(64, 32, 64, 0.5), true),
            (attn(64, 32, 96, 0.0), true),
            (attn(64, 32, 64, 0.0), false),
        ] {
            assert_eq!(prefill_config(&p, has), None, "{} rows, dh {}, cap {}", p.tq, p.dh, p.softcap);
        }
    }

    /// The kernels compile under NVRTC for the H200's architecture: the prefill entries exist in the f16 and
    /// bf16 modules and not in f32's (which has no tensor-core attention). Needs NVRTC, not a GPU (as
    /// `kernels_compile_for_every_element_type`).
    #[test]
    fn the_prefill_attention_compiles_where_the_tensor_core_attention_does() {
        for float in [Float::F32, Float::F16, Float::Bf16] {
            let mut opts = vec!["--gpu-architecture=compute_90"];
            opts.extend_from_slice(kernels::options(float));
            match cuda_rt::compile_ptx(kernels::SOURCE, &opts) {
                Ok(ptx) => {
                    for entry in ["attention_prefill64", "attention_prefill128"] {
                        let has = ptx.contains(&format!(".entry {entry}("));
                        assert_eq!(has, kernels::has_attention_tc(float, (9, 0)), "{float:?}: {entry}");
                    }
                }
                Err(err) => {
                    assert!(
                        std::env::var_os("KV_REQUIRE_NVRTC").is_none(),
                        "KV_REQUIRE_NVRTC is set but: {err}"
                    );
                    eprintln!("needs NVRTC, not run here: {err}");
                    return;
                }
            }
        }
    }
}
