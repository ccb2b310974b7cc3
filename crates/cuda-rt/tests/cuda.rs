//! Every part of the CUDA layer, where a driver and a GPU exist (all of them passed on the `device` tool's
//! H200, driver 580, CUDA 13.0's NVRTC and cuBLAS); on a machine without a driver (every CI machine) each test
//! asserts the typed `NotSupported` error instead, so none can pass silently.

use std::ffi::c_void;
use std::sync::Arc;

use cuda_rt::{
    Allocation, Blas, Context, Contexts, Device, DevicePtr, Error, Event, GemmEx, GemmType, LaunchConfig,
    Managed, MemoryKind, Pinned, PointerKind, Sgemm, Stream, StreamRef,
};
use et_error::{ErrorCode, HasErrorCode};

/// Device 0's context, or `None` after checking that its absence is the clean, typed error of a machine
/// without a driver.
fn open() -> Option<Context> {
    match Context::open(0) {
        Ok(ctx) => {
            eprintln!("opened {ctx:?}");
            Some(ctx)
        }
        Err(err) => {
            eprintln!("Context::open(0): {err}");
            assert_eq!(err.error_code(), ErrorCode::NotSupported, "{err}");
            assert!(
                matches!(err, Error::NoDriver { .. } | Error::DriverUnusable { .. } | Error::NoDevice { .. }),
                "{err:?}"
            );
            assert!(!err.to_string().contains('\n'), "{err}");
            assert!(!std::path::Path::new("/dev/nvidiactl").exists(), "a driver exists but: {err}");
            None
        }
    }
}

#[test]
fn no_driver_is_a_typed_not_supported_error_every_time() {
    let has_driver = std::path::Path::new("/dev/nvidiactl").exists();
    match Context::open(0) {
        Ok(ctx) => assert!(has_driver, "opened a CUDA device without /dev/nvidiactl: {ctx:?}"),
        Err(err) => {
            assert_eq!(err.error_code(), ErrorCode::NotSupported, "{err}");
            if !has_driver {
                assert!(matches!(err, Error::NoDriver { .. }), "{err:?}");
                let text = err.to_string();
                assert!(
                    text.starts_with("no CUDA driver is available: the driver library could not be loaded ("),
                    "{text}"
                );
                assert!(
                    text.contains("libcuda.so.1") && text.ends_with("install an NVIDIA driver"),
                    "{text}"
                );
            }
            // `Contexts` reports the same error, and a second attempt gives the same clean answer (no
            // poisoned loader state, no panic).
            assert_eq!(Contexts::new().get(0).expect_err("same machine"), err);
            assert_eq!(Context::open(0).expect_err("same machine"), err);
        }
    }
}

