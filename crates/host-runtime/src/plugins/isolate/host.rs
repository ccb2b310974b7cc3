//! The host side of an isolated call: [`IsolatedCall`] locates the call's arguments in the program's shared
//! memory, starts a worker with its socket and sends it init, rings it for each `execute` (reading a
//! failure's message from the socket), and stops it (asking first, killing it past a grace or its deadline),
//! saying how it ended: a signal, an exit status, a missed deadline or a broken protocol.

use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use delegate_abi::host::ArgList;
use delegate_abi::{DelegateError, ExecStats, MemoryKind, TensorArg};

use super::bell::{Bell, Rung};
use super::wire::{
    parse_answer, read_until, send_frame, Answer, ArgDesc, InitRequest, RegionDesc, MAX_MESSAGE, MAX_REGIONS,
    PROTOCOL,
};
use super::{IsolatedPlugin, MIN_INIT_DEADLINE, WORKER_FD};

/// How long a failed or malformed worker gets to exit by itself before it is killed.
const STOP_GRACE: Duration = Duration::from_millis(200);

/// A storage an argument may live in, as a worker reaches it: its address range here, and how.
pub(crate) struct Region {
    /// Its first byte's address in the host.
    base: usize,
    len: usize,
    kind: RegionKind,
}

/// How a worker reaches a region.
enum RegionKind {
    /// A host memory file it maps.
    Host(OwnedFd),
    /// A device allocation it opens with CUDA IPC.
    Device(i32, cuda_rt::IpcHandle),
}

impl Region {
    /// The region of a shared host storage or a device allocation; `None` for any other storage (heap host
    /// memory, pinned and managed memory: nothing a worker can reach).
    pub(crate) fn of(storage: &crate::buffer::Storage) -> Option<Result<Region, String>> {
        use crate::buffer::Storage;
        match storage {
            Storage::Host(host) => {
                let fd = host.shared_fd()?.try_clone_to_owned();
                let base = host.bytes().as_ptr() as usize;
                Some(
                    fd.map(|fd| Region { base, len: host.len(), kind: RegionKind::Host(fd) })
                        .map_err(|e| e.to_string()),
                )
            }
            Storage::Device(device) => {
                let handle = device.ipc_handle();
                let base = device.as_ptr() as usize;
                let kind = |handle| RegionKind::Device(device.device(), handle);
                Some(
                    handle
                        .map(|h| Region { base, len: device.len(), kind: kind(h) })
                        .map_err(|e| e.to_string()),
                )
            }
            _ => None,
        }
    }
}

/// One isolated call's instance: the worker running it, and everything needed to start another.
pub(crate) struct IsolatedCall {
    plugin: IsolatedPlugin,
    /// The blob's sealed memory file, sent to every worker this call starts.
    blob: OwnedFd,
    blob_len: u64,
    /// The host regions' memory files, in the order of `regions`' host entries.
    files: Vec<OwnedFd>,
    regions: Vec<RegionDesc>,
    args: Vec<ArgDesc>,
    /// The running worker; `None` once it is stopped, until the next call starts one.
    worker: Option<Worker>,
    /// The buffer a worker's answer on the socket is read into, kept from call to call.
    reply: Vec<u8>,
}

/// A running worker: its process, the host's end of its socket, and the doorbell it answers.
struct Worker {
    child: Child,
    socket: UnixStream,
    bell: Bell,
}

impl std::fmt::Debug for IsolatedCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IsolatedCall")
            .field("library", &self.plugin.library)
            .field("worker", &self.worker.as_ref().map(|w| w.child.id()))
            .finish()
    }
}

