//! CUDA graphs: a method run captured once, without running it, and replayed with one driver call.

use super::{CallInstance, CopyStats, Error, LoadedMethod, MethodId, Program};
use crate::cuda;

/// Work queued on the program's stream after a captured method run, captured with it.
pub(crate) type AfterCapture<'a> = dyn Fn(&Program) -> Result<(), Error> + 'a;

/// A method run captured into a CUDA graph ([`Program::capture`]), replayed by [`Program::replay`].
pub struct Captured {
    graph: cuda::Graph,
    program: u64,
    /// The program's [`Program::swap_caches`] count at capture: the caches whose addresses the graph holds.
    cache_epoch: u64,
    method: MethodId,
    copies: CopyStats,
}

impl std::fmt::Debug for Captured {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Captured")
            .field("graph", &self.graph)
            .field("method", &self.method)
            .field("copies", &self.copies)
            .finish()
    }
}

impl Captured {
    /// The bytes one replay copies (those of the captured run: the graph replays the same copies).
    pub fn copies(&self) -> CopyStats {
        self.copies
    }

    /// How many nodes (kernels, copies) the graph holds.
    pub fn nodes(&self) -> usize {
        self.graph.nodes()
    }
}

impl LoadedMethod {
    /// Whether every call gets the stream and every write-back is queued on it: nothing of the method runs
    /// on, or waits for, the host, so it can be captured into a CUDA graph.
    fn stays_on_stream(&self) -> Result<(), String> {
        if !self.copies.is_empty() {
            return Err(format!(
                "the method has {} copies the host makes between its calls",
                self.copies.len()
            ));
        }
        for (index, call) in self.calls.iter().enumerate() {
            if matches!(call.instance, CallInstance::Isolated(_) | CallInstance::Unstarted(..)) {
                return Err(format!(
                    "call {index} ({}) is served by plugin '{}' in a worker process, which answers each call \
                     after synchronising its own stream",
                    call.backend,
                    call.instance.plugin_name()
                ));
            }
            if let CallInstance::InProcess(instance) = &call.instance {
                let info = instance.plugin().info();
                if !info.capabilities.cuda_graph_capturable {
                    return Err(format!(
                        "call {index} ({}) is served by plugin '{}', which does not state the capability \
                         cuda_graph_capturable",
                        call.backend, info.name
                    ));
                }
            }
            if !call.streamed {
                return Err(format!(
                    "call {index} ({}) is served by plugin '{}', which computes on the host (it does not accept device memory)",
                    call.backend,
                    call.instance.plugin_name()
                ));
            }
            if let Some(&(scratch, _)) = call.writebacks.iter().find(|&&(s, _)| call.scratch[s].host_copied())
            {
                return Err(format!(
                    "call {index} ({}) writes back copy-back slot {scratch} in {} memory, which the host copies",
                    call.backend,
                    call.scratch[scratch].memory()
                ));
            }
        }
        Ok(())
    }
}

impl Program {
    /// Captures one [`Program::enqueue`] of `method` into a CUDA graph, without running it; replay it with
    /// [`Program::replay`]. Every call of the method must run on the GPU and keep all its work on the
    /// program's stream (no synchronisation, no synchronous copy, no host memory).
    ///
    /// # Errors
    /// [`Error::Capture`] naming what did not stay on the stream; [`Error::NoStream`] without CUDA memory.
    pub fn capture(&mut self, method: &str) -> Result<Captured, Error> {
        let id = self.method_id(method)?;
        self.capture_with(id, None)
    }

    /// Why `method` cannot be captured into a CUDA graph (a call that computes on the host or in a worker
    /// process, or copies the host makes), or `None` when it can.
    ///
    /// # Errors
    /// [`Error::Usage`] for an unknown method.
    pub fn capture_refusal(&self, method: &str) -> Result<Option<String>, Error> {
        Ok(self.method(method)?.stays_on_stream().err())
    }

    /// Refuses a CUDA graph of `method` before anything runs, from what is fixed at load: a call whose plugin
    /// does not state [`Capabilities::cuda_graph_capturable`](delegate_abi::Capabilities), or one that could
    /// not keep its work on the stream ([`Program::capture_refusal`]). A host calls it right after loading a
    /// program it will run with a CUDA graph; [`crate::generate::generate_with`] calls it before prefill.
    ///
    /// # Errors
    /// [`Error::NotCapturable`] naming the call, its plugin and the reason; [`Error::Usage`] for an unknown
    /// method.
    pub fn require_capturable(&self, method: &str) -> Result<(), Error> {
        match self.capture_refusal(method)? {
            Some(reason) => Err(Error::NotCapturable { method: method.to_owned(), reason }),
            None => Ok(()),
        }
    }

    /// Captures `method` and, when given, the work `then` queues after it (the generation loop's feedback),
    /// into one graph.
    pub(crate) fn capture_with(
        &mut self,
        method: MethodId,
        then: Option<&AfterCapture<'_>>,
    ) -> Result<Captured, Error> {
        let name = self.methods[method.0].decl.name.clone();
        let capture_error = |reason: String| Error::Capture { method: name.clone(), reason };
        let gpu = self.gpu("capturing a CUDA graph")?;
        self.methods[method.0].stays_on_stream().map_err(capture_error)?;
        self.refuse_torn(method)?;
        gpu.stream
            .begin_capture()
            .map_err(|source| Error::Stream { action: "beginning a capture on", source })?;
        // Captured, not run: a failure here writes nothing, so it tears nothing.
        let mut run = self.run_method(method, &mut None);
        if let (Ok(_), Some(then)) = (&run, then) {
            if let Err(err) = then(self) {
                run = Err(err);
            }
        }
        let gpu = self.gpu("capturing a CUDA graph")?;
        let ended = gpu.stream.end_capture();
        match (run, ended) {
            (Ok(stats), Ok(graph)) => {
                let (program, cache_epoch) = (self.id, self.cache_epoch);
                Ok(Captured { graph, program, cache_epoch, method, copies: stats.copies })
            }
            (Err(err), _) => Err(capture_error(err.to_string())),
            (Ok(_), Err(err)) => Err(capture_error(err.to_string())),
        }
    }

    /// Queues one replay of a captured method run on the program's stream: one driver call.
    ///
    /// # Errors
    /// [`Error::Usage`] for a graph another program captured (its addresses are that program's memory) or
    /// captured before [`Program::swap_caches`] changed the caches; [`Error::Stream`] when the driver refuses.
    pub fn replay(&mut self, captured: &Captured) -> Result<CopyStats, Error> {
        if captured.program != self.id {
            return Err(Error::Usage(
                "the graph was captured by another program, whose memory it uses".into(),
            ));
        }
        if captured.cache_epoch != self.cache_epoch {
            return Err(Error::Usage(
                "the graph was captured with other caches (Program::swap_caches ran since), whose addresses \
                 it holds: capture it again"
                    .into(),
            ));
        }
        self.refuse_torn(captured.method)?;
        self.position = None;
        let gpu = self.gpu("replaying a CUDA graph")?;
        cuda::replay(&captured.graph, &gpu.stream)
            .map_err(|source| Error::Stream { action: "replaying a graph on", source })?;
        gpu.queued();
        Ok(captured.copies)
    }
}
