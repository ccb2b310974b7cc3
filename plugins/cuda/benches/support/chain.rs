//! What a chain of launches costs by itself: as many empty kernels as a decode step's CUDA graph holds, each
//! launched overlapping the one before it (programmatic dependent launch, as the delegate launches its
//! kernels), a block per multiprocessor, captured and replayed as a graph and timed like the step. A step
//! cannot take less than this chain: it is the floor a launch-bound model (a small one) meets before any byte
//! is read. A relay chain adds the least dependent work a launch of a step does: each block reads what the
//! launch before it wrote and writes what the next one reads (a row of a float a thread), which puts one
//! round trip through memory after each wait: the floor of a chain of launches that each depend on the last.

use std::ffi::c_void;

use cuda_rt::{Allocation, Context, Device, LaunchConfig, Stream};

/// The chain's kernel: it waits for the kernel before it and lets the next one start, and does nothing else.
const LINK: &str = r#"
extern "C" __global__ void link() {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

extern "C" __global__ void relay(const float* in, float* out) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = in[i] + 1.0f;
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
"#;

/// Threads a block of either chain.
const THREADS: u32 = 128;

/// Which chain: empty links, or links that each read the last one's output and write their own.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Chain {
    Empty,
    Relay,
}

fn text(err: impl std::fmt::Display) -> String {
    err.to_string()
}

/// GPU microseconds one replay of a graph of `launches` overlapped launches of `chain` takes, the mean of
/// `replays` after 10 untimed ones.
pub fn time_chain(ctx: &Context, launches: usize, replays: usize, chain: Chain) -> Result<f64, String> {
    let relay = chain == Chain::Relay;
    let module = ctx.compile_module(LINK, &[]).map_err(text)?;
    let kernel = module.function(if relay { "relay" } else { "link" }).map_err(text)?;
    let blocks = ctx.multiprocessors();
    let config = LaunchConfig { grid: (blocks, 1, 1), block: (THREADS, 1, 1), shared_mem_bytes: 0 };
    let bytes = (blocks * THREADS) as usize * std::mem::size_of::<f32>();
    let row = || Allocation::<Device>::zeroed(ctx, bytes).map_err(text);
    let (a, b) = (row()?, row()?);
    let stream = Stream::new(ctx).map_err(text)?;
    stream.begin_capture().map_err(text)?;
    let queued = (0..launches).try_for_each(|i| {
        let (mut from, mut to) =
            if i % 2 == 0 { (a.device_ptr(), b.device_ptr()) } else { (b.device_ptr(), a.device_ptr()) };
        let mut params = [(&mut from as *mut u64).cast::<c_void>(), (&mut to as *mut u64).cast::<c_void>()];
        let params = if relay { &mut params[..] } else { &mut [][..] };
        // SAFETY: `link` takes no parameters and touches no memory; `relay` takes two pointers (`params` points
        // at them, read during the call) to rows of a float a thread of the grid, both alive until the stream is
        // synchronised below, read and written only by the chain, in stream order; both kernels wait
        // (`griddepcontrol.wait`) before touching memory, as an overlapped launch requires; the stream is live
        // and of the kernels' context.
        unsafe { kernel.launch_overlapped(config, stream.as_ref(), params) }
    });
    let graph = stream.end_capture().map_err(text)?;
    queued.map_err(text)?;
    // SAFETY: the graph touches only `a` and `b`, alive until `time_replays` returns; the stream is of the
    // graph's context.
    unsafe { super::decode::time_replays(ctx, &stream, &graph, replays) }
}