impl IsolatedCall {
    /// Prepares the call: the blob goes into a memory file (one copy, at load), each argument is located in
    /// `regions`, and the first worker is started and initialised.
    pub(crate) fn start(
        plugin: IsolatedPlugin,
        blob: &[u8],
        args: &ArgList<'_>,
        regions: &[Region],
    ) -> Result<IsolatedCall, DelegateError> {
        let blob_file = sealed_blob(blob)?;
        let (used, descs) = locate_args(args.as_slice(), regions)?;
        if used.len() > MAX_REGIONS {
            return Err(DelegateError::not_supported(format!(
                "the call's arguments live in {} buffers; an isolated call takes at most {MAX_REGIONS}",
                used.len()
            )));
        }
        let (files, region_descs) = describe_regions(&used, regions)?;
        let mut call = IsolatedCall {
            plugin,
            blob: blob_file,
            blob_len: blob.len() as u64,
            files,
            regions: region_descs,
            args: descs,
            worker: None,
            reply: Vec::with_capacity(256),
        };
        call.spawn()?;
        Ok(call)
    }

    /// The plugin's name (its manifest's).
    pub(crate) fn name(&self) -> &str {
        &self.plugin.info.name
    }

    /// Starts a worker and initialises the instance in it.
    fn spawn(&mut self) -> Result<(), DelegateError> {
        use command_fds::{CommandFdExt, FdMapping};
        let isolation = self.plugin.isolation.clone();
        let name = self.plugin.info.name.clone();
        let internal = |what: String| DelegateError::internal(format!("plugin '{name}': {what}"));
        let (host, worker) =
            UnixStream::pair().map_err(|err| internal(format!("cannot make a socket: {err}")))?;
        let mut cmd = Command::new(&isolation.program);
        cmd.args(&isolation.args).stdin(Stdio::null());
        // What the plugin prints is not the host's output: the worker's stdout is the host's stderr.
        match io::stderr().as_fd().try_clone_to_owned() {
            Ok(stderr) => cmd.stdout(Stdio::from(stderr)),
            Err(_) => cmd.stdout(Stdio::null()),
        };
        cmd.fd_mappings(vec![FdMapping { parent_fd: worker.into(), child_fd: WORKER_FD }])
            .map_err(|err| internal(format!("cannot pass the socket: {err}")))?;
        let child = cmd.spawn().map_err(|err| {
            internal(format!("cannot start the worker {}: {err}", isolation.program.display()))
        })?;
        drop(cmd); // closes the parent's copy of the worker's end, so the worker's death reads as end of file
        let init_deadline = isolation.deadline.max(MIN_INIT_DEADLINE);
        let until = Instant::now() + init_deadline;
        // Every read and write waits with `poll` for what is left of its call's deadline.
        host.set_nonblocking(true)
            .map_err(|err| internal(format!("cannot make the socket non-blocking: {err}")))?;
        let request = InitRequest {
            protocol: PROTOCOL,
            library: self.plugin.library.clone(),
            blob_len: self.blob_len,
            regions: self.regions.clone(),
            args: self.args.clone(),
        };
        let payload = serde_json::to_vec(&request).map_err(|err| internal(err.to_string()))?;
        let (bell, bell_file) = Bell::create()?;
        // The blob, the host regions in order, and the doorbell last.
        let mut fds = vec![self.blob.as_fd()];
        fds.extend(self.files.iter().map(|fd| fd.as_fd()));
        fds.push(bell_file.as_fd());
        let sent = send_frame(host.as_fd(), &payload, &fds, Some(until));
        self.worker = Some(Worker { child, socket: host, bell });
        let answered = match sent {
            Ok(()) => match self.read_answer("init", until, init_deadline)? {
                Answer::Ok => Ok(()),
                Answer::Err(err) => Err(err),
            },
            Err(err) => Err(self.failure("init", err, init_deadline)),
        };
        if answered.is_err() {
            self.stop(STOP_GRACE);
        }
        answered
    }

