//! The worker side of an isolated call: [`serve`] takes the init request and its memory files, maps them
//! ([`WorkerMappings`]), loads the library (checked against its manifest) and initialises the one instance,
//! builds the argument list over the mappings once, then answers each ring of the doorbell until the host
//! asks it to finish. A watch thread ends the worker if its host goes away without asking.
#![allow(unsafe_code)]

use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Instant;

use delegate_abi::host::{ArgList, HostConfig, Instance};
use delegate_abi::{
    Compatibility, CudaStream, DTypeCode, DelegateError, ExecStats, InitContext, MemoryKind, TensorArg,
};

use super::bell::{Bell, Woken};
use super::mapping::Mapping;
use super::wire::{build_reply, recv_frame, send_all, InitRequest, PROTOCOL};
use super::WORKER_FD;

/// Why a worker stopped serving.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// The socket failed, or the host sent something this worker does not understand.
    #[error("worker: {0}")]
    Protocol(String),
}

/// Serves the host on `socket` (the worker side; `delegate-host worker` calls it with descriptor
/// [`WORKER_FD`]): initialises the one instance the host asks for, runs each `execute` it sends, and returns
/// when the host closes the socket (the instance is destroyed first).
///
/// # Errors
/// [`WorkerError::Protocol`] when the socket fails or a message is malformed. A plugin's own failure is sent
/// to the host as that call's error, not returned.
pub fn serve(socket: OwnedFd) -> Result<(), WorkerError> {
    let protocol = |what: String| WorkerError::Protocol(what);
    let mut stream = UnixStream::from(socket);
    let mut answer = Vec::with_capacity(64);
    let (payload, fds) =
        recv_frame(stream.as_fd()).map_err(|err| protocol(format!("reading init: {err}")))?;
    let request: InitRequest =
        serde_json::from_slice(&payload).map_err(|err| protocol(format!("malformed init: {err}")))?;
    if request.protocol != PROTOCOL {
        return Err(protocol(format!(
            "the host speaks worker protocol {}, this worker {PROTOCOL}: run the host's own binary as its worker",
            request.protocol
        )));
    }
    let mut fds = fds;
    let bell = fds.pop().ok_or_else(|| protocol("init came without its doorbell".to_owned()))?;
    let bell = Arc::new(Bell::open(bell.as_fd()).map_err(|err| protocol(err.to_string()))?);
    watch_host(&stream, Arc::clone(&bell))
        .map_err(|err| protocol(format!("cannot watch the host: {err}")))?;
    // Declared first, dropped last: the instance and its argument list go before the memory they use.
    let mappings = match WorkerMappings::new(&request, fds) {
        Ok(mappings) => mappings,
        Err(err) => return delivered(reply(&mut stream, &mut answer, Err(err))),
    };
    let started = init(&request, &mappings);
    let (mut instance, mut args) = match started {
        Ok(started) => {
            reply(&mut stream, &mut answer, Ok(ExecStats::default()))
                .map_err(|err| protocol(err.to_string()))?;
            started
        }
        Err(err) => return delivered(reply(&mut stream, &mut answer, Err(err))),
    };
    let mut last = 0;
    loop {
        let seq = match bell.next(last, || host_gone(stream.as_fd())) {
            Woken::Request(seq) => seq,
            Woken::Finish => return Ok(()),
        };
        last = seq;
        let result = match &mappings.stream {
            None => instance.execute(&mut args, None),
            Some(stream) => {
                // SAFETY: a stream this worker made in the context of the device memory it opened, alive
                // until `mappings` is dropped after the instance; the results are complete when the
                // synchronisation below returns, before the host is answered and touches them.
                let raw = unsafe { CudaStream::from_raw(stream.as_ref().as_raw()) };
                let start = Instant::now();
                let result = instance.execute(&mut args, raw);
                let queued = start.elapsed();
                let result = result
                    .and_then(|stats| stream.synchronize().map(|()| stats).map_err(DelegateError::from));
                tracing::debug!(
                    queue_us = queued.as_secs_f64() * 1e6,
                    total_us = start.elapsed().as_secs_f64() * 1e6,
                    "worker execute"
                );
                result
            }
        };
        // The doorbell says first that the call failed; the host then reads the error's message while it is
        // sent (one longer than the socket's buffer would block a worker that sent it before ringing).
        bell.answer(seq, &result);
        if result.is_err() {
            build_reply(&mut answer, &result).map_err(|err| protocol(err.to_string()))?;
            // A host that has stopped listening (it stopped this worker) has its answer already: the next
            // wait sees it finish.
            delivered(send_all(stream.as_fd(), &answer, None))?;
        }
    }
}

