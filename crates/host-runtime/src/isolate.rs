//! Isolated plugins: a plugin library run in a worker process of its own, so that a native library that
//! aborts, crashes or hangs inside a call ends that call, not the host.
//!
//! # How a call crosses
//!
//! A program with an isolated call allocates its host memory as memory files (`memfd`, see
//! [`HostStorage::shared`](crate::buffer::HostStorage::shared)). At load, the host starts the worker (the
//! [`Isolation`]'s command; `delegate-host worker` for the CLI) with one end of a Unix socket as descriptor
//! [`WORKER_FD`], and sends it, once: the library's path, the blob (in a memory file of its own), the memory
//! files the call's arguments live in, and each argument as (file, offset, size, dtype, shape, flags). The
//! worker maps the same pages, loads the library (checked against its manifest), initialises the instance and
//! builds its argument list once. Each `execute` then rings a doorbell in one shared page ([`bell`]): a
//! counter each way, each side spinning briefly for the other before it sleeps on a futex. The arguments never
//! travel: the plugin reads and writes the caller's caches in place, so zero-copy aliasing still holds.
//!
//! # Failure
//!
//! A worker that dies (a signal, an exit) or does not answer within the per-call deadline (it is then
//! killed) fails that call as [`ErrorCode::Internal`], naming the signal,
//! the exit status or the deadline. The host carries on; the next call starts a fresh worker and initialises
//! it again from the same blob. The caches live in the host's memory, so they survive the worker; what the
//! plugin kept in its own instance (delegate-owned state) starts over.
//!
//! Device memory crosses as CUDA IPC handles ([`cuda_rt::IpcHandle`]): the worker opens each device
//! allocation once at init and hands the plugin its own stream, synchronised before it answers; the host
//! settles its stream before each call (an isolated call is not streamed). Pinned and managed memory do not
//! cross: a call with such an argument is refused at load, naming it.
//!
//! # What a worker is trusted with
//!
//! Nothing it says is taken on trust beyond what an in-process plugin's answer is at the ABI boundary. The
//! deadline covers the whole call, however the worker paces its bytes. A failure rings the doorbell first and
//! sends its message after, while the host reads it, so a message of any length up to [`MAX_ERROR_TEXT`]
//! arrives (a longer one is cut, saying so). Its code goes through the ABI boundary's rule
//! ([`RError::into_delegate`](delegate_abi::abi::RError::into_delegate)); a success where the doorbell said
//! "failed", bytes beyond a failure's one answer, or a malformed message stop the worker and fail the call as
//! `Internal`. The memory files it is sent are sealed at their size (the blob against writes too), so it
//! cannot cut pages from under the host's mappings; and it inherits no descriptor of the host's but the
//! socket (every other one the host makes is close-on-exec). It runs as the host's user: isolation contains
//! crashes, hangs and abuse of the protocol, it is no sandbox (ARCHITECTURE.md, "Failure model").
//!
//! This module's `unsafe` is the worker's mapping of the host's memory files and the argument list it
//! builds over them.
#![allow(unsafe_code)]

mod bell;

use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use delegate_abi::host::{ArgList, HostConfig, Instance};
use delegate_abi::{
    Compatibility, CudaStream, DTypeCode, DelegateError, ErrorCode, ExecStats, InitContext, MemoryKind,
    PluginInfo, TensorArg,
};
use serde::{Deserialize, Serialize};

use bell::{Bell, Rung, Woken};

/// The descriptor number of the socket in the worker process.
pub const WORKER_FD: i32 = 3;

/// How long one `execute` of an isolated plugin may take before its worker is killed, unless configured.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(10);

/// How long a worker may take to load its library and initialise, whatever the per-call deadline (building
/// an engine at init can take a while).
pub const MIN_INIT_DEADLINE: Duration = Duration::from_secs(60);

/// How long a failed or malformed worker gets to exit by itself before it is killed.
const STOP_GRACE: Duration = Duration::from_millis(200);

/// Most memory files one call's arguments may live in.
const MAX_REGIONS: usize = 64;

/// Largest message either side accepts (the init request: paths and argument descriptions; an answer).
const MAX_MESSAGE: u32 = 1 << 20;