    /// Runs the call in the worker, starting one first if the last one died.
    pub(crate) fn execute(&mut self) -> Result<ExecStats, DelegateError> {
        if self.worker.is_none() {
            self.spawn()?;
        }
        let deadline = self.plugin.isolation.deadline;
        // One deadline for the whole call: the ring, and the failure's message after it.
        let until = Instant::now() + deadline;
        let Some(Worker { child, bell, .. }) = self.worker.as_mut() else {
            return Err(DelegateError::internal("no worker"));
        };
        match bell.call(until, || matches!(child.try_wait(), Ok(None))) {
            Rung::Ok(stats) => Ok(stats),
            // The message follows the ring on the socket: read it there.
            Rung::Failed => match self.read_answer("execute", until, deadline)? {
                Answer::Err(err) => match self.pending() {
                    0 => Err(err),
                    more => Err(self
                        .protocol_error(format!("sent {more} more byte(s) after its one answer to execute"))),
                },
                Answer::Ok => Err(self.protocol_error(
                    "answered execute with success after its doorbell said it failed".to_owned(),
                )),
            },
            Rung::TimedOut => Err(self.failure("execute", io::ErrorKind::TimedOut.into(), deadline)),
            Rung::Died => Err(self.failure("execute", io::ErrorKind::UnexpectedEof.into(), deadline)),
        }
    }

    /// Reads the worker's one answer on the socket by `until` (the call's `deadline` is named if it passes).
    /// A worker that misses it, goes away or sends a malformed answer is stopped, and that is the error.
    fn read_answer(
        &mut self,
        stage: &str,
        until: Instant,
        deadline: Duration,
    ) -> Result<Answer, DelegateError> {
        let Some(worker) = self.worker.as_mut() else {
            return Err(DelegateError::internal("no worker"));
        };
        let mut header = [0u8; 4];
        let read = read_until(&worker.socket, &mut header, until).and_then(|()| {
            let len = u32::from_le_bytes(header);
            if len == 0 || len > MAX_MESSAGE {
                return Err(io::Error::new(io::ErrorKind::InvalidData, format!("a {len}-byte answer")));
            }
            self.reply.resize(len as usize, 0);
            read_until(&worker.socket, &mut self.reply, until)
        });
        match read {
            Ok(()) => {}
            Err(err) if err.kind() == io::ErrorKind::InvalidData => {
                return Err(self.protocol_error(format!("announced {err} to {stage}")))
            }
            Err(err) => return Err(self.failure(stage, err, deadline)),
        }
        match parse_answer(&self.reply) {
            Some(answer) => Ok(answer),
            None => Err(self.protocol_error(format!("answered {stage} with a malformed message"))),
        }
    }

    /// How many bytes wait on the socket now (0 when none, or the worker has gone).
    fn pending(&self) -> usize {
        use rustix::net::{recv, RecvFlags};
        let Some(worker) = self.worker.as_ref() else { return 0 };
        let mut probe = [0u8; 64];
        recv(worker.socket.as_fd(), &mut probe, RecvFlags::PEEK | RecvFlags::DONTWAIT).map_or(0, |(n, _)| n)
    }

    /// Stops a worker that broke the protocol; the error for its call.
    fn protocol_error(&mut self, what: String) -> DelegateError {
        self.stop(STOP_GRACE);
        DelegateError::internal(format!(
            "plugin '{}' (isolated, {}): the worker {what}; it was stopped and the next call starts a new one",
            self.name(),
            self.plugin.library.display()
        ))
    }

    /// The error for a call whose worker failed to answer: it is killed if still running, and reaped.
    fn failure(&mut self, stage: &str, err: io::Error, deadline: Duration) -> DelegateError {
        let timed_out = matches!(err.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut);
        let status = self.stop(STOP_GRACE);
        let what = match (timed_out, status) {
            (true, _) => {
                format!("did not answer {stage} within its {} deadline and was killed", human(deadline))
            }
            (false, Some(status)) => format!("died during {stage}: {}", describe_exit(status)),
            (false, None) => format!("failed during {stage}: {err}"),
        };
        DelegateError::internal(format!(
            "plugin '{}' (isolated, {}): the worker {what}; the next call starts a new one",
            self.name(),
            self.plugin.library.display()
        ))
    }

    /// Stops the worker and reaps it: asking it to finish (it destroys its instance and exits) and closing its
    /// socket, then killing it if it has not exited within `grace`.
    fn stop(&mut self, grace: Duration) -> Option<ExitStatus> {
        let Worker { mut child, socket, bell } = self.worker.take()?;
        bell.finish();
        drop(socket);
        let give_up = Instant::now() + grace;
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) if Instant::now() < give_up => std::thread::sleep(Duration::from_millis(1)),
                _ => {
                    let _ = child.kill();
                    return child.wait().ok();
                }
            }
        }
    }
}

