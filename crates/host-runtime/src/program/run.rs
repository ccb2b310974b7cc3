//! Running a method: its delegate calls in order, each given the program's stream when its plugin runs on
//! the GPU, then the write-backs copy-back mode needs and the copies the host makes between calls.

use std::time::Instant;

use delegate_abi::{DelegateError, ExecStats};

use super::{
    isolated, Buffer, CallInstance, CopySlot, CopyStats, Error, Gpu, HostCopy, LoadedCall, LoadedMethod,
};
use super::{MethodId, Program, RunStats};
use crate::buffer::Storage;
use crate::cuda;

impl Program {
    /// Runs `method` once, complete on return: [`Program::enqueue`], then [`Program::synchronize`].
    ///
    /// # Errors
    /// As [`Program::enqueue_id`]; work that fails on the stream after it was queued tears the buffers the
    /// method writes too.
    pub fn execute(&mut self, method: &str) -> Result<RunStats, Error> {
        let start = Instant::now();
        let id = self.method_id(method)?;
        let copies = self.enqueue_id(id)?.copies;
        if let Err(err) = self.synchronize() {
            self.tear(id, None);
            return Err(err);
        }
        Ok(RunStats { elapsed: start.elapsed(), copies })
    }

    /// Queues `method` once: its delegate calls in order, then the write-backs copy-back mode needs. GPU
    /// delegates and device write-backs may still be running on the program's stream when this returns (a
    /// program without CUDA memory is complete on return); every host access of the program's memory waits
    /// for them, and so does [`Program::synchronize`]. `elapsed` is the host time of queuing.
    pub fn enqueue(&mut self, method: &str) -> Result<RunStats, Error> {
        let id = self.method_id(method)?;
        self.enqueue_id(id)
    }

    /// [`Program::enqueue`] of a method looked up once.
    ///
    /// # Errors
    /// [`Error::TornBuffers`] when the method reads a buffer a failed run left torn (see [`Program`]); a
    /// run that fails itself marks the buffers the method writes as torn.
    pub fn enqueue_id(&mut self, method: MethodId) -> Result<RunStats, Error> {
        self.refuse_torn(method)?;
        self.position = None;
        let mut at = None;
        let run = self.run_method(method, &mut at);
        if run.is_err() {
            self.tear(method, at);
        }
        run
    }

    /// Queues the method's calls, write-backs and host copies; `at` is the call reached.
    pub(super) fn run_method(&mut self, method: MethodId, at: &mut Option<usize>) -> Result<RunStats, Error> {
        let start = Instant::now();
        let buffers = &mut self.buffers;
        let gpu = self.gpu.as_ref();
        let m = self.methods.get_mut(method.0).ok_or_else(|| Error::Usage("no such method".into()))?;
        let mut copies = CopyStats::default();
        let LoadedMethod { decl, inputs, outputs, calls, copies: host_copies } = m;
        run_host_copies(host_copies, None, buffers, inputs, outputs, gpu, &mut copies)?;
        for (index, call) in calls.iter_mut().enumerate() {
            *at = Some(index);
            let stats = run_call(call, gpu)?.map_err(|source| Error::Delegate {
                method: decl.name.clone(),
                call: index,
                backend: call.backend.clone(),
                stage: "execute",
                source,
            })?;
            copies.add(CopyStats {
                reflect_bytes: stats.reflect_bytes,
                staged_bytes: stats.staged_bytes,
                writeback_bytes: 0,
                op_bytes: 0,
            });
            copies.writeback_bytes += write_back(call, buffers, gpu)?;
            run_host_copies(host_copies, Some(index), buffers, inputs, outputs, gpu, &mut copies)?;
        }
        Ok(RunStats { elapsed: start.elapsed(), copies })
    }
}

/// Runs one call: on the program's stream when its plugin runs on the GPU, else after pending work is
/// waited for. The outer error is the wait's, the inner the delegate's.
fn run_call(call: &mut LoadedCall, gpu: Option<&Gpu>) -> Result<Result<ExecStats, DelegateError>, Error> {
    let stream = match gpu {
        Some(gpu) if call.streamed => Some(cuda::abi_stream(&gpu.stream)),
        Some(gpu) => {
            gpu.settle()?;
            None
        }
        None => None,
    };
    // The list was built at load from these storages; `&mut self` keeps every other access off them.
    let result = match &mut call.instance {
        CallInstance::InProcess(instance) => instance.execute(&mut call.arg_list, stream),
        CallInstance::Isolated(worker) => isolated::execute(worker),
        CallInstance::Unstarted(..) => Err(DelegateError::internal("the isolated call was never started")),
    };
    if let (Some(gpu), Some(_)) = (gpu, stream) {
        gpu.queued();
    }
    Ok(result)
}