/// Longest error message a worker sends: a longer one is cut here and says how many bytes were left out.
pub const MAX_ERROR_TEXT: usize = 512 * 1024;
const _: () =
    assert!(MAX_ERROR_TEXT + 64 <= MAX_MESSAGE as usize, "a cut message and its note fit a message");

/// How isolated plugins are run: the worker command, the per-call deadline, and which plugins.
#[derive(Debug, Clone)]
pub struct Isolation {
    program: PathBuf,
    args: Vec<OsString>,
    deadline: Duration,
    all: bool,
}

impl Isolation {
    /// Workers run `program args...`, which must serve the socket at [`WORKER_FD`] with [`serve`] (e.g.
    /// `delegate-host worker`). Plugins whose manifest asks for it (`"isolate": true`) are isolated; the
    /// deadline is [`DEFAULT_DEADLINE`].
    pub fn new(
        program: impl Into<PathBuf>,
        args: impl IntoIterator<Item = impl Into<OsString>>,
    ) -> Isolation {
        Isolation {
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
            deadline: DEFAULT_DEADLINE,
            all: false,
        }
    }

    /// Isolates every plugin loaded from a library, not only those whose manifest asks for it.
    pub fn all(mut self, all: bool) -> Isolation {
        self.all = all;
        self
    }

    /// The per-call deadline: the whole of each `execute`, from its ring to its answer (a failure's message
    /// included), however the worker paces its bytes.
    pub fn deadline(mut self, deadline: Duration) -> Isolation {
        self.deadline = deadline;
        self
    }

    /// Whether a plugin with this manifest flag runs isolated.
    pub(crate) fn applies(&self, manifest_asks: bool) -> bool {
        self.all || manifest_asks
    }
}

/// A plugin library that runs in worker processes: what the host knows of it without loading it.
#[derive(Debug, Clone)]
pub struct IsolatedPlugin {
    /// The library file.
    pub library: PathBuf,
    /// What its manifest says it is.
    pub info: PluginInfo,
    pub(crate) isolation: Arc<Isolation>,
}

/// One argument as the worker rebuilds it: where its bytes are in the shared memory files, and its metadata.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ArgDesc {
    region: usize,
    offset: u64,
    nbytes: u64,
    dtype: u8,
    flags: u32,
    dims: Vec<i64>,
}

/// Where one region of a call's memory is: a host memory file (travelling with the message, in order) or a
/// device allocation's CUDA IPC handle.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct RegionDesc {
    len: u64,
    /// `(device ordinal, IPC handle)` for device memory; `None` for a host memory file.
    device: Option<(i32, Vec<u8>)>,
}

/// The version of the host-worker protocol. A worker is normally the host's own binary, but a library user
/// may name another program: one built from another version says so instead of misreading the message.
/// 2: `execute` rings the doorbell ([`bell`]), whose memory file travels last with init.
const PROTOCOL: u32 = 2;

/// The first message to a worker; the blob's and the host regions' memory files travel with it.
#[derive(Debug, Serialize, Deserialize)]
struct InitRequest {
    /// [`PROTOCOL`]; absent (0) from hosts before the doorbell.
    #[serde(default)]
    protocol: u32,
    library: PathBuf,
    blob_len: u64,
    regions: Vec<RegionDesc>,
    args: Vec<ArgDesc>,
}

const REPLY_OK: u8 = 0;
const REPLY_ERR: u8 = 1;

/// A storage an argument may live in, as a worker reaches it: its address range here, and how.
pub(crate) struct Region {
    pub(crate) base: usize,
    pub(crate) len: usize,
    pub(crate) kind: RegionKind,
}