/// Starts the thread that ends this worker when its host goes away without asking it to finish (killed or
/// crashed): the main thread may be stuck inside the plugin, where nothing else would notice, and a worker
/// must not outlive its host. A host that stops its worker rings `finish` before it closes the socket; the
/// main thread then destroys the instance and exits in its own time.
fn watch_host(socket: &UnixStream, bell: Arc<Bell>) -> io::Result<()> {
    let mut watch = socket.try_clone()?;
    std::thread::Builder::new().name("host-watch".to_owned()).spawn(move || {
        // The host writes nothing after init: a read returns at its end of file (or on a broken protocol).
        let mut byte = [0u8; 1];
        while let Err(err) = watch.read(&mut byte) {
            if err.kind() != io::ErrorKind::Interrupted {
                break;
            }
        }
        if !bell.finishing() {
            use rustix::process::{getpid, kill_process, Signal};
            let _ = kill_process(getpid(), Signal::KILL);
        }
    })?;
    Ok(())
}

/// Whether the host's end of the socket is closed (the host went away without ringing): the host never
/// writes to it after init, so anything readable is its end of file.
fn host_gone(socket: BorrowedFd<'_>) -> bool {
    use rustix::event::{poll, PollFd, PollFlags};
    let mut fds = [PollFd::new(&socket, PollFlags::IN)];
    let zero = rustix::event::Timespec { tv_sec: 0, tv_nsec: 0 };
    match poll(&mut fds, Some(&zero)) {
        Ok(0) => false,
        Ok(_) => true,
        Err(rustix::io::Errno::INTR) => false,
        Err(_) => true,
    }
}

/// [`serve`] on descriptor [`WORKER_FD`], where the host put the socket.
///
/// # Errors
/// [`WorkerError::Protocol`] when descriptor 3 is not a socket (the process was not started by a host), and
/// as [`serve`].
pub fn serve_inherited() -> Result<(), WorkerError> {
    use std::os::fd::FromRawFd;
    let not_started = || {
        WorkerError::Protocol(format!(
            "descriptor {WORKER_FD} is not a socket: a worker is started by a host running an isolated plugin"
        ))
    };
    // SAFETY: only a look at descriptor 3 (no ownership is taken): `fstat` of a closed descriptor fails with
    // EBADF, which is handled.
    let stat = rustix::fs::fstat(unsafe { BorrowedFd::borrow_raw(WORKER_FD) }).map_err(|_| not_started())?;
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::Socket {
        return Err(not_started());
    }
    // SAFETY: descriptor 3 is open and is a socket (checked above); the host handed it to this process for the
    // worker's exclusive use, and nothing else in the process owns it.
    serve(unsafe { OwnedFd::from_raw_fd(WORKER_FD) })
}

/// An answer's delivery as [`serve`] reports it: a host that closed its end (it stopped this worker, or went
/// away) is no failure of the worker's, and nothing is printed for it.
fn delivered(sent: io::Result<()>) -> Result<(), WorkerError> {
    match sent {
        Err(err) if !matches!(err.kind(), io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset) => {
            Err(WorkerError::Protocol(err.to_string()))
        }
        _ => Ok(()),
    }
}

/// Sends one answer, built in `message` (the worker's one buffer: a successful call allocates nothing).
fn reply(
    stream: &mut UnixStream,
    message: &mut Vec<u8>,
    result: Result<ExecStats, DelegateError>,
) -> io::Result<()> {
    build_reply(message, &result)?;
    send_all(stream.as_fd(), message, None)
}

/// The host's memory, reachable from the worker: the blob mapped read-only, host regions mapped read-write,
/// device regions opened with CUDA IPC (and a stream for the plugin when there are any).
struct WorkerMappings {
    blob: Mapping,
    /// The init request's regions, in its order (an argument names its region by index).
    regions: Vec<Reached>,
    /// The plugin's stream, made in the context of the device memory opened (`None` without any).
    stream: Option<cuda_rt::Stream>,
}

/// One region as the worker reaches it.
enum Reached {
    /// A host memory file, mapped.
    Host(Mapping),
    /// A device allocation, opened from its IPC handle.
    Device(cuda_rt::IpcMapping),
}

