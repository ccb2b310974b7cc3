//! The plugin ABI's `ExecuteArgs` adapted to `trt-exec`'s runner: each `TensorArg` becomes an [`IoArg`], the
//! caller's `cudaStream_t` a borrowed `cuda_rt::StreamRef`, and what the runner reports is recorded in the
//! ABI's statistics. The runner sits below the ABI the way wgpu-hal's backends sit below wgpu-core: its
//! `execute` is `unsafe`, and this module is the one place the delegate vouches for the caller's memory.
#![allow(unsafe_code)]

use blob_format::model::DType;
use cuda_rt::StreamRef;
use delegate_abi::{ExecuteArgs, TensorArg};
use smallvec::SmallVec;
use trt_exec::{CallStats, IoArg, Runner};

/// Arguments held inline per call before spilling to the heap (the tiny decoder has 7, `big` 35).
const INLINE_ARGS: usize = 64;

/// One delegate argument as the runner takes it: its memory kind is the runner's residency as it is (one
/// vocabulary), its ABI dtype code the element type through the ABI's one conversion.
pub(crate) fn io_arg(arg: &TensorArg) -> IoArg<'_> {
    IoArg {
        ptr: arg.data,
        nbytes: arg.nbytes,
        residency: arg.memory(),
        device: arg.device_id,
        dtype: DType::from(arg.dtype()),
        shape: arg.dims(),
    }
}

/// Runs one call of `runner` over the ABI's arguments and records the staged and reflected bytes in `args`.
/// Allocates nothing for up to 64 arguments.
///
/// # Errors
/// As [`Runner::execute`].
pub(crate) fn execute(runner: &mut Runner, args: &mut ExecuteArgs<'_>) -> Result<CallStats, trt_exec::Error> {
    // The one place this crate reads the ABI's stream representation.
    let stream = args.stream().map(|stream| stream.as_raw());
    let stats = {
        let mut io: SmallVec<[IoArg<'_>; INLINE_ARGS]> = SmallVec::new();
        io.extend(args.args().iter().map(io_arg));
        // SAFETY: `ExecuteArgs::new`'s contract vouches for every argument: host-visible memory holds
        // `nbytes` bytes valid for reads (and writes when writable) with nothing else touching writable bytes
        // during the call, and device memory is a valid allocation of `nbytes` on `device_id`; the runner
        // synchronises before returning whenever host memory or a reflect is involved, and otherwise leaves
        // device work ordered on the caller's stream, which CUDA's stream ordering makes the caller's to wait
        // for before reusing the memory. The stream is the caller's `cudaStream_t` (or null, the legacy
        // default stream), valid for the call, as the ABI's `execute` entry documents, and borrowed only for
        // it.
        unsafe { runner.execute(&io, stream.map(|raw| StreamRef::from_raw(raw))) }?
    };
    args.record_staging(stats.staged_bytes);
    args.record_reflect(stats.reflect_bytes);
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use delegate_abi::{DTypeCode, MemoryKind};
    use et_error::{ErrorCode, HasErrorCode};

    use super::*;

    #[test]
    fn abi_arguments_become_runner_arguments_with_their_memory_kind() {
        for memory in MemoryKind::ALL {
            let mut arg = TensorArg::describe(DTypeCode::F32, &[1, 2, 16, 8], memory).expect("rank 4");
            arg.data = 0x7000_0000 as *mut std::ffi::c_void;
            arg.nbytes = 1024;
            arg.device_id = 1;
            let io = io_arg(&arg);
            assert_eq!(
                io,
                IoArg {
                    ptr: 0x7000_0000 as *mut std::ffi::c_void,
                    nbytes: 1024,
                    residency: memory,
                    device: 1,
                    dtype: DType::F32,
                    shape: &[1, 2, 16, 8]
                }
            );
        }
        let i64_arg = TensorArg::describe(DTypeCode::I64, &[1], MemoryKind::Host).expect("rank 1");
        assert_eq!(io_arg(&i64_arg).dtype, DType::I64);
        // Device memory of another GPU than the engine's is refused by the runner's view of it.
        let mut other = TensorArg::describe(DTypeCode::F32, &[4], MemoryKind::Device).expect("rank 1");
        other.data = 0x7000_0000 as *mut std::ffi::c_void;
        other.nbytes = 16;
        other.device_id = 1;
        let err = io_arg(&other).view(2, 0).expect_err("wrong device");
        assert_eq!(err.to_string(), "argument 2 is memory of CUDA device 1, but the engine runs on device 0");
        assert_eq!(err.error_code(), ErrorCode::InvalidArgument);
    }
}