/// How a worker reaches a region.
pub(crate) enum RegionKind {
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
    blob: OwnedFd,
    blob_len: u64,
    /// The host regions' memory files, in the order of `regions`' host entries.
    files: Vec<OwnedFd>,
    regions: Vec<RegionDesc>,
    args: Vec<ArgDesc>,
    worker: Option<Worker>,
    reply: Vec<u8>,
}

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
        let internal = |what: &str, err: io::Error| DelegateError::internal(format!("{what}: {err}"));
        let flags = rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING;
        let blob_file = rustix::fs::memfd_create("kv-delegate-blob", flags)
            .map_err(|err| internal("cannot make the blob's memory file", err.into()))?;
        std::fs::File::from(blob_file.try_clone().map_err(|err| internal("dup", err))?)
            .write_all(blob)
            .map_err(|err| internal("cannot copy the blob for the worker", err))?;
        // Written once, here: from now on no one (the worker least) can change, shrink or grow it.
        crate::buffer::seal(&blob_file, rustix::fs::SealFlags::WRITE)
            .map_err(|err| internal("cannot seal the blob's memory file", err.into()))?;
        let mut used: Vec<usize> = Vec::new();
        let mut descs = Vec::with_capacity(args.len());
        for (index, arg) in args.as_slice().iter().enumerate() {
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
            let Some(region) = found else {
                return Err(DelegateError::internal(format!(
                    "argument {index} is not in shared memory (the program was not loaded for isolation)"
                )));
            };
            let slot = match used.iter().position(|&r| r == region) {
                Some(slot) => slot,
                None => {
                    used.push(region);
                    used.len() - 1
                }
            };
            descs.push(ArgDesc {
                region: slot,
                offset: (addr - regions[region].base) as u64,
                nbytes: arg.nbytes,
                dtype: arg.dtype.get(),
                flags: arg.flags,
                dims: arg.dims().to_vec(),
            });
        }
        if used.len() > MAX_REGIONS {
            return Err(DelegateError::not_supported(format!(
                "the call's arguments live in {} buffers; an isolated call takes at most {MAX_REGIONS}",
                used.len()
            )));
        }
        let mut files = Vec::new();
        let mut region_descs = Vec::with_capacity(used.len());
        for &r in &used {
            let region = &regions[r];
            let device = match &region.kind {
                RegionKind::Host(fd) => {
                    files.push(fd.try_clone().map_err(|err| internal("dup", err))?);
                    None
                }
                RegionKind::Device(ordinal, handle) => Some((*ordinal, handle.0.to_vec())),
            };
            region_descs.push(RegionDesc { len: region.len as u64, device });
        }
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

/// A worker's answer on the socket, as the host reads it.
#[derive(Debug)]
enum Answer {
    /// Success: init's only answer on the socket (an `execute` succeeds on the doorbell).
    Ok,
    /// Failure, with its code passed through the ABI boundary's rule.
    Err(DelegateError),
}

/// Decodes one answer: `REPLY_OK` and two `u64` counters (unused: an `execute`'s travel on the doorbell), or
/// `REPLY_ERR`, a `u32` code and the message; `None` for anything else. The code is checked exactly as the ABI
/// boundary checks a plugin's
/// ([`RError::into_delegate`](delegate_abi::abi::RError::into_delegate)): one that is no error's code
/// (`Ok`) becomes `Internal`, and the message says what the worker sent.
fn parse_answer(reply: &[u8]) -> Option<Answer> {
    match reply.split_first()? {
        (&REPLY_OK, rest) => (rest.len() == 16).then_some(Answer::Ok),
        (&REPLY_ERR, rest) => {
            let (code, text) = rest.split_at_checked(4)?;
            let sent = ErrorCode::from_u32(u32::from_le_bytes(code.try_into().ok()?));
            let message = String::from_utf8_lossy(text).into_owned();
            let err =
                delegate_abi::abi::RError { code: sent.as_u32(), message: message.into() }.into_delegate();
            Some(Answer::Err(if err.code == sent {
                err
            } else {
                let message = format!("{} (the worker sent this error with code {sent})", err.message);
                DelegateError::new(err.code, message)
            }))
        }
        _ => None,
    }
}

/// Fills `buf` from the (non-blocking) socket by `until`: `TimedOut` once it has passed, `UnexpectedEof`
/// when the worker has gone. Each wait is for what is left of the time, so a worker that sends a byte at a
/// time gains none.
fn read_until(socket: &UnixStream, buf: &mut [u8], until: Instant) -> io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        match (&*socket).read(&mut buf[filled..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => filled += n,
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                wait_for(socket.as_fd(), rustix::event::PollFlags::IN, Some(until))?
            }
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
    Ok(())
}