impl WorkerMappings {
    /// Maps the blob and each region of `request` from `fds` (the blob's file first, then the host
    /// regions' in order) and opens each device region; a file too short or missing is an error.
    fn new(request: &InitRequest, fds: Vec<OwnedFd>) -> Result<WorkerMappings, DelegateError> {
        let host_regions = request.regions.iter().filter(|r| r.device.is_none()).count();
        if fds.len() != host_regions + 1 {
            return Err(DelegateError::internal(format!(
                "init came with {} memory files, expected {}",
                fds.len(),
                host_regions + 1
            )));
        }
        let blob = Mapping::new(fds[0].as_fd(), request.blob_len, false)?;
        let mut files = fds[1..].iter();
        let mut regions = Vec::with_capacity(request.regions.len());
        let mut stream = None;
        for region in &request.regions {
            regions.push(match &region.device {
                None => {
                    let fd =
                        files.next().ok_or_else(|| DelegateError::internal("a memory file is missing"))?;
                    Reached::Host(Mapping::new(fd.as_fd(), region.len, true)?)
                }
                Some((ordinal, bytes)) => {
                    let bytes: [u8; 64] = bytes
                        .as_slice()
                        .try_into()
                        .map_err(|_| DelegateError::internal("a malformed IPC handle"))?;
                    let len =
                        usize::try_from(region.len).map_err(|_| DelegateError::internal("a huge region"))?;
                    let ctx = cuda_rt::Context::open(*ordinal).map_err(DelegateError::from)?;
                    if stream.is_none() {
                        stream = Some(cuda_rt::Stream::new(&ctx).map_err(DelegateError::from)?);
                    }
                    let mapping = cuda_rt::IpcMapping::open(&ctx, &cuda_rt::IpcHandle(bytes), len);
                    Reached::Device(mapping.map_err(DelegateError::from)?)
                }
            });
        }
        Ok(WorkerMappings { blob, regions, stream })
    }

    /// The blob's bytes.
    fn blob(&self) -> &[u8] {
        // SAFETY: a read-only mapping of `len` readable bytes, alive as long as `self`. The host wrote the blob
        // before sending the file and sealed it against writes, shrinking and growing: its bytes cannot change
        // while they are borrowed.
        unsafe { std::slice::from_raw_parts(self.blob.ptr.cast::<u8>(), self.blob.len) }
    }
}

/// Loads the library (checked against its manifest), asks it about the blob, initialises the instance and
/// builds the argument list over the mapped regions.
fn init(
    request: &InitRequest,
    mappings: &WorkerMappings,
) -> Result<(Instance, ArgList<'static>), DelegateError> {
    let manifest_path = crate::plugins::library::manifest::PluginManifest::path_for(&request.library);
    let manifest = crate::plugins::library::manifest::PluginManifest::read(&manifest_path)
        .map_err(|err| DelegateError::invalid_program(format!("{}: {err}", manifest_path.display())))?;
    let plugin = crate::plugins::library::load_checked(&request.library, Some(&manifest), &HostConfig::new())
        .map_err(|reason| {
            DelegateError::invalid_program(format!("{}: {reason}", request.library.display()))
        })?;
    let blob = mappings.blob();
    if let Compatibility::Unsupported { reason } = plugin.compatibility(blob)? {
        return Err(DelegateError::invalid_program(format!(
            "plugin '{}' does not support the blob: {reason}",
            plugin.info().name
        )));
    }
    let instance = plugin.init(&InitContext { blob, compile_specs: &[], runtime_specs: &[] })?;
    let mut args = ArgList::with_capacity(request.args.len());
    for (index, desc) in request.args.iter().enumerate() {
        let bad = |why: String| DelegateError::invalid_argument(format!("argument {index}: {why}"));
        let region = mappings.regions.get(desc.region).ok_or_else(|| bad("no such memory region".into()))?;
        let (base, len, memory, device) = match region {
            Reached::Host(mapping) => (mapping.ptr.cast::<u8>(), mapping.len, MemoryKind::Host, 0),
            Reached::Device(mapping) => {
                (mapping.as_ptr().cast::<u8>(), mapping.len(), MemoryKind::Device, mapping.device())
            }
        };
        let end = desc.offset.checked_add(desc.nbytes).ok_or_else(|| bad("overflows".into()))?;
        if end > len as u64 {
            return Err(bad(format!("bytes {}..{end} are outside its {len}-byte region", desc.offset)));
        }
        let dtype = DTypeCode::try_from(desc.dtype).map_err(|err| bad(err.to_string()))?;
        let mut arg =
            TensorArg::describe(dtype, &desc.dims, memory).ok_or_else(|| bad("rank too large".into()))?;
        // `offset..end` lies inside the region (checked above): plain address arithmetic, no access.
        arg.data = base.wrapping_add(desc.offset as usize).cast();
        arg.nbytes = desc.nbytes;
        arg.flags = desc.flags;
        arg.device_id = device;
        // SAFETY: `arg` describes `nbytes` bytes inside a shared host mapping or an IPC-opened device
        // allocation, both kept until after the list and the instance are dropped (`serve` declares them
        // first). The host lent these bytes to this call exactly as it lends them to an in-process instance
        // (one list built at load, a writable arg sharing storage only with its in-place output), and while the
        // worker runs a call the host waits for the answer, its own stream settled, without touching them.
        unsafe { args.push_raw(arg) }.map_err(|err| bad(err.to_string()))?;
    }
    Ok((instance, args))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_sees_its_host_gone_when_the_host_end_of_the_socket_closes() {
        let (host, worker) = UnixStream::pair().expect("a socket pair");
        assert!(!host_gone(worker.as_fd()), "a host that is there read as gone");
        drop(host);
        assert!(host_gone(worker.as_fd()), "a closed host end read as still there");
    }
}
