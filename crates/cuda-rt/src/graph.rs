//! CUDA graphs by stream capture: [`Stream::begin_capture`] records, instead of running, the work queued on a
//! stream; [`Stream::end_capture`] turns it into an instantiated [`Graph`] that [`Graph::launch`] replays
//! with one driver call.
//!
//! Capture uses `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`: while this thread captures, it may not call anything
//! that would synchronise with or implicitly order against the captured stream (a stream, context or event
//! synchronisation, a synchronous copy, a legacy-default-stream operation). Such a call fails and invalidates
//! the capture, and [`Stream::end_capture`] then reports it: work that does not stay on the stream cannot be
//! replayed, and a graph of it would be wrong.

use cudarc::driver::{result, sys};

use crate::context::Context;
use crate::driver;
use crate::error::Result;
use crate::stream::{Stream, StreamRef};

/// An instantiated CUDA graph (`CUgraph` and its `CUgraphExec`), destroyed on drop.
///
/// Graph objects are not internally synchronised (the driver's rule): a `Graph` moves between threads but is
/// not shared by them.
pub struct Graph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    ctx: Context,
    nodes: usize,
}

// SAFETY: the graph and its executable are owned by this value alone, and the driver allows using them from
// any thread with the context current (every use binds it). Not `Sync`: the driver does not synchronise
// concurrent uses of one graph.
unsafe impl Send for Graph {}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graph").field("device", &self.ctx.ordinal()).field("nodes", &self.nodes).finish()
    }
}

impl Stream {
    /// Starts capturing this stream (`cuStreamBeginCapture`, thread-local mode): work queued on it from now
    /// on is recorded, not run, until [`Stream::end_capture`].
    ///
    /// # Errors
    /// [`crate::Error::Driver`] when the driver refuses (e.g. the stream is already capturing).
    pub fn begin_capture(&self) -> Result<()> {
        let ctx = self.context();
        ctx.bind()?;
        let stream = self.as_ref().cu();
        driver::call("cuStreamBeginCapture", ctx.ordinal(), || {
            // SAFETY: `stream` is this live stream of the current context.
            unsafe {
                result::stream::begin_capture(
                    stream,
                    sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                )
            }
        })
    }

    /// Whether the stream is capturing; `Err` naming the invalidation when a capture was invalidated by a call
    /// that cannot be captured.
    ///
    /// # Errors
    /// [`crate::Error::Driver`] when the driver refuses.
    pub fn is_capturing(&self) -> Result<bool> {
        let ctx = self.context();
        ctx.bind()?;
        let stream = self.as_ref().cu();
        let status = driver::call("cuStreamIsCapturing", ctx.ordinal(), || {
            // SAFETY: `stream` is this live stream of the current context.
            unsafe { result::stream::is_capturing(stream) }
        })?;
        Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }

    /// Ends the capture (`cuStreamEndCapture`) and instantiates what was recorded
    /// (`cuGraphInstantiateWithFlags`). The stream runs work normally again whether or not this succeeds.
    ///
    /// # Errors
    /// [`crate::Error::Driver`] naming `cuStreamEndCapture` when the capture was invalidated (a call during
    /// capture synchronised, copied synchronously or used the legacy default stream:
    /// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`) or the stream was not capturing; naming
    /// `cuGraphInstantiate` when the graph cannot be instantiated.
    pub fn end_capture(&self) -> Result<Graph> {
        let ctx = self.context();
        ctx.bind()?;
        let stream = self.as_ref().cu();
        let graph = driver::call("cuStreamEndCapture", ctx.ordinal(), || {
            // SAFETY: `stream` is this live stream of the current context.
            unsafe { result::stream::end_capture(stream) }
        })?;
        let mut nodes = 0usize;
        let counted = driver::call("cuGraphGetNodes", ctx.ordinal(), || {
            // SAFETY: `graph` is the live graph just returned; a null node array asks only for the count.
            unsafe { sys::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut nodes) }.result()
        });
        if counted.is_err() {
            nodes = 0;
        }
        let exec = driver::call("cuGraphInstantiate", ctx.ordinal(), || {
            // SAFETY: `graph` is the live graph just captured.
            unsafe { result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) }
        });
        match exec {
            Ok(exec) => Ok(Graph { graph, exec, ctx: ctx.clone(), nodes }),
            Err(err) => {
                // SAFETY: `graph` is live, owned here, and destroyed once.
                if let Err(destroy) = unsafe { result::graph::destroy(graph) } {
                    tracing::warn!("leaking a CUDA graph: {}", driver::describe(destroy));
                }
                Err(err)
            }
        }
    }
}

impl Graph {
    /// Queues one replay of the graph on `stream` (`cuGraphLaunch`): one driver call, however many kernels
    /// and copies the graph holds.
    ///
    /// # Safety
    /// Every memory the captured work reads or writes is still valid for that use and not used by anything
    /// else until the stream has executed the replay (the addresses were fixed at capture); `stream` is a
    /// stream of the graph's context.
    ///
    /// # Errors
    /// [`crate::Error::Driver`] when the driver refuses.
    pub unsafe fn launch(&self, stream: StreamRef<'_>) -> Result<()> {
        self.ctx.bind()?;
        driver::call("cuGraphLaunch", self.ctx.ordinal(), || {
            // SAFETY: `exec` is live (destroyed only on drop); the memory it reaches is valid per this
            // function's contract; `stream` is valid for its borrow.
            unsafe { result::graph::launch(self.exec, stream.cu()) }
        })
    }

    /// Uploads the graph's resources ahead of its first launch (`cuGraphUpload`), so the first replay costs
    /// what every later one does.
    ///
    /// # Errors
    /// [`crate::Error::Driver`] when the driver refuses.
    pub fn upload(&self, stream: StreamRef<'_>) -> Result<()> {
        self.ctx.bind()?;
        driver::call("cuGraphUpload", self.ctx.ordinal(), || {
            // SAFETY: `exec` is live; uploading runs nothing the graph captured.
            unsafe { result::graph::upload(self.exec, stream.cu()) }
        })
    }

    /// How many nodes (kernels, copies, memsets, ...) the capture recorded.
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// The context it was captured in.
    pub fn context(&self) -> &Context {
        &self.ctx
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        let destroyed = self.ctx.bind().and_then(|()| {
            driver::call("cuGraphExecDestroy", self.ctx.ordinal(), || {
                // SAFETY: `exec` and `graph` were made in `end_capture` and are destroyed once, here; a replay
                // still queued keeps what it needs (the driver defers the release until it completes).
                unsafe { result::graph::exec_destroy(self.exec) }
                    .and_then(|()| unsafe { result::graph::destroy(self.graph) })
            })
        });
        if let Err(err) = destroyed {
            tracing::warn!("leaking a CUDA graph: {err}");
        }
    }
}