/// Waits until `socket` is ready for `flags`, or `TimedOut` once `until` has passed (`None`: no limit).
fn wait_for(
    socket: BorrowedFd<'_>,
    flags: rustix::event::PollFlags,
    until: Option<Instant>,
) -> io::Result<()> {
    use rustix::event::{poll, PollFd, Timespec};
    let timeout = match until {
        None => None,
        Some(until) => {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::ErrorKind::TimedOut.into());
            }
            Some(Timespec {
                tv_sec: i64::try_from(left.as_secs()).unwrap_or(i64::MAX),
                tv_nsec: i64::from(left.subsec_nanos()),
            })
        }
    };
    let mut fds = [PollFd::new(&socket, flags)];
    match poll(&mut fds, timeout.as_ref()) {
        Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
        Err(err) => Err(err.into()),
    }
}

/// Writes all of `bytes` by `until` (`None`: a blocking socket, the worker's); a closed peer is an error,
/// never `SIGPIPE`.
fn send_all(socket: BorrowedFd<'_>, mut bytes: &[u8], until: Option<Instant>) -> io::Result<()> {
    while !bytes.is_empty() {
        match rustix::net::send(socket, bytes, rustix::net::SendFlags::NOSIGNAL) {
            Ok(sent) => bytes = &bytes[sent..],
            Err(rustix::io::Errno::AGAIN) => wait_for(socket, rustix::event::PollFlags::OUT, until)?,
            Err(rustix::io::Errno::INTR) => {}
            Err(err) => return Err(err.into()),
        }
    }
    Ok(())
}

/// One length-prefixed message, with `fds` attached to its first byte, sent by `until` (as [`send_all`]).
fn send_frame(
    socket: BorrowedFd<'_>,
    payload: &[u8],
    fds: &[BorrowedFd<'_>],
    until: Option<Instant>,
) -> io::Result<()> {
    use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|&len| len <= MAX_MESSAGE)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "message too large"))?;
    let header = len.to_le_bytes();
    let mut space = vec![std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_REGIONS + 1))];
    let mut ancillary = SendAncillaryBuffer::new(&mut space);
    if !ancillary.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "too many descriptors"));
    }
    let sent = loop {
        match sendmsg(socket, &[io::IoSlice::new(&header)], &mut ancillary, SendFlags::NOSIGNAL) {
            Ok(sent) => break sent,
            Err(rustix::io::Errno::AGAIN) => wait_for(socket, rustix::event::PollFlags::OUT, until)?,
            Err(rustix::io::Errno::INTR) => {}
            Err(err) => return Err(err.into()),
        }
    };
    send_all(socket, &header[sent..], until)?;
    send_all(socket, payload, until)
}

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
    let mapped = match Mapped::new(&request, fds) {
        Ok(mapped) => mapped,
        Err(err) => return delivered(reply(&mut stream, &mut answer, Err(err))),
    };
    let started = init(&request, &mapped);
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
        let result = match &mapped.stream {
            None => instance.execute(&mut args, None),
            Some(stream) => {
                // SAFETY: a stream this worker made in the context of the device memory it opened, alive
                // until `mapped` is dropped after the instance; the results are complete when the
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

fn build_reply(message: &mut Vec<u8>, result: &Result<ExecStats, DelegateError>) -> io::Result<()> {
    message.clear();
    message.extend_from_slice(&[0; 4]);
    match result {
        Ok(stats) => {
            message.push(REPLY_OK);
            message.extend_from_slice(&stats.reflect_bytes.to_le_bytes());
            message.extend_from_slice(&stats.staged_bytes.to_le_bytes());
        }
        Err(err) => {
            message.push(REPLY_ERR);
            message.extend_from_slice(&err.code.as_u32().to_le_bytes());
            let text = err.message.as_str();
            let mut end = MAX_ERROR_TEXT.min(text.len());
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            message.extend_from_slice(&text.as_bytes()[..end]);
            if end < text.len() {
                message.extend_from_slice(format!("... [truncated {} bytes]", text.len() - end).as_bytes());
            }
        }
    }
    let len = (message.len() - 4) as u32;
    message[..4].copy_from_slice(&len.to_le_bytes());
    Ok(())
}

/// Reads one length-prefixed message and the descriptors attached to it.
fn recv_frame(socket: BorrowedFd<'_>) -> io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    use rustix::net::{recvmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut header = [0u8; 4];
    let mut space = vec![std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_REGIONS + 1))];
    let mut ancillary = RecvAncillaryBuffer::new(&mut space);
    let got =
        recvmsg(socket, &mut [io::IoSliceMut::new(&mut header)], &mut ancillary, RecvFlags::CMSG_CLOEXEC)?;
    let mut fds = Vec::new();
    for message in ancillary.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = message {
            fds.extend(received);
        }
    }
    let mut stream = UnixStream::from(socket.try_clone_to_owned()?);
    if got.bytes == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    stream.read_exact(&mut header[got.bytes..])?;
    let len = u32::from_le_bytes(header);
    if len > MAX_MESSAGE {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("a {len}-byte message")));
    }
    let mut payload = vec![0u8; len as usize];
    stream.read_exact(&mut payload)?;
    Ok((payload, fds))
}

