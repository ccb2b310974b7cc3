//! CUDA graphs by stream capture and the host-synchronisation counter, where a driver and a GPU exist; on a
//! machine without a driver each test asserts the typed `NotSupported` error instead and says that it needs a
//! GPU, so none passes silently.

use std::ffi::c_void;

use cuda_rt::{stats, Allocation, Context, Device, Error, LaunchConfig, Stream};
use et_error::{ErrorCode, HasErrorCode};

/// Device 0's context, or `None` after checking that its absence is the typed error of a machine without a
/// driver (and saying that the test needs a GPU).
fn open() -> Option<Context> {
    match Context::open(0) {
        Ok(ctx) => Some(ctx),
        Err(err) => {
            eprintln!("this test needs a GPU; without one it checks the typed error only: {err}");
            assert_eq!(err.error_code(), ErrorCode::NotSupported, "{err}");
            assert!(
                matches!(err, Error::NoDriver { .. } | Error::DriverUnusable { .. } | Error::NoDevice { .. }),
                "{err:?}"
            );
            assert!(!std::path::Path::new("/dev/nvidiactl").exists(), "a driver exists but: {err}");
            None
        }
    }
}

const INCREMENT: &str = r#"
extern "C" __global__ void increment(long long* x) {
    if (blockIdx.x == 0 && threadIdx.x == 0) { x[0] += 1; }
}
"#;

#[test]
#[ignore = "needs an NVIDIA GPU and driver: `cargo xtask gpu-test` runs it on one (--include-ignored, KV_REQUIRE_GPU=1)"]
fn a_captured_graph_replays_its_work_without_a_host_synchronisation() {
    let Some(ctx) = open() else { return };
    let kernel = ctx.compile_module(INCREMENT, &[]).expect("compiles").function("increment").expect("kernel");
    let counter = Allocation::<Device>::zeroed(&ctx, 8).expect("device memory");
    let copy = Allocation::<Device>::zeroed(&ctx, 8).expect("device memory");
    let stream = Stream::new(&ctx).expect("stream");
    let config = LaunchConfig { grid: (1, 1, 1), block: (1, 1, 1), shared_mem_bytes: 0 };

    stream.begin_capture().expect("begin capture");
    assert!(stream.is_capturing().expect("status"));
    let mut ptr = counter.device_ptr();
    let mut params: [*mut c_void; 1] = [(&mut ptr as *mut u64).cast()];
    // SAFETY: `increment(long long*)` gets one pointer to 8 bytes of device memory that lives (and is touched
    // by nothing else) until the stream synchronises below; captured, it does not even run yet.
    unsafe { kernel.launch(config, stream.as_ref(), &mut params) }.expect("captured launch");
    // SAFETY: both are live 8-byte allocations used by nothing else until the synchronisation below.
    unsafe { ctx.copy_dtod_async(copy.device_ptr(), counter.device_ptr(), 8, stream.as_ref()) }
        .expect("copy");
    let graph = stream.end_capture().expect("end capture");
    assert!(!stream.is_capturing().expect("status"));
    assert_eq!(graph.nodes(), 2, "one kernel and one copy");
    assert_eq!(counter.read().expect("read"), 0i64.to_le_bytes(), "capturing runs nothing");

    graph.upload(stream.as_ref()).expect("upload");
    let before = stats::thread_host_syncs();
    for _ in 0..10 {
        // SAFETY: the captured addresses are `counter` and `copy`, live until the synchronisation below.
        unsafe { graph.launch(stream.as_ref()) }.expect("replay");
    }
    assert_eq!(stats::thread_host_syncs(), before, "replays queue work and never block the host");
    stream.synchronize().expect("synchronise");
    assert_eq!(stats::thread_host_syncs(), before + 1, "the synchronisation is counted");
    assert_eq!(counter.read().expect("read"), 10i64.to_le_bytes());
    assert_eq!(copy.read().expect("read"), 10i64.to_le_bytes());
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: `cargo xtask gpu-test` runs it on one (--include-ignored, KV_REQUIRE_GPU=1)"]
fn a_synchronisation_during_capture_invalidates_it_with_a_typed_error() {
    let Some(ctx) = open() else { return };
    let stream = Stream::new(&ctx).expect("stream");
    stream.begin_capture().expect("begin capture");
    let sync = stream.synchronize();
    assert!(sync.is_err(), "synchronising a capturing stream is refused");
    let err = stream.end_capture().expect_err("the capture was invalidated");
    assert!(matches!(&err, Error::Driver { call: "cuStreamEndCapture", .. }), "{err:?}");
    assert!(err.to_string().contains("CAPTURE"), "{err}");
    // The stream works normally again.
    stream.synchronize().expect("synchronise after the failed capture");
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: `cargo xtask gpu-test` runs it on one (--include-ignored, KV_REQUIRE_GPU=1)"]
fn every_blocking_call_counts_one_host_synchronisation() {
    let Some(ctx) = open() else { return };
    let mut memory = Allocation::<Device>::zeroed(&ctx, 64).expect("device memory");
    let stream = Stream::new(&ctx).expect("stream");
    // Counted on this thread, so other tests running at once do not blur the figures; the process-wide
    // count sees at least as many.
    let counted = |f: &mut dyn FnMut()| {
        let (before, all) = (stats::thread_host_syncs(), stats::host_syncs());
        f();
        let mine = stats::thread_host_syncs() - before;
        assert!(stats::host_syncs() - all >= mine);
        mine
    };
    assert_eq!(counted(&mut || drop(memory.read().expect("read"))), 1);
    assert_eq!(counted(&mut || memory.write(&[1; 64]).expect("write")), 1);
    assert_eq!(counted(&mut || memory.clear().expect("clear")), 1);
    assert_eq!(counted(&mut || stream.synchronize().expect("stream")), 1);
    assert_eq!(counted(&mut || ctx.synchronize().expect("context")), 1);
}