impl Drop for IsolatedCall {
    fn drop(&mut self) {
        // A worker going away with its program may take as long as a call to destroy its instance.
        self.stop(self.plugin.isolation.deadline);
    }
}

fn human(d: Duration) -> String {
    if d.as_secs_f64() >= 1.0 {
        format!("{} s", d.as_secs_f64())
    } else {
        format!("{} ms", d.as_millis())
    }
}

/// "killed by signal 6 (SIGABRT)", "exited with status 3".
fn describe_exit(status: ExitStatus) -> String {
    match (status.signal(), status.code()) {
        (Some(signal), _) => {
            let name = match signal {
                1 => "SIGHUP",
                2 => "SIGINT",
                4 => "SIGILL",
                5 => "SIGTRAP",
                6 => "SIGABRT",
                7 => "SIGBUS",
                8 => "SIGFPE",
                9 => "SIGKILL",
                11 => "SIGSEGV",
                13 => "SIGPIPE",
                15 => "SIGTERM",
                _ => "",
            };
            if name.is_empty() {
                format!("killed by signal {signal}")
            } else {
                format!("killed by signal {signal} ({name})")
            }
        }
        (None, Some(code)) => format!("exited with status {code}"),
        (None, None) => "ended".to_owned(),
    }
}

/// The error for a system call that failed while an isolated call was prepared.
fn io_internal(what: &str, err: io::Error) -> DelegateError {
    DelegateError::internal(format!("{what}: {err}"))
}

/// The blob in a memory file of its own (the one copy the worker gets), sealed once written.
fn sealed_blob(blob: &[u8]) -> Result<OwnedFd, DelegateError> {
    let flags = rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING;
    let blob_file = rustix::fs::memfd_create("kv-delegate-blob", flags)
        .map_err(|err| io_internal("cannot make the blob's memory file", err.into()))?;
    std::fs::File::from(blob_file.try_clone().map_err(|err| io_internal("dup", err))?)
        .write_all(blob)
        .map_err(|err| io_internal("cannot copy the blob for the worker", err))?;
    // Written once, here: from now on no one (the worker least) can change, shrink or grow it. `FUTURE_WRITE`
    // refuses every later `write` and writable shared mapping without `WRITE`'s wait for every page reference
    // to drop, which fails with EBUSY on the freshly written pages of a large blob.
    crate::buffer::seal(&blob_file, rustix::fs::SealFlags::FUTURE_WRITE)
        .map_err(|err| io_internal("cannot seal the blob's memory file", err.into()))?;
    Ok(blob_file)
}

/// Each argument located in `regions`: the regions the call uses (indices into `regions`, in the order the
/// arguments first use them), and each argument described against that order.
fn locate_args(args: &[TensorArg], regions: &[Region]) -> Result<(Vec<usize>, Vec<ArgDesc>), DelegateError> {
    let mut used: Vec<usize> = Vec::new();
    let mut descs = Vec::with_capacity(args.len());
    for (index, arg) in args.iter().enumerate() {
        let region = locate(index, arg, regions)?;
        let slot = match used.iter().position(|&r| r == region) {
            Some(slot) => slot,
            None => {
                used.push(region);
                used.len() - 1
            }
        };
        descs.push(ArgDesc {
            region: slot,
            offset: (arg.data as usize - regions[region].base) as u64,
            nbytes: arg.nbytes,
            dtype: arg.dtype.get(),
            flags: arg.flags,
            dims: arg.dims().to_vec(),
        });
    }
    Ok((used, descs))
}