/// The host's memory, reachable from the worker: the blob mapped read-only, host regions mapped read-write,
/// device regions opened with CUDA IPC (and a stream for the plugin when there are any).
struct Mapped {
    blob: Mapping,
    regions: Vec<Reached>,
    stream: Option<cuda_rt::Stream>,
}

enum Reached {
    Host(Mapping),
    Device(cuda_rt::IpcMapping),
}

struct Mapping {
    ptr: *mut std::ffi::c_void,
    len: usize,
}

impl Mapping {
    fn new(fd: BorrowedFd<'_>, len: u64, writable: bool) -> Result<Mapping, DelegateError> {
        use rustix::mm::{mmap, MapFlags, ProtFlags};
        let len = usize::try_from(len).map_err(|_| DelegateError::internal("a region larger than memory"))?;
        let size = len.max(1);
        let prot = if writable { ProtFlags::READ | ProtFlags::WRITE } else { ProtFlags::READ };
        let actual = rustix::fs::fstat(fd).map_err(|err| DelegateError::internal(format!("fstat: {err}")))?;
        if (actual.st_size as u64) < len as u64 {
            return Err(DelegateError::internal(format!(
                "a memory file of {} bytes cannot hold {len}",
                actual.st_size
            )));
        }
        // SAFETY: a fresh mapping (null hint) of `size` bytes of a file at least `len` bytes long (checked
        // above; a zero-length region maps one page of a file the host sized to one byte or more), unmapped
        // once, in `Drop`. The host sealed every file it sends against shrinking before sending it (see
        // `crate::buffer::seal`), so no process, this one included, can take mapped pages away (`SIGBUS`).
        let ptr =
            unsafe { mmap(std::ptr::null_mut(), size, prot, MapFlags::SHARED, fd, 0) }.map_err(|err| {
                DelegateError::new(ErrorCode::MemoryAllocationFailed, format!("mapping {len} bytes: {err}"))
            })?;
        Ok(Mapping { ptr, len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once; every borrow of it (the blob slice given to `init`,
        // the argument list) is gone: `serve` drops them first.
        let _ = unsafe { rustix::mm::munmap(self.ptr, self.len.max(1)) };
    }
}

impl Mapped {
    fn new(request: &InitRequest, fds: Vec<OwnedFd>) -> Result<Mapped, DelegateError> {
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
        Ok(Mapped { blob, regions, stream })
    }

    fn blob(&self) -> &[u8] {
        // SAFETY: a read-only mapping of `len` readable bytes, alive as long as `self`. The host wrote the blob
        // before sending the file and sealed it against writes, shrinking and growing: its bytes cannot change
        // while they are borrowed.
        unsafe { std::slice::from_raw_parts(self.blob.ptr.cast::<u8>(), self.blob.len) }
    }
}

/// Loads the library (checked against its manifest), asks it about the blob, initialises the instance and
/// builds the argument list over the mapped regions.
fn init(request: &InitRequest, mapped: &Mapped) -> Result<(Instance, ArgList<'static>), DelegateError> {
    let manifest_path = crate::plugin_manifest::PluginManifest::path_for(&request.library);
    let manifest = crate::plugin_manifest::PluginManifest::read(&manifest_path)
        .map_err(|err| DelegateError::invalid_program(format!("{}: {err}", manifest_path.display())))?;
    let plugin = crate::plugins::load_checked(&request.library, Some(&manifest), &HostConfig::new())
        .map_err(|reason| {
            DelegateError::invalid_program(format!("{}: {reason}", request.library.display()))
        })?;
    let blob = mapped.blob();
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
        let region = mapped.regions.get(desc.region).ok_or_else(|| bad("no such memory region".into()))?;
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

    fn failure(message: &str) -> Vec<u8> {
        let mut reply = Vec::new();
        build_reply(&mut reply, &Err(DelegateError::invalid_argument(message))).expect("built");
        reply
    }

    #[test]
    fn an_error_message_past_the_cap_is_cut_at_a_character_and_says_how_much_was_left_out() {
        let whole = "é".repeat(MAX_ERROR_TEXT / 2);
        let reply = failure(&whole);
        let Some(Answer::Err(err)) = parse_answer(&reply[4..]) else { panic!("not a failure") };
        assert_eq!(err.message, whole, "a message at the cap arrives whole");
        let longer = format!("a{whole}");
        let reply = failure(&longer);
        let Some(Answer::Err(err)) = parse_answer(&reply[4..]) else { panic!("not a failure") };
        // The cap falls inside the last `é`: cut before it.
        assert_eq!(err.message, format!("a{}... [truncated 2 bytes]", "é".repeat(MAX_ERROR_TEXT / 2 - 1)));
        assert_eq!(err.code, ErrorCode::InvalidArgument);
        assert_eq!(u32::from_le_bytes(reply[..4].try_into().expect("4 bytes")) as usize, reply.len() - 4);
    }

    #[test]
    fn a_worker_s_answer_is_checked_as_the_abi_boundary_checks_a_plugin_s() {
        let coded = |code: u32, text: &str| {
            let mut reply = vec![REPLY_ERR];
            reply.extend_from_slice(&code.to_le_bytes());
            reply.extend_from_slice(text.as_bytes());
            match parse_answer(&reply) {
                Some(Answer::Err(err)) => err,
                other => panic!("{other:?}"),
            }
        };
        let err = coded(0, "says Ok");
        assert_eq!(err.code, ErrorCode::Internal);
        assert_eq!(err.message, "says Ok (the worker sent this error with code Ok (0x00))");
        let err = coded(ErrorCode::NotFound.as_u32(), "gone");
        assert_eq!((err.code, err.message.as_str()), (ErrorCode::NotFound, "gone"));
        // A code this build does not know crosses as the ABI boundary lets it: `Unknown`, with its value.
        assert_eq!(coded(0x77, "?").code, ErrorCode::Unknown(0x77));
        assert!(matches!(parse_answer(&[REPLY_OK; 17]), Some(Answer::Ok)));
        for malformed in [&[][..], &[REPLY_OK; 5], &[REPLY_ERR, 1, 0], &[7, 0, 0, 0, 0]] {
            assert!(parse_answer(malformed).is_none(), "{malformed:?}");
        }
    }

    #[test]
    fn a_read_ends_at_its_deadline_however_the_bytes_trickle_in() {
        let (host, worker) = UnixStream::pair().expect("a socket pair");
        host.set_nonblocking(true).expect("non-blocking");
        let trickle = std::thread::spawn(move || {
            let mut worker = worker;
            // A byte every 20 ms for about 2 s, much longer than the read may take.
            for _ in 0..100 {
                if worker.write_all(b"x").is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let start = Instant::now();
        let mut buf = [0u8; 1000];
        let err = read_until(&host, &mut buf, start + Duration::from_millis(200)).expect_err("a trickle");
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(start.elapsed() < Duration::from_millis(1000), "{:?}", start.elapsed());
        drop(host);
        trickle.join().expect("the trickling thread");
    }

    #[test]
    fn a_worker_sees_its_host_gone_when_the_host_end_of_the_socket_closes() {
        let (host, worker) = UnixStream::pair().expect("a socket pair");
        assert!(!host_gone(worker.as_fd()), "a host that is there read as gone");
        drop(host);
        assert!(host_gone(worker.as_fd()), "a closed host end read as still there");
    }
}