/// Copies each copy-back slot of `call` into its buffer: queued on the stream for device and managed
/// buffers, a host copy (after pending work) otherwise. Returns the bytes written back.
fn write_back(call: &LoadedCall, buffers: &mut [Buffer], gpu: Option<&Gpu>) -> Result<u64, Error> {
    let mut bytes = 0;
    for &(scratch, buffer) in &call.writebacks {
        let buffer = &mut buffers[buffer];
        let copied = match gpu {
            Some(gpu) if !buffer.storage.host_copied() => {
                let copied = buffer.storage.copy_from_on(&call.scratch[scratch], &gpu.stream);
                gpu.queued();
                copied
            }
            Some(gpu) => {
                gpu.settle()?;
                buffer.storage.copy_from(&call.scratch[scratch])
            }
            None => buffer.storage.copy_from(&call.scratch[scratch]),
        };
        bytes += copied.map_err(|source| Error::BufferAccess {
            buffer: buffer.decl.name.clone(),
            action: "writing back",
            source,
        })?;
    }
    Ok(bytes)
}

/// One storage read and another written, of the same method's slots or the program's buffers.
fn copy_between(
    buffers: &mut [Buffer],
    inputs: &mut [Storage],
    outputs: &mut [Storage],
    from: CopySlot,
    to: CopySlot,
) -> Result<u64, cuda::Error> {
    fn pair<T>(items: &mut [T], from: usize, to: usize) -> (&T, &mut T) {
        if from < to {
            let (low, high) = items.split_at_mut(to);
            (&low[from], &mut high[0])
        } else {
            let (low, high) = items.split_at_mut(from);
            (&high[0], &mut low[to])
        }
    }
    if from == to {
        return Ok(0);
    }
    match (from, to) {
        (CopySlot::Input(a), CopySlot::Input(b)) => {
            let (src, dst) = pair(inputs, a, b);
            dst.copy_from(src)
        }
        (CopySlot::Output(a), CopySlot::Output(b)) => {
            let (src, dst) = pair(outputs, a, b);
            dst.copy_from(src)
        }
        (CopySlot::Buffer(a), CopySlot::Buffer(b)) => {
            let (src, dst) = pair(buffers, a, b);
            dst.storage.copy_from(&src.storage)
        }
        (CopySlot::Input(a), CopySlot::Output(b)) => outputs[b].copy_from(&inputs[a]),
        (CopySlot::Input(a), CopySlot::Buffer(b)) => buffers[b].storage.copy_from(&inputs[a]),
        (CopySlot::Output(a), CopySlot::Input(b)) => inputs[b].copy_from(&outputs[a]),
        (CopySlot::Output(a), CopySlot::Buffer(b)) => buffers[b].storage.copy_from(&outputs[a]),
        (CopySlot::Buffer(a), CopySlot::Input(b)) => inputs[b].copy_from(&buffers[a].storage),
        (CopySlot::Buffer(a), CopySlot::Output(b)) => outputs[b].copy_from(&buffers[a].storage),
    }
}

/// Runs the host copies placed after call `after`, counting a copy into a buffer as a write-back and any
/// other as an operator's copy. Pending GPU work is waited for first (the host touches the memory).
fn run_host_copies(
    host_copies: &[HostCopy],
    after: Option<usize>,
    buffers: &mut [Buffer],
    inputs: &mut [Storage],
    outputs: &mut [Storage],
    gpu: Option<&Gpu>,
    copies: &mut CopyStats,
) -> Result<(), Error> {
    for copy in host_copies.iter().filter(|c| c.after == after) {
        if let Some(gpu) = gpu {
            gpu.settle()?;
        }
        let copied = copy_between(buffers, inputs, outputs, copy.from, copy.to)
            .map_err(|source| Error::Stream { action: "copying between storages through", source })?;
        match copy.to {
            CopySlot::Buffer(_) => copies.writeback_bytes += copied,
            _ => copies.op_bytes += copied,
        }
    }
    Ok(())
}
