//! The kernels of `kernels.cu` (and `kernels/linear.cu`, appended to it): their parameter structs (mirrored
//! field for field, `#[repr(C)]`), the compiled module per element type, and the launches; the untyped
//! kernels of the general path are in [`general`], and the launches' sizes (blocks, entries, ranges, shared
//! memory: pure rules) in `sizing`, re-exported here. This module is the delegate's FFI layer: the only
//! `unsafe` code of the crate is here, each launch's contract is written down on [`Kernels::launch`].

use std::ffi::c_void;
use std::sync::Arc;

use cuda_rt::{Context, DevicePtr, Function, LaunchConfig, Module, StreamRef};

use crate::plan::Float;

pub mod general;
mod sizing;
pub mod tuning;

pub use sizing::*;

/// The CUDA C source of the typed kernels, compiled by NVRTC at `init` (once per process per device and
/// element type).
pub const SOURCE: &str = concat!(
    include_str!("kernels/common.cuh"),
    include_str!("kernels/trace.cuh"),
    include_str!("kernels.cu"),
    include_str!("kernels/attention_tc.cu"),
    include_str!("kernels/prefill_attention.cu"),
    include_str!("kernels/linear.cu")
);

/// NVRTC options for an element type.
pub fn options(float: Float) -> &'static [&'static str] {
    match float {
        Float::F32 => &[],
        Float::F16 => &["-DKV_F16"],
        Float::Bf16 => &["-DKV_BF16"],
    }
}

/// Values per 16-byte vector load (`VEC` in the source).
pub const fn vec_width(float: Float) -> u32 {
    match float {
        Float::F32 => 4,
        Float::F16 | Float::Bf16 => 8,
    }
}

/// `GatherP`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct GatherP {
    pub table: DevicePtr,
    pub idx: DevicePtr,
    pub table2: DevicePtr,
    pub pos2: DevicePtr,
    pub out: DevicePtr,
    pub err: DevicePtr,
    pub rows: i32,
    pub n: i32,
    pub n2: i32,
    pub dim: i32,
    pub scale: DevicePtr,
}

/// `AddP`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AddP {
    pub a: DevicePtr,
    pub b: DevicePtr,
    pub out: DevicePtr,
    pub n: i64,
}

/// `RmsP`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RmsP {
    pub x: DevicePtr,
    pub w: DevicePtr,
    pub b: DevicePtr,
    pub out: DevicePtr,
    pub rows: i32,
    pub dim: i32,
    pub eps: f32,
    pub centred: i32,
    pub res: DevicePtr,
}

/// `GemvP` (`kernels/linear.cu`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct GemvP {
    pub a: DevicePtr,
    pub w: [DevicePtr; 3],
    pub bias: [DevicePtr; 3],
    pub res: [DevicePtr; 3],
    pub y: [DevicePtr; 3],
    pub cache: [DevicePtr; 3],
    pub norm_w: DevicePtr,
    pub norm_b: DevicePtr,
    pub pos: DevicePtr,
    pub err: DevicePtr,
    pub n: [i32; 3],
    pub m: i32,
    pub k: i32,
    pub nmat: i32,
    pub vec_ok: i32,
    pub eps: f32,
    pub h: i32,
    pub l: i32,
    pub dh: i32,
    pub early: i32,
    pub cos: DevicePtr,
    pub sin: DevicePtr,
    pub rope_half: i32,
    pub rope_mats: i32,
    pub staged: i32,
    pub groups: i32,
    pub centred: i32,
    pub activation: i32,
    pub row_off: [i32; 3],
    pub row_group: [i32; 3],
    pub row_stride: [i32; 3],
    pub rope_dh: i32,
    pub res2: [DevicePtr; 3],
    pub cap_div: DevicePtr,
    pub cap_mul: DevicePtr,
}

/// `GemvP::activation` for a GEMV's GELU ([`crate::plan::Step::Gemv`]): `ref_graph::UnaryFn`'s index, as
/// the general path's `unary` numbers its functions (`Gelu` 11, `GeluTanh` 12).
pub fn activation_code(func: ref_graph::UnaryFn) -> i32 {
    func as i32
}

