//! The untyped kernels of `general.cu`, the general path's launches: broadcasting elementwise ops, unary
//! functions, means, casts, strided copies and positions, for every element type (a code in the parameters,
//! [`dtype_code`]), compiled once per process per device. Parameter structs mirror the source's field for
//! field (`#[repr(C)]`); launches go through [`super::go`], whose contract [`General::launch`] restates.

use std::sync::Arc;

use cuda_rt::{Context, DevicePtr, Function, LaunchConfig, Module, StreamRef};
use ref_graph::ElemType;

/// The CUDA C source, compiled by NVRTC at `init`.
pub const SOURCE: &str =
    concat!(include_str!("common.cuh"), include_str!("walk.cuh"), include_str!("general.cu"));

/// Most axes a broadcast or a strided copy handles (`MAX_RANK` in the source).
pub const MAX_RANK: usize = 6;

/// The source's `DT_*` code of an element type.
pub const fn dtype_code(dtype: ElemType) -> i32 {
    match dtype {
        ElemType::F32 => 0,
        ElemType::F16 => 1,
        ElemType::Bf16 => 2,
        ElemType::I64 => 3,
    }
}

/// `BinaryP`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BinaryP {
    pub a: DevicePtr,
    pub b: DevicePtr,
    pub out: DevicePtr,
    pub n: i64,
    pub rank: i32,
    pub dt: i32,
    pub op: i32,
    pub pad: i32,
    pub dims: [i64; MAX_RANK],
    pub sa: [i64; MAX_RANK],
    pub sb: [i64; MAX_RANK],
}

/// `UnaryP`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct UnaryP {
    pub x: DevicePtr,
    pub out: DevicePtr,
    pub n: i64,
    pub dt: i32,
    pub func: i32,
}

/// `GluP`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct GluP {
    pub gate: DevicePtr,
    pub up: DevicePtr,
    pub out: DevicePtr,
    pub n: i64,
    pub dt: i32,
    pub func: i32,
}

/// `MeanP`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MeanP {
    pub x: DevicePtr,
    pub out: DevicePtr,
    pub rows: i32,
    pub dim: i32,
    pub dt: i32,
}

/// `CastP`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CastP {
    pub x: DevicePtr,
    pub out: DevicePtr,
    pub n: i64,
    pub from: i32,
    pub to: i32,
}

/// `CopyP`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RopeP {
    pub x: DevicePtr,
    pub cos: DevicePtr,
    pub sin: DevicePtr,
    pub out: DevicePtr,
    pub n: i64,
    pub rank: i32,
    pub dt: i32,
    pub half: i32,
    pub pad: i32,
    pub dims: [i64; MAX_RANK],
    pub sc: [i64; MAX_RANK],
    pub ss: [i64; MAX_RANK],
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CopyP {
    pub src: DevicePtr,
    pub dst: DevicePtr,
    pub n: i64,
    pub src_off: i64,
    pub dst_off: i64,
    pub rank: i32,
    pub elem: i32,
    pub dims: [i64; MAX_RANK],
    pub ss: [i64; MAX_RANK],
    pub ds: [i64; MAX_RANK],
}

/// `PositionsP`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PositionsP {
    pub pos: DevicePtr,
    pub out: DevicePtr,
    pub count: i32,
}

/// One launch of an untyped kernel, its parameters resolved to addresses.
/// Sums a [`CountersP`] launch takes at most (`COUNTERS_MAX` of the source).
pub const COUNTERS_MAX: usize = 8;

/// `counters`: `dst[i][0] = src[i][0] + add[i]` for `i < n`, scalar i64s.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CountersP {
    pub src: [DevicePtr; COUNTERS_MAX],
    pub dst: [DevicePtr; COUNTERS_MAX],
    pub add: [i64; COUNTERS_MAX],
    pub n: i32,
}

/// `rope_tables`: RoPE's cos and sin tables of `rows` positions from the position and the f32 inverse
/// frequencies, in element type `dt`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RopeTablesP {
    pub pos: DevicePtr,
    pub inv_freq: DevicePtr,
    pub cos: DevicePtr,
    pub sin: DevicePtr,
    pub rows: i32,
    pub half: i32,
    pub dt: i32,
    pub pad: i32,
}

#[derive(Debug, Clone, Copy)]
pub enum GeneralLaunch {
    Binary(LaunchConfig, BinaryP),
    Unary(LaunchConfig, UnaryP),
    Glu(LaunchConfig, GluP),
    Mean(LaunchConfig, MeanP),
    Cast(LaunchConfig, CastP),
    Copy(LaunchConfig, CopyP),
    Positions(LaunchConfig, PositionsP),
    Rope(LaunchConfig, RopeP),
    Counters(LaunchConfig, CountersP),
    RopeTables(LaunchConfig, RopeTablesP),
}

/// The functions of the untyped module on one device.
#[derive(Debug)]
pub struct General {
    binary: Function,
    unary: Function,
    mean: Function,
    cast: Function,
    copy: Function,
    positions: Function,
    rope: Function,
    counters: Function,
    rope_tables: Function,
    glu: Function,
}

