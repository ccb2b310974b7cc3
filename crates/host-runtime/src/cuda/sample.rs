//! The device loop's sampler kernel ([`SampleKernel`]): one block draws a token from one row of logits on
//! the device, following `sampling`'s contract operation for operation (source: `sample.cu`, beside this file),
//! and writes it where the feedback kernel reads the next token. Everything that changes from step to step
//! (the step, the history's ids) lives in device memory, so the launch is the same every step and a CUDA graph
//! captures it.

use std::ffi::c_void;

use cuda_rt::{Context, DevicePtr, Error, Function, LaunchConfig, Stream};

/// The kernel's CUDA C source.
pub(crate) const SAMPLE_SOURCE: &str = include_str!("sample.cu");

/// NVRTC options: no contraction of products and sums into fused multiply-adds the contract does not name
/// (the source also spells every operation with its round-to-nearest intrinsic).
pub(crate) const SAMPLE_OPTIONS: [&str; 1] = ["--fmad=false"];

/// Threads of the one block (the source's `KV_THREADS`).
const THREADS: u32 = 1024;

/// The sampler kernel, compiled once per process per device.
pub(crate) struct SampleKernel {
    function: Function,
}

/// The element type of a row of logits, as the kernel reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LogitsType {
    F32 = 0,
    F16 = 1,
    Bf16 = 2,
}

impl LogitsType {
    /// Bytes per element.
    pub(crate) fn size(self) -> usize {
        match self {
            LogitsType::F32 => 4,
            LogitsType::F16 | LogitsType::Bf16 => 2,
        }
    }
}

/// What one launch reads and writes: the row of logits (`vocab` elements of `dtype` at `row`), the sampling
/// parameters, and the sampler's device state: `seen` (one bit per id, `vocab` bits rounded up to words),
/// `draws` (a `u32`, the step), `keys` (`vocab` `u32`s of scratch) and `token` (the `i64` drawn).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SampleArgs {
    pub row: DevicePtr,
    pub dtype: LogitsType,
    pub vocab: u32,
    pub params: sampling::Params,
    pub seen: DevicePtr,
    pub draws: DevicePtr,
    pub keys: DevicePtr,
    pub token: DevicePtr,
}

impl SampleKernel {
    /// Compiles (once per process per device) and loads the kernel.
    ///
    /// # Errors
    /// No NVRTC (`NotSupported`), or the driver refuses the module.
    pub(crate) fn new(ctx: &Context) -> Result<SampleKernel, Error> {
        let function = ctx.compile_module(SAMPLE_SOURCE, &SAMPLE_OPTIONS)?.function("kv_sample")?;
        Ok(SampleKernel { function })
    }

    /// Queues one draw on the program's `stream`.
    ///
    /// Only the device loop calls this (`generate`'s `DeviceLoop::feedback`, through
    /// `Program::queue_on_stream`), on a program's stream, with `row` the last row of a method's logits output
    /// in that program's device or managed memory (`vocab` elements of `dtype`, resolved once from the
    /// manifest's declaration) and the sampler state the loop allocated on that program's device at the sizes
    /// [`SampleArgs`] names; the program's stream invariant keeps them alive and untouched by the host until
    /// the stream has run the kernel.
    pub(crate) fn launch(&self, stream: &Stream, args: SampleArgs) -> Result<(), Error> {
        let SampleArgs { mut row, dtype, mut vocab, params, mut seen, mut draws, mut keys, mut token } = args;
        let mut dtype = dtype as i32;
        let mut temperature = params.temperature;
        // Checked by `sampling::Sampler::new`: at most 1024.
        let mut top_k = u32::try_from(params.top_k).unwrap_or(u32::MAX);
        let (mut top_p, mut min_p, mut penalty, mut seed) =
            (params.top_p, params.min_p, params.repetition_penalty, params.seed);
        let mut params: [*mut c_void; 13] = [
            (&mut row as *mut DevicePtr).cast(),
            (&mut dtype as *mut i32).cast(),
            (&mut vocab as *mut u32).cast(),
            (&mut temperature as *mut f32).cast(),
            (&mut top_k as *mut u32).cast(),
            (&mut top_p as *mut f32).cast(),
            (&mut min_p as *mut f32).cast(),
            (&mut penalty as *mut f32).cast(),
            (&mut seed as *mut u64).cast(),
            (&mut seen as *mut DevicePtr).cast(),
            (&mut draws as *mut DevicePtr).cast(),
            (&mut keys as *mut DevicePtr).cast(),
            (&mut token as *mut DevicePtr).cast(),
        ];
        let config = LaunchConfig { grid: (1, 1, 1), block: (THREADS, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: `params` points at thirteen locals of the kernel's parameter types, in order (device pointers
        // are 64-bit, `int` is `i32`, `unsigned int` `u32`, `float` `f32`, `unsigned long long` `u64`), read
        // during the call. The kernel reads `vocab` elements of `dtype` at `row` and `seen`'s `vocab` bits,
        // reads and writes `draws` (4 bytes), `keys` (`vocab` words), `seen` and `token` (8 bytes): each an
        // allocation of at least that size, alive and untouched by the host until the stream has run the
        // kernel (this function's callers, above). One block of the 1024 threads the source is written for.
        unsafe { self.function.launch(config, stream.as_ref(), &mut params) }
    }
}

impl std::fmt::Debug for SampleKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SampleKernel").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Needs NVRTC (not a GPU): `cargo xtask test` provides it and sets `KV_REQUIRE_NVRTC`; without NVRTC the
    /// test checks the typed error instead.
    #[test]
    fn the_sampler_kernel_compiles_for_the_h200_without_contraction() {
        let options = ["--gpu-architecture=compute_90", SAMPLE_OPTIONS[0]];
        match cuda_rt::compile_ptx(SAMPLE_SOURCE, &options) {
            Ok(ptx) => {
                assert!(ptx.contains(".entry kv_sample("), "{ptx}");
                // Fused multiply-adds only where the contract names them: the exponential's eight (two in the
                // reduction, five in Horner's rule, one for `P * r^2 + r`).
                assert_eq!(ptx.matches("fma.rn.f32").count(), 8, "{ptx}");
            }
            Err(err) => {
                assert!(std::env::var_os("KV_REQUIRE_NVRTC").is_none(), "KV_REQUIRE_NVRTC is set but: {err}");
                assert!(matches!(err, Error::LibraryUnavailable { library: "nvrtc", .. }), "{err:?}");
            }
        }
    }
}