/// `KvP`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KvP {
    pub cache: [DevicePtr; 2],
    pub upd: [DevicePtr; 2],
    pub pos: DevicePtr,
    pub err: DevicePtr,
    pub n: i32,
    pub tq: i32,
    pub h: i32,
    pub l: i32,
    pub dh: i32,
    pub u_ts: i32,
    pub u_hs: i32,
}

/// `AttnP`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AttnP {
    pub q: DevicePtr,
    pub k: DevicePtr,
    pub v: DevicePtr,
    pub out: DevicePtr,
    pub pos: DevicePtr,
    pub o_part: DevicePtr,
    pub ml: DevicePtr,
    pub counters: DevicePtr,
    pub err: DevicePtr,
    pub tq: i32,
    pub h: i32,
    pub l: i32,
    pub dh: i32,
    pub splits: i32,
    pub vec_ok: i32,
    pub scale: f32,
    pub lanes: i32,
    pub q_ts: i32,
    pub q_hs: i32,
    pub group: i32,
    pub early: i32,
    pub hpb: i32,
    /// Logit soft-capping `c` (scores become `c * tanh(s / c)`); 0 for none.
    pub softcap: f32,
}

/// `ArgmaxP`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ArgmaxP {
    pub x: DevicePtr,
    pub out: DevicePtr,
    pub part_v: DevicePtr,
    pub part_i: DevicePtr,
    pub counter: DevicePtr,
    pub m: i32,
    pub n: i32,
}

/// Queues kernel `f` with its one parameter struct `p`, overlapping the previous kernel of `stream` when
/// `overlapped`.
///
/// # Safety
/// `P` is the `#[repr(C)]` mirror of `f`'s parameter struct; every address in `p` is device-accessible
/// memory of `f`'s context, valid for the extents `p` describes and used by nothing else until `stream` has
/// run the kernel; `stream` belongs to the same context; with `overlapped`, `f` waits with `pdl_wait`
/// before it touches memory the previous kernel uses (`Function::launch_overlapped`'s contract).
pub(crate) unsafe fn go<P: Copy>(
    f: &Function,
    config: LaunchConfig,
    stream: StreamRef<'_>,
    p: &P,
    overlapped: bool,
) -> cuda_rt::Result<()> {
    // SAFETY: one parameter, a pointer to a value of the kernel's single parameter struct (mirrored
    // `#[repr(C)]`), read during the call; the memory it addresses is valid per this function's contract.
    with_params(p, |params| unsafe {
        if overlapped {
            f.launch_overlapped(config, stream, params)
        } else {
            f.launch(config, stream, params)
        }
    })
}

/// As [`go`], in clusters of `cluster` blocks ([`Function::launch_clustered`]).
///
/// # Safety
/// As [`go`]; and `f` was written for clusters of this shape.
pub(crate) unsafe fn go_clustered<P: Copy>(
    f: &Function,
    config: LaunchConfig,
    cluster: (u32, u32, u32),
    stream: StreamRef<'_>,
    p: &P,
    overlapped: bool,
) -> cuda_rt::Result<()> {
    // SAFETY: as `go`'s; and the kernel is written for the cluster, per this function's contract.
    with_params(p, |params| unsafe { f.launch_clustered(config, cluster, overlapped, stream, params) })
}

/// Calls `launch` with a kernel's parameter array for its one parameter struct: a pointer to a copy of `p`,
/// alive across the call.
fn with_params<P: Copy, R>(p: &P, launch: impl FnOnce(&mut [*mut c_void]) -> R) -> R {
    let mut value = *p;
    let mut params = [(&mut value as *mut P).cast::<c_void>()];
    launch(&mut params)
}