/// The region holding all of argument `index`'s bytes, of its memory's kind (host or device; any other kind
/// cannot cross).
fn locate(index: usize, arg: &TensorArg, regions: &[Region]) -> Result<usize, DelegateError> {
    let device = match arg.memory() {
        MemoryKind::Host => false,
        MemoryKind::Device => true,
        other => {
            return Err(DelegateError::not_supported(format!(
                "argument {index} is {other} memory; an isolated plugin shares host and device memory only"
            )))
        }
    };
    let addr = arg.data as usize;
    let found = regions.iter().position(|r| {
        matches!(r.kind, RegionKind::Device(..)) == device
            && addr >= r.base
            && addr + arg.nbytes as usize <= r.base + r.len
    });
    found.ok_or_else(|| {
        DelegateError::internal(format!(
            "argument {index} is not in shared memory (the program was not loaded for isolation)"
        ))
    })
}

/// The `used` regions as the worker is told of them, and the host regions' memory files (copies of their
/// descriptors) that travel with init, in order.
fn describe_regions(
    used: &[usize],
    regions: &[Region],
) -> Result<(Vec<OwnedFd>, Vec<RegionDesc>), DelegateError> {
    let mut files = Vec::new();
    let mut region_descs = Vec::with_capacity(used.len());
    for &r in used {
        let region = &regions[r];
        let device = match &region.kind {
            RegionKind::Host(fd) => {
                files.push(fd.try_clone().map_err(|err| io_internal("dup", err))?);
                None
            }
            RegionKind::Device(ordinal, handle) => Some((*ordinal, handle.0.to_vec())),
        };
        region_descs.push(RegionDesc { len: region.len as u64, device });
    }
    Ok((files, region_descs))
}

#[cfg(test)]
mod tests {
    use delegate_abi::{DTypeCode, ErrorCode};

    use super::*;

    /// A host region at `base..base + len`; its memory file stands in (locating reads no bytes).
    fn host_region(base: usize, len: usize) -> Region {
        let file = rustix::fs::memfd_create("test-region", rustix::fs::MemfdFlags::CLOEXEC);
        Region { base, len, kind: RegionKind::Host(file.expect("a memory file")) }
    }

    /// An `f32` argument of `nbytes` at `addr` in `memory`.
    fn arg(memory: MemoryKind, addr: usize, nbytes: u64) -> TensorArg {
        let mut arg = TensorArg::describe(DTypeCode::F32, &[nbytes as i64 / 4], memory).expect("rank 1");
        arg.data = addr as *mut std::ffi::c_void;
        arg.nbytes = nbytes;
        arg
    }

    #[test]
    fn each_argument_is_placed_in_its_region_numbered_in_the_order_the_call_first_uses_them() {
        let regions = [host_region(0x1000, 0x100), host_region(0x4000, 0x100)];
        let args = [
            arg(MemoryKind::Host, 0x4010, 16),
            arg(MemoryKind::Host, 0x1000, 0x100),
            arg(MemoryKind::Host, 0x4080, 0x80),
        ];
        let (used, descs) = locate_args(&args, &regions).expect("located");
        assert_eq!(used, [1, 0]);
        let placed: Vec<_> = descs.iter().map(|d| (d.region, d.offset, d.nbytes)).collect();
        assert_eq!(placed, [(0, 0x10, 16), (1, 0, 0x100), (0, 0x80, 0x80)]);
        let (files, described) = describe_regions(&used, &regions).expect("described");
        assert_eq!(files.len(), 2, "each host region's memory file travels");
        assert!(described.iter().all(|r| r.len == 0x100 && r.device.is_none()), "{described:?}");
    }

    #[test]
    fn an_argument_that_cannot_reach_the_worker_is_refused_naming_it() {
        let regions = [host_region(0x1000, 0x100)];
        let err = locate(2, &arg(MemoryKind::Pinned, 0x1000, 16), &regions).expect_err("pinned");
        assert_eq!(err.code, ErrorCode::NotSupported);
        assert!(err.message.starts_with("argument 2 is pinned memory"), "{}", err.message);
        // Running one byte past its region's end, or device memory where only a host region is.
        for outside in [arg(MemoryKind::Host, 0x10f1, 16), arg(MemoryKind::Device, 0x1000, 16)] {
            let err = locate(3, &outside, &regions).expect_err("outside every region");
            assert_eq!(err.code, ErrorCode::Internal);
            assert!(err.message.starts_with("argument 3 is not in shared memory"), "{}", err.message);
        }
    }
}