#[test]
fn a_negative_ordinal_is_no_device_when_a_driver_exists() {
    match Context::open(-1) {
        Err(Error::NoDriver { .. } | Error::DriverUnusable { .. }) => assert!(open().is_none()),
        Err(Error::NoDevice { ordinal, .. }) => assert_eq!(ordinal, -1),
        other => panic!("unexpected: {other:?}"),
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: `cargo xtask gpu-test` runs it on one (--include-ignored, KV_REQUIRE_GPU=1)"]
fn memory_of_every_kind_starts_zeroed_and_round_trips() {
    let Some(ctx) = open() else { return };
    let mut contexts = Contexts::new();
    assert_eq!(contexts.get(0).expect("opens"), ctx, "the same primary context");

    let mut device = Allocation::<Device>::zeroed(&ctx, 300).expect("device memory");
    assert_eq!((device.len(), device.kind(), device.device()), (300, MemoryKind::Device, 0));
    assert_eq!(device.read().expect("read"), vec![0u8; 300]);
    let pattern: Vec<u8> = (0..300u32).map(|i| (i % 251) as u8 + 1).collect();
    device.write(&pattern).expect("write");
    assert!(matches!(device.write(&pattern[1..]), Err(Error::SizeMismatch { dst: 300, src: 299, .. })));
    let mut copy = Allocation::<Device>::zeroed(&ctx, 300).expect("device memory");
    assert_eq!(copy.copy_from(&device).expect("device-to-device copy"), 300);
    assert_eq!(copy.read().expect("read"), pattern);
    copy.clear().expect("clear");
    assert_eq!(copy.read().expect("read"), vec![0u8; 300]);
    let short = Allocation::<Device>::zeroed(&ctx, 299).expect("device memory");
    let err = copy.copy_from(&short).expect_err("sizes must match");
    assert_eq!(err.error_code(), ErrorCode::InvalidArgument);

    // Even an empty allocation has a valid, aligned address (a zero-byte tensor's 1-byte scratch).
    let empty = Allocation::<Device>::uninit(&ctx, 0).expect("empty");
    for address in [device.device_ptr(), copy.device_ptr(), empty.device_ptr()] {
        assert_ne!(address, 0);
        assert_eq!(address % 256, 0, "cuMemAlloc is 256-byte aligned, as TensorRT requires");
    }

    let mut managed = Allocation::<Managed>::zeroed(&ctx, 300).expect("managed memory");
    assert!(managed.host_bytes().expect("bytes").iter().all(|&b| b == 0));
    managed.host_bytes_mut().expect("bytes")[7] = 9;
    let mut other = Allocation::<Managed>::zeroed(&ctx, 300).expect("managed memory");
    assert_eq!(other.copy_from(&managed).expect("copy"), 300);
    assert_eq!(other.host_bytes().expect("bytes")[7], 9);
    other.clear().expect("clear");
    assert!(other.host_bytes().expect("bytes").iter().all(|&b| b == 0));

    let mut pinned = Allocation::<Pinned>::zeroed(&ctx, 300).expect("pinned memory");
    assert!(pinned.bytes().iter().all(|&b| b == 0));
    pinned.bytes_mut()[299] = 3;
    assert_eq!(pinned.bytes()[299], 3);
    assert_eq!(format!("{pinned:?}"), "Allocation { kind: Pinned, len: 300, device: 0 }");
    drop((device, copy, short, empty, managed, other, pinned));
    ctx.synchronize().expect("context synchronise");
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: `cargo xtask gpu-test` runs it on one (--include-ignored, KV_REQUIRE_GPU=1)"]
fn the_driver_tells_device_managed_pinned_and_unregistered_memory_apart() {
    let Some(ctx) = open() else { return };
    let device = Allocation::<Device>::zeroed(&ctx, 64).expect("device");
    let managed = Allocation::<Managed>::zeroed(&ctx, 64).expect("managed");
    let pinned = Allocation::<Pinned>::zeroed(&ctx, 64).expect("pinned");
    let pageable = vec![0u8; 64].into_boxed_slice(); // pageable heap memory
    let info = |ptr: *const c_void| ctx.pointer_info(ptr).expect("query");
    assert_eq!(info(device.as_ptr()).kind, PointerKind::Device);
    assert_eq!(info(device.as_ptr()).device, Some(0));
    assert_eq!(info(managed.as_ptr()).kind, PointerKind::Managed);
    assert_eq!(info(pinned.as_ptr()).kind, PointerKind::Host);
    assert_eq!(info(pageable.as_ptr().cast()).kind, PointerKind::Unregistered);
    assert_eq!(info(pageable.as_ptr().cast()).device, None);
    assert_eq!(info(std::ptr::null()).kind, PointerKind::Unregistered);
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: `cargo xtask gpu-test` runs it on one (--include-ignored, KV_REQUIRE_GPU=1)"]
fn streams_events_and_async_copies_round_trip() {
    let Some(ctx) = open() else { return };
    let stream = Stream::new(&ctx).expect("stream");
    let src: Vec<u8> = (0..=255u8).cycle().take(4096).collect();
    let a = Allocation::<Device>::uninit(&ctx, 4096).expect("alloc a");
    let b = Allocation::<Device>::uninit(&ctx, 4096).expect("alloc b");
    let mut back = vec![0u8; 4096];
    let done = Event::new(&ctx).expect("event");
    // SAFETY: the buffers hold 4096 bytes; `src` and `back` live until the synchronise below.
    unsafe {
        ctx.copy_htod_async(a.device_ptr(), src.as_ptr().cast(), 4096, stream.as_ref()).expect("h2d");
        ctx.copy_dtod_async(b.device_ptr(), a.device_ptr(), 4096, stream.as_ref()).expect("d2d");
        ctx.copy_dtoh_async(back.as_mut_ptr().cast(), b.device_ptr(), 4096, stream.as_ref()).expect("d2h");
    }
    done.record(stream.as_ref()).expect("record");
    done.synchronize().expect("event synchronise");
    assert!(done.is_complete().expect("query"));
    assert_eq!(back, src);

    // A caller's raw stream, borrowed: work on it orders after an event of ours, and it is not destroyed.
    let other = Stream::new(&ctx).expect("stream");
    // SAFETY: `other` outlives the borrowed handle.
    let borrowed = unsafe { StreamRef::from_raw(other.as_ref().as_raw()) };
    assert_eq!(borrowed, other.as_ref());
    done.wait_on(borrowed).expect("wait");
    ctx.synchronize_stream(borrowed).expect("synchronise the borrowed stream");
    // The legacy default stream (a caller passing a null stream) is accepted too.
    assert!(StreamRef::legacy_default().is_legacy_default());
    ctx.synchronize_stream(StreamRef::legacy_default()).expect("default stream");

    let (start, end) = (Event::timed(&ctx).expect("timed"), Event::timed(&ctx).expect("timed"));
    start.record(stream.as_ref()).expect("record");
    end.record(stream.as_ref()).expect("record");
    stream.synchronize().expect("stream synchronise");
    assert!(end.elapsed_ms(&start).expect("elapsed") >= 0.0);
    assert!(end.elapsed_ms(&done).is_err(), "an untimed event has no time");
    drop((a, b, stream, other));
    ctx.synchronize().expect("context synchronise");
}

const SCALE: &str = r#"
extern "C" __global__ void scale(float* x, float factor, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { x[i] *= factor; }
}
"#;

#[test]
fn nvrtc_compiles_to_ptx_or_is_a_typed_not_supported_error() {
    match cuda_rt::compile_ptx(SCALE, &[]) {
        Ok(ptx) => {
            assert!(ptx.contains(".entry scale"), "{ptx}");
            let err = cuda_rt::compile_ptx("this is not CUDA", &[]).expect_err("does not compile");
            assert!(matches!(&err, Error::Compile(failure) if !failure.log.is_empty()), "{err:?}");
            assert_eq!(err.error_code(), ErrorCode::Internal);
        }
        Err(err) => {
            eprintln!("compile_ptx: {err}");
            assert!(matches!(err, Error::LibraryUnavailable { library: "nvrtc", .. }), "{err:?}");
            assert_eq!(err.error_code(), ErrorCode::NotSupported);
            assert!(Context::open(0).is_err(), "a GPU machine is expected to have NVRTC: {err}");
        }
    }
    let err = cuda_rt::compile_ptx("a\0b", &[]).expect_err("NUL");
    assert_eq!(err.error_code(), ErrorCode::InvalidArgument);
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: `cargo xtask gpu-test` runs it on one (--include-ignored, KV_REQUIRE_GPU=1)"]
fn a_module_is_compiled_once_per_device_and_its_kernel_runs() {
    let Some(ctx) = open() else { return };
    let module = ctx.compile_module(SCALE, &[]).expect("compiles");
    assert!(Arc::ptr_eq(&module, &ctx.compile_module(SCALE, &[]).expect("cached")), "compiled once");
    let other = ctx.compile_module(SCALE, &["--use_fast_math"]).expect("compiles");
    assert!(!Arc::ptr_eq(&module, &other), "other options, other module");
    assert!(module.function("missing").is_err());

    let scale = module.function("scale").expect("kernel");
    let mut x = Allocation::<Managed>::zeroed(&ctx, 1000 * 4).expect("managed");
    for (i, chunk) in x.host_bytes_mut().expect("bytes").chunks_exact_mut(4).enumerate() {
        chunk.copy_from_slice(&(i as f32).to_le_bytes());
    }
    let stream = Stream::new(&ctx).expect("stream");
    let (mut ptr, mut factor, mut n) = (x.device_ptr(), 2.5f32, 1000u32);
    let mut params: [*mut c_void; 3] =
        [(&mut ptr as *mut u64).cast(), (&mut factor as *mut f32).cast(), (&mut n as *mut u32).cast()];
    let config = LaunchConfig { grid: (4, 1, 1), block: (256, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: the parameters match `scale(float*, float, unsigned int)`; `x` holds 1000 floats and is used by
    // nothing else until the stream synchronises below.
    unsafe { scale.launch(config, stream.as_ref(), &mut params) }.expect("launch");
    stream.synchronize().expect("synchronise");
    let values = words(&x, f32::from_le_bytes);
    assert!(values.iter().enumerate().all(|(i, &v)| v == i as f32 * 2.5), "{:?}", &values[..8]);
}

/// Managed memory's bytes as 4-byte little-endian values.
fn words<T>(memory: &Allocation<Managed>, from: fn([u8; 4]) -> T) -> Vec<T> {
    memory.host_bytes().expect("bytes").chunks_exact(4).map(|c| from([c[0], c[1], c[2], c[3]])).collect()
}

/// A `__device__` variable's bytes after the kernels that wrote it ran (what a tuning build's trace is read
/// with); a name the module lacks is a typed error.
#[test]
#[ignore = "needs an NVIDIA GPU and driver: `cargo xtask gpu-test` runs it on one (--include-ignored, KV_REQUIRE_GPU=1)"]
fn a_module_variable_reads_back_after_its_kernels() {
    let Some(ctx) = open() else { return };
    let source = "__device__ unsigned int total[2];\n\
                  extern \"C\" __global__ void bump(unsigned int n) { atomicAdd(&total[threadIdx.x], n); }";
    let module = ctx.compile_module(source, &[]).expect("compiles");
    let bump = module.function("bump").expect("kernel");
    let stream = Stream::new(&ctx).expect("stream");
    for n in [3u32, 4] {
        let mut n = n;
        let mut params: [*mut c_void; 1] = [(&mut n as *mut u32).cast()];
        let config = LaunchConfig { grid: (5, 1, 1), block: (2, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: the parameter matches `bump(unsigned int)`; the kernel touches only its module's variable.
        unsafe { bump.launch(config, stream.as_ref(), &mut params) }.expect("launch");
    }
    let bytes = module.read_global("total").expect("the variable");
    let total: Vec<u32> =
        bytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    assert_eq!(total, [35, 35], "five blocks added 3 then 4 to each entry");
    let err = module.read_global("missing").expect_err("no such variable");
    assert!(err.to_string().contains("cuModuleGetGlobal"), "{err}");
}

/// The row-major product `C = A·B` of a 2×3 `a` and a 3×2 `b` into a 2×2 `c`, in cuBLAS's column-major
/// convention `Cᵀ = Bᵀ·Aᵀ`: cuBLAS gets `b` as its A and `a` as its B.
fn row_major_2x3_by_3x2(a: DevicePtr, b: DevicePtr, c: DevicePtr) -> Sgemm {
    Sgemm {
        transpose_a: false,
        transpose_b: false,
        m: 2,
        n: 2,
        k: 3,
        alpha: 1.0,
        a: b,
        lda: 2,
        b: a,
        ldb: 3,
        beta: 0.0,
        c,
        ldc: 2,
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: `cargo xtask gpu-test` runs it on one (--include-ignored, KV_REQUIRE_GPU=1)"]
fn cublas_multiplies_on_the_callers_stream() {
    let Some(ctx) = open() else { return };
    let mut blas = Blas::new(&ctx).expect("cuBLAS is installed where the GPU is");
    let a = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
    let b = [7.0f32, 8.0, 9.0, 10.0, 11.0, 12.0];
    let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let mut da = Allocation::<Device>::zeroed(&ctx, 24).expect("a");
    let mut db = Allocation::<Device>::zeroed(&ctx, 24).expect("b");
    let dc = Allocation::<Device>::zeroed(&ctx, 16).expect("c");
    da.write(&bytes(&a)).expect("write a");
    db.write(&bytes(&b)).expect("write b");
    let stream = Stream::new(&ctx).expect("stream");
    let gemm = row_major_2x3_by_3x2(da.device_ptr(), db.device_ptr(), dc.device_ptr());
    // SAFETY: the matrices hold what the dimensions describe; nothing else uses them until the synchronise.
    unsafe { blas.sgemm(stream.as_ref(), &gemm) }.expect("sgemm");
    stream.synchronize().expect("synchronise");
    let c: Vec<f32> = dc
        .read()
        .expect("read")
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(c, [58.0, 64.0, 139.0, 154.0], "row-major A·B");
    let bad = Sgemm { lda: 1, ..gemm };
    // SAFETY: as above; cuBLAS refuses the leading dimension before touching memory.
    let err = unsafe { blas.sgemm(stream.as_ref(), &bad) }.expect_err("lda < m");
    assert!(matches!(err, Error::Blas { call: "cublasSgemm", .. }), "{err:?}");
}

/// Thread-block clusters on compute capability 9.0 and later: the driver's sizes (the most blocks a cluster,
/// and how many clusters are resident at once, bounded by the SMs' threads), and a clustered launch whose
/// blocks read their rank in their cluster. Before 9.0, no cluster is resident.
#[test]
#[ignore = "needs an NVIDIA GPU and driver: `cargo xtask gpu-test` runs it on one (--include-ignored, KV_REQUIRE_GPU=1)"]
fn clusters_are_sized_by_the_driver_and_launch_in_place() {
    let Some(ctx) = open() else { return };
    let source = "extern \"C\" __global__ void __launch_bounds__(1024, 1) rank(unsigned int* out) {\n\
                  #if __CUDA_ARCH__ >= 900\n\
                  unsigned r; asm volatile(\"mov.u32 %0, %%cluster_ctarank;\" : \"=r\"(r));\n\
                  if (threadIdx.x == 0) out[blockIdx.x] = r;\n\
                  #endif\n\
                  }\n";
    let f = ctx.compile_module(source, &[]).expect("compiles").function("rank").expect("kernel");
    let config = LaunchConfig { grid: (8, 1, 1), block: (1024, 1, 1), shared_mem_bytes: 0 };
    if ctx.compute_capability() < (9, 0) {
        // The driver refuses, or holds none.
        if let Ok(clusters) = f.max_active_clusters(config, (2, 1, 1)) {
            assert_eq!(clusters, 0, "clusters before compute capability 9.0");
        }
        return;
    }
    f.allow_large_clusters().expect("large clusters on 9.0");
    let most = f.max_cluster_blocks(config).expect("cluster size");
    assert!(most >= 8, "a portable cluster holds 8 blocks, the driver says {most}");
    // Blocks of 1 024 threads: at most two an SM (2 048 threads), so at most a cluster of two an SM.
    let clusters = f.max_active_clusters(config, (2, 1, 1)).expect("active clusters");
    eprintln!("{most} blocks a cluster at most; {clusters} clusters of 2 resident");
    assert!(clusters >= 1 && clusters <= ctx.multiprocessors(), "{clusters} clusters of 2 resident");
    let out = Allocation::<Managed>::zeroed(&ctx, 8 * 4).expect("managed");
    let stream = Stream::new(&ctx).expect("stream");
    let mut ptr = out.device_ptr();
    let mut params: [*mut c_void; 1] = [(&mut ptr as *mut u64).cast()];
    // SAFETY: the parameter matches `rank(unsigned int*)`; `out` holds the grid's 8 values and is used by
    // nothing else until the stream synchronises below; the kernel needs nothing of its cluster but its rank.
    unsafe { f.launch_clustered(config, (2, 1, 1), false, stream.as_ref(), &mut params) }.expect("launch");
    stream.synchronize().expect("synchronise");
    let ranks = words(&out, u32::from_le_bytes);
    assert_eq!(ranks, [0, 1, 0, 1, 0, 1, 0, 1], "each block's rank in its cluster of 2");
}

/// `cublasGemmEx` in each element type (f32, f16, bf16; small integers, exact in all three), with the
/// handle's own workspace, on the caller's stream: the row-major `A·B` of
/// `cublas_multiplies_on_the_callers_stream`, then the same product captured into a CUDA graph (the workspace
/// given, cuBLAS allocates nothing) and replayed into a cleared `C`.
#[test]
#[ignore = "needs an NVIDIA GPU and driver: `cargo xtask gpu-test` runs it on one (--include-ignored, KV_REQUIRE_GPU=1)"]
fn cublas_gemm_ex_multiplies_halves_with_its_workspace_and_is_captured() {
    let Some(ctx) = open() else { return };
    let mut blas = Blas::new(&ctx).expect("cuBLAS is installed where the GPU is");
    blas.set_workspace(Allocation::<Device>::zeroed(&ctx, 32 << 20).expect("workspace"));
    let stream = Stream::new(&ctx).expect("stream");
    let a = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
    let b = [7.0f32, 8.0, 9.0, 10.0, 11.0, 12.0];
    for dtype in [GemmType::F32, GemmType::F16, GemmType::Bf16] {
        let bytes = |v: &[f32]| -> Vec<u8> {
            v.iter()
                .flat_map(|&x| match dtype {
                    GemmType::F32 => x.to_le_bytes().to_vec(),
                    GemmType::F16 => f16_of_integer(x).to_le_bytes().to_vec(),
                    GemmType::Bf16 => ((x.to_bits() >> 16) as u16).to_le_bytes().to_vec(),
                })
                .collect()
        };
        let values = |raw: Vec<u8>| -> Vec<f32> {
            match dtype {
                GemmType::F32 => {
                    raw.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
                }
                GemmType::F16 => {
                    raw.chunks_exact(2).map(|c| integer_of_f16(u16::from_le_bytes([c[0], c[1]]))).collect()
                }
                GemmType::Bf16 => raw
                    .chunks_exact(2)
                    .map(|c| f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16))
                    .collect(),
            }
        };
        let (ab, bb) = (bytes(&a), bytes(&b));
        let mut da = Allocation::<Device>::zeroed(&ctx, ab.len()).expect("a");
        let mut db = Allocation::<Device>::zeroed(&ctx, bb.len()).expect("b");
        let mut dc = Allocation::<Device>::zeroed(&ctx, ab.len() / 6 * 4).expect("c");
        da.write(&ab).expect("write a");
        db.write(&bb).expect("write b");
        let gemm = GemmEx {
            dtype,
            product: row_major_2x3_by_3x2(da.device_ptr(), db.device_ptr(), dc.device_ptr()),
        };
        // SAFETY: the matrices hold what the dimensions describe; nothing else uses them until the
        // synchronise.
        unsafe { blas.gemm_ex(stream.as_ref(), &gemm) }.expect("gemm_ex");
        stream.synchronize().expect("synchronise");
        assert_eq!(values(dc.read().expect("read")), [58.0, 64.0, 139.0, 154.0], "{dtype:?}: row-major A·B");
        dc.clear().expect("clear c");
        stream.begin_capture().expect("capture");
        // SAFETY: as above; captured, the product runs only when the graph is launched below.
        let captured = unsafe { blas.gemm_ex(stream.as_ref(), &gemm) };
        let graph = stream.end_capture().expect("a capturable product");
        captured.expect("captured gemm_ex");
        // SAFETY: the graph's matrices live and are untouched until the synchronise.
        unsafe { graph.launch(stream.as_ref()) }.expect("replay");
        stream.synchronize().expect("synchronise");
        assert_eq!(values(dc.read().expect("read")), [58.0, 64.0, 139.0, 154.0], "{dtype:?}: replayed");
    }
}

/// The IEEE half of a positive integer below 2048 (exact).
fn f16_of_integer(x: f32) -> u16 {
    let v = x as u32;
    let e = 31 - v.leading_zeros();
    (((e + 15) << 10) | ((v << (10 - e)) & 0x3ff)) as u16
}

/// The value of a positive, normal IEEE half that holds an integer.
fn integer_of_f16(h: u16) -> f32 {
    let e = i32::from(h >> 10) - 15;
    (1.0 + f32::from(h & 0x3ff) / 1024.0) * 2f32.powi(e)
}