/// One kernel launch, its parameters resolved to addresses.
#[derive(Debug, Clone, Copy)]
pub enum Launch {
    Gather(LaunchConfig, GatherP),
    Add(LaunchConfig, AddP),
    RmsNorm(LaunchConfig, RmsP),
    Gemv(LaunchConfig, GemvP, GemvEntry),
    /// A gate and up GEMV that writes silu(gate) * up, or gelu(gate) * up (`gemv_glu`).
    GemvGlu(LaunchConfig, GemvP, GemvEntry),
    /// A GEMV that stores some of its products rotated by RoPE (`gemv_rope`).
    GemvRope(LaunchConfig, GemvP, GemvEntry),
    KvUpdate(LaunchConfig, KvP),
    Attention(LaunchConfig, AttnP),
    /// An attention on tensor cores (`attention_tc`): only in a module that [`Kernels::has_attention_tc`].
    AttentionTc(LaunchConfig, AttnP),
    /// An attention on tensor cores whose ranges merge in a cluster (`attention_tc_cluster`, clusters of
    /// (1, `splits`, 1) blocks): only where [`Kernels::attention_cluster`] holds `splits` blocks a cluster and
    /// the launch's clusters at once.
    AttentionTcCluster(LaunchConfig, AttnP),
    Argmax(LaunchConfig, ArgmaxP),
}

/// The functions of one compiled module (one element type on one device).
#[derive(Debug)]
pub struct Kernels {
    module: Arc<Module>,
    gather: Function,
    add: Function,
    rms_norm: Function,
    /// Each GEMV kind's entries (plain, gate/up, rotated), in the order of [`GemvEntry`].
    gemv: [Function; 3],
    gemv_glu: [Function; 3],
    gemv_rope: [Function; 3],
    kv_update: Function,
    attention: Function,
    /// `attention_tc`, where the module has it ([`has_attention_tc`]).
    attention_tc: Option<Function>,
    /// `attention_tc_cluster` and what the device holds of it, where the device runs clusters.
    attention_cluster: Option<(Function, ClusterRoom)>,
    argmax: Function,
}

/// `attention_tc_cluster` of `module` with what the device holds of it, where the device runs clusters of
/// more than one block (compute capability 9.0 and later); else `None`.
fn attention_cluster(
    ctx: &Context,
    module: &Arc<Module>,
    float: Float,
) -> cuda_rt::Result<Option<(Function, ClusterRoom)>> {
    if !has_attention_tc(float, ctx.compute_capability()) || ctx.compute_capability() < (9, 0) {
        return Ok(None);
    }
    let f = module.function("attention_tc_cluster")?;
    // The largest block of heads: 8 heads of 64 values.
    let shared = attention_shared(true, 8, ATTN_CLUSTER_HEAD, ATTN_CLUSTER_THREADS, true);
    let block = (ATTN_CLUSTER_THREADS, 1, 1);
    let config = LaunchConfig { grid: (1, ATTN_CLUSTER_MAX, 1), block, shared_mem_bytes: shared };
    let room = f.allow_large_clusters().and_then(|()| f.max_cluster_blocks(config)).and_then(|blocks| {
        // A sweep may cap it (`-DKV_ATTN_CLUSTER_MAX=N`; 0: the ticket merge everywhere).
        let blocks = tuning::override_of("KV_ATTN_CLUSTER_MAX", blocks.into()).min(blocks.into()) as u32;
        let clusters = if blocks > 1 { f.max_active_clusters(config, (1, blocks, 1))? } else { 0 };
        Ok(ClusterRoom { blocks, clusters })
    });
    match room {
        // `kernels::attention_tc_cluster` decides what the room allows (none where `blocks` < 2).
        Ok(room) => Ok(Some((f, room))),
        Err(err) => {
            // The ticket merge serves every launch then: slower, never wrong.
            tracing::warn!("the attention's ranges merge by tickets: the device refused clusters: {err}");
            Ok(None)
        }
    }
}

/// A GEMV kind's three entries (`name`, `name_waves`, `name_deep`), in the order of [`GemvEntry`].
fn gemv_entries(module: &Arc<Module>, name: &str) -> cuda_rt::Result<[Function; 3]> {
    Ok([
        module.function(name)?,
        module.function(&format!("{name}_waves"))?,
        module.function(&format!("{name}_deep"))?,
    ])
}