/// Every kernel of the source, by the name the module exports.
pub const KERNELS: [&str; 10] = [
    "binary",
    "unary",
    "mean_rows",
    "cast",
    "copy_strided",
    "positions",
    "rope",
    "counters",
    "rope_tables",
    "glu",
];

impl General {
    /// Compiles (or takes from the process-wide cache) the untyped kernels on `ctx`'s device.
    pub fn load(ctx: &Context) -> cuda_rt::Result<General> {
        let module: Arc<Module> = super::tuning::compile_module(ctx, SOURCE, &[])?;
        Ok(General {
            binary: module.function(KERNELS[0])?,
            unary: module.function(KERNELS[1])?,
            mean: module.function(KERNELS[2])?,
            cast: module.function(KERNELS[3])?,
            copy: module.function(KERNELS[4])?,
            positions: module.function(KERNELS[5])?,
            rope: module.function(KERNELS[6])?,
            counters: module.function(KERNELS[7])?,
            rope_tables: module.function(KERNELS[8])?,
            glu: module.function(KERNELS[9])?,
        })
    }

    /// Queues `launch` on `stream`; `overlapped`: with programmatic dependent launch (every kernel of the
    /// source waits for the previous kernel with `pdl_wait` before anything else).
    ///
    /// # Safety
    /// As [`super::Kernels::launch`]: every address is device-accessible memory of the module's context,
    /// valid for the extents the parameters describe and used by nothing else until the stream has run the
    /// kernel; `stream` belongs to the same context; `overlapped` only on a device that overlaps launches,
    /// after a kernel of the same call.
    pub unsafe fn launch(
        &self,
        launch: &GeneralLaunch,
        stream: StreamRef<'_>,
        overlapped: bool,
    ) -> cuda_rt::Result<()> {
        use super::go;
        // SAFETY: every arm launches the kernel its parameter struct mirrors; the addresses in it are valid
        // per this function's contract, which is `go`'s.
        unsafe {
            match launch {
                GeneralLaunch::Binary(c, p) => go(&self.binary, *c, stream, p, overlapped),
                GeneralLaunch::Unary(c, p) => go(&self.unary, *c, stream, p, overlapped),
                GeneralLaunch::Glu(c, p) => go(&self.glu, *c, stream, p, overlapped),
                GeneralLaunch::Mean(c, p) => go(&self.mean, *c, stream, p, overlapped),
                GeneralLaunch::Cast(c, p) => go(&self.cast, *c, stream, p, overlapped),
                GeneralLaunch::Copy(c, p) => go(&self.copy, *c, stream, p, overlapped),
                GeneralLaunch::Positions(c, p) => go(&self.positions, *c, stream, p, overlapped),
                GeneralLaunch::Rope(c, p) => go(&self.rope, *c, stream, p, overlapped),
                GeneralLaunch::Counters(c, p) => go(&self.counters, *c, stream, p, overlapped),
                GeneralLaunch::RopeTables(c, p) => go(&self.rope_tables, *c, stream, p, overlapped),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use et_error::{ErrorCode, HasErrorCode};

    /// The untyped source compiles for the H200's architecture with every kernel the launches name. Needs
    /// NVRTC (not a GPU): with `KV_REQUIRE_NVRTC` set a missing NVRTC fails the test.
    #[test]
    fn general_kernels_compile() {
        match cuda_rt::compile_ptx(SOURCE, &["--gpu-architecture=compute_90"]) {
            Ok(ptx) => {
                for kernel in KERNELS {
                    assert!(ptx.contains(&format!(".entry {kernel}(")), "no kernel {kernel}");
                }
            }
            Err(err) => {
                assert!(std::env::var_os("KV_REQUIRE_NVRTC").is_none(), "KV_REQUIRE_NVRTC is set but: {err}");
                assert_eq!(err.error_code(), ErrorCode::NotSupported, "{err}");
                eprintln!("needs NVRTC, not run here: {err}");
            }
        }
    }

    /// The Rust mirrors have the C structs' sizes (fields in the same order, no padding surprise): 8-byte
    /// aligned arrays after the scalar fields.
    #[test]
    fn parameter_structs_have_the_sources_layout() {
        assert_eq!(std::mem::size_of::<BinaryP>(), 3 * 8 + 8 + 4 * 4 + 3 * 6 * 8);
        assert_eq!(std::mem::size_of::<CopyP>(), 2 * 8 + 3 * 8 + 2 * 4 + 3 * 6 * 8);
        assert_eq!(std::mem::size_of::<RopeP>(), 4 * 8 + 8 + 4 * 4 + 3 * 6 * 8);
        assert_eq!(std::mem::size_of::<UnaryP>(), 2 * 8 + 8 + 2 * 4);
        assert_eq!(std::mem::size_of::<GluP>(), 3 * 8 + 8 + 2 * 4);
        assert_eq!(std::mem::size_of::<CountersP>(), 3 * COUNTERS_MAX * 8 + 8);
        assert_eq!(std::mem::size_of::<RopeTablesP>(), 4 * 8 + 4 * 4);
    }
}
