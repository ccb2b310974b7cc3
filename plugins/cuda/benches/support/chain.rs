//! What a chain of launches costs by itself: as many empty kernels as a decode step's CUDA graph holds, each
//! launched overlapping the one before it (programmatic dependent launch, as the delegate launches its
//! kernels), a block per multiprocessor, captured and replayed as a graph and timed like the step. A step
//! cannot take less than this chain: it is the floor a launch-bound model (a small one) meets before any byte
//! is read.

use cuda_rt::{Context, Event, LaunchConfig, Stream};

/// The chain's kernel: it waits for the kernel before it and lets the next one start, and does nothing else.
const LINK: &str = r#"
extern "C" __global__ void link() {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
"#;

fn text(err: impl std::fmt::Display) -> String {
    err.to_string()
}

/// GPU microseconds one replay of a graph of `launches` empty overlapped launches takes, the mean of `replays`
/// after 10 untimed ones.
pub fn time_empty_chain(ctx: &Context, launches: usize, replays: usize) -> Result<f64, String> {
    let link = ctx.compile_module(LINK, &[]).and_then(|m| m.function("link")).map_err(text)?;
    let config =
        LaunchConfig { grid: (ctx.multiprocessors(), 1, 1), block: (128, 1, 1), shared_mem_bytes: 0 };
    let stream = Stream::new(ctx).map_err(text)?;
    stream.begin_capture().map_err(text)?;
    let queued = (0..launches).try_for_each(|_| {
        // SAFETY: `link` takes no parameters and touches no memory; it waits (`griddepcontrol.wait`) before
        // finishing, as an overlapped launch requires; the stream is live and of the kernel's context.
        unsafe { link.launch_overlapped(config, stream.as_ref(), &mut []) }
    });
    let chain = stream.end_capture().map_err(text)?;
    queued.map_err(text)?;
    let (start, end) = (Event::timed(ctx).map_err(text)?, Event::timed(ctx).map_err(text)?);
    // SAFETY: the graph's kernels touch no memory; the stream is of the graph's context.
    let replay = || unsafe { chain.launch(stream.as_ref()) }.map_err(text);
    for _ in 0..10 {
        replay()?;
    }
    start.record(stream.as_ref()).map_err(text)?;
    for _ in 0..replays {
        replay()?;
    }
    end.record(stream.as_ref()).map_err(text)?;
    end.synchronize().map_err(text)?;
    Ok(f64::from(end.elapsed_ms(&start).map_err(text)?) * 1e3 / replays as f64)
}