impl Kernels {
    /// Compiles (or takes from the process-wide cache) the kernels for `float` on `ctx`'s device.
    pub fn load(ctx: &Context, float: Float) -> cuda_rt::Result<Kernels> {
        let module: Arc<Module> = tuning::compile_module(ctx, SOURCE, options(float))?;
        let kernels = Kernels {
            gather: module.function("gather")?,
            add: module.function("add")?,
            rms_norm: module.function("rms_norm")?,
            gemv: gemv_entries(&module, "gemv")?,
            gemv_glu: gemv_entries(&module, "gemv_glu")?,
            gemv_rope: gemv_entries(&module, "gemv_rope")?,
            kv_update: module.function("kv_update")?,
            attention: module.function("attention")?,
            attention_tc: if has_attention_tc(float, ctx.compute_capability()) {
                Some(module.function("attention_tc")?)
            } else {
                None
            },
            attention_cluster: attention_cluster(ctx, &module, float)?,
            argmax: module.function("argmax")?,
            module,
        };
        // A sweep may set every kernel's split of L1 and shared memory (`-DKV_CARVEOUT=percent`).
        if let Some(percent) = tuning::define_of("KV_CARVEOUT") {
            for f in kernels.functions() {
                f.prefer_shared_carveout(u32::try_from(percent).unwrap_or(u32::MAX))?;
            }
        }
        Ok(kernels)
    }

    /// Every function of the module it loaded.
    fn functions(&self) -> impl Iterator<Item = &Function> {
        [&self.gather, &self.add, &self.rms_norm, &self.kv_update, &self.attention, &self.argmax]
            .into_iter()
            .chain(self.gemv.iter().chain(&self.gemv_glu).chain(&self.gemv_rope))
            .chain(self.attention_tc.iter())
            .chain(self.attention_cluster.iter().map(|(f, _)| f))
    }

    /// Whether the module has the tensor-core attention (`Launch::AttentionTc`).
    pub fn has_attention_tc(&self) -> bool {
        self.attention_tc.is_some()
    }

    /// What the device holds of `attention_tc_cluster` (`Launch::AttentionTcCluster`); nothing where the
    /// module or the device has no clusters.
    pub fn attention_cluster(&self) -> ClusterRoom {
        self.attention_cluster.as_ref().map_or(ClusterRoom::default(), |(_, room)| *room)
    }

    /// The compiled module (a tuning build reads its trace from it).
    pub fn module(&self) -> &Module {
        &self.module
    }

    /// Queues `launch` on `stream`; `overlapped`: with programmatic dependent launch (every typed kernel
    /// waits for the previous kernel with `pdl_wait` before it reads that kernel's outputs or writes
    /// anything; see `kernels/common.cuh`).
    ///
    /// # Safety
    /// Every address in the parameters is device-accessible memory of the module's context (device or
    /// managed memory, or another kernel's scratch), valid for the extents the parameters describe (the plan
    /// computed them from the graph's static shapes and the call's checked arguments), and used by nothing
    /// else until the stream has run the kernel; `stream` belongs to the same context; `overlapped` only on a
    /// device that [`cuda_rt::Context::overlaps_launches`], after a kernel of the same call.
    pub unsafe fn launch(
        &self,
        launch: &Launch,
        stream: StreamRef<'_>,
        overlapped: bool,
    ) -> cuda_rt::Result<()> {
        // SAFETY: every arm launches the kernel its parameter struct mirrors; the addresses in it are valid
        // per this function's contract, which is `go`'s; each typed kernel waits with `pdl_wait` before
        // touching the previous kernel's memory.
        unsafe {
            match launch {
                Launch::Gather(c, p) => go(&self.gather, *c, stream, p, overlapped),
                Launch::Add(c, p) => go(&self.add, *c, stream, p, overlapped),
                Launch::RmsNorm(c, p) => go(&self.rms_norm, *c, stream, p, overlapped),
                Launch::Gemv(c, p, e) => go(&self.gemv[*e as usize], *c, stream, p, overlapped),
                Launch::GemvGlu(c, p, e) => go(&self.gemv_glu[*e as usize], *c, stream, p, overlapped),
                Launch::GemvRope(c, p, e) => go(&self.gemv_rope[*e as usize], *c, stream, p, overlapped),
                Launch::KvUpdate(c, p) => go(&self.kv_update, *c, stream, p, overlapped),
                Launch::Attention(c, p) => go(&self.attention, *c, stream, p, overlapped),
                Launch::AttentionTc(c, p) => match &self.attention_tc {
                    Some(f) => go(f, *c, stream, p, overlapped),
                    None => Err(cuda_rt::Error::OutOfRange {
                        call: "launching attention_tc",
                        what: "a module without the tensor-core attention".into(),
                    }),
                },
                Launch::AttentionTcCluster(c, p) => match &self.attention_cluster {
                    Some((f, _)) => go_clustered(f, *c, (1, p.splits as u32, 1), stream, p, overlapped),
                    None => Err(cuda_rt::Error::OutOfRange {
                        call: "launching attention_tc_cluster",
                        what: "a module or device without clusters".into(),
                    }),
                },
                Launch::Argmax(c, p) => go(&self.argmax, *c, stream, p, overlapped),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use et_error::{ErrorCode, HasErrorCode};

    /// The source compiles for every element type (f32, f16, bf16), for the H200's architecture, with every
    /// kernel the launches name, as written and with its tunables set otherwise (what `run.sh sweep` may ask),
    /// with the trace marks of `run.sh trace` (`-DKV_TRACE`), and with the merge diagnostics.
    /// Needs NVRTC (not a GPU): `cargo xtask test` provides it from PyPI and sets `KV_REQUIRE_NVRTC`; without
    /// NVRTC the test checks the typed error instead.
    #[test]
    fn kernels_compile_for_every_element_type() {
        let tuned = [
            "-DGEMV_PRE=2",
            "-DGEMV_BLOCKS_PER_SM=4",
            "-DGEMV_DEPTH=8",
            "-DGEMV_DEEP_DEPTH=12",
            "-DGEMV_DEEP_PRE=12",
            "-DATTN_U=2",
            "-DATTN_TC_BLOCKS_PER_SM=4",
            "-DATTN_MERGE_SHFL=0",
            "-DATTN_MERGE_BATCH=8",
            "-DATTN_CLUSTER_END_SYNC=1",
            "-DATTN_CLUSTER_BATCH=8",
            "-DATTN_CLUSTER_BLOCKS_PER_SM=3",
            "-DKV_TRACE",
            "-DKV_TRACE_MERGE",
        ];
        let diagnostics = ["-DKV_DIAG_NO_MERGE", "-DKV_DIAG_TICKET_ONLY"];
        for (float, tunables) in [Float::F32, Float::F16, Float::Bf16]
            .into_iter()
            .flat_map(|f| [(f, &[][..]), (f, &tuned[..]), (f, &diagnostics[..])])
        {
            let mut opts = vec!["--gpu-architecture=compute_90"];
            opts.extend_from_slice(options(float));
            opts.extend_from_slice(tunables);
            match cuda_rt::compile_ptx(SOURCE, &opts) {
                Ok(ptx) => {
                    for kernel in [
                        "gather",
                        "add",
                        "rms_norm",
                        "gemv",
                        "gemv_glu",
                        "gemv_rope",
                        "gemv_waves",
                        "gemv_glu_waves",
                        "gemv_rope_waves",
                        "gemv_deep",
                        "gemv_glu_deep",
                        "gemv_rope_deep",
                        "kv_update",
                        "attention",
                        "argmax",
                    ] {
                        assert!(ptx.contains(&format!(".entry {kernel}(")), "{float:?}: no kernel {kernel}");
                    }
                    for kernel in ["attention_tc", "attention_tc_cluster"] {
                        let has = ptx.contains(&format!(".entry {kernel}("));
                        assert_eq!(has, has_attention_tc(float, (9, 0)), "{float:?}: {kernel}");
                    }
                }
                Err(err) => {
                    assert!(
                        std::env::var_os("KV_REQUIRE_NVRTC").is_none(),
                        "KV_REQUIRE_NVRTC is set but: {err}"
                    );
                    assert_eq!(err.error_code(), ErrorCode::NotSupported, "{err}");
                    eprintln!("needs NVRTC, not run here: {err}");
                    return;
                }
            }
        }
    }
}
