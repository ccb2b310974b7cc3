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
//! builds its argument list once. Each `execute` then rings a doorbell in one shared page (`bell`): a
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
//! # Modules
//!
//! - `host`: the host side. `IsolatedCall` locates a call's arguments in the
//!   program's shared memory, starts and initialises a worker, rings it for each `execute`, and stops it
//!   (killing it past its deadline), describing how it ended.
//! - `worker`: the worker side. [`serve`] maps what the host sent, loads the plugin through the library floor
//!   below (`plugins::library`: checked against its manifest, never through the registry above), initialises
//!   it, answers each ring, and ends itself when its host goes away.
//! - `wire`: what crosses the socket and how: the init request, an answer's encoding and its check,
//!   length-prefixed frames with descriptors, reads and writes bounded by a deadline.
//! - `bell`: the doorbell page each `execute` rings.
//! - `mapping`: one shared mapping of a memory file, as the worker and both ends of the doorbell hold it.
//!
//! Their `unsafe` is the worker's mappings of the host's memory files (`mapping`), the argument list it
//! builds over them and the descriptor it inherits (`worker`), and the doorbell's shared page, reached only
//! through atomics (`bell`); `host` and `wire` have none.

mod bell;
mod host;
mod mapping;
mod wire;
mod worker;

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[cfg(doc)]
use delegate_abi::ErrorCode;
use delegate_abi::PluginInfo;

pub(crate) use host::{IsolatedCall, Region};
pub use wire::MAX_ERROR_TEXT;
pub use worker::{serve, serve_inherited, WorkerError};

/// The descriptor number of the socket in the worker process.
pub const WORKER_FD: i32 = 3;

/// How long one `execute` of an isolated plugin may take before its worker is killed, unless configured.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(10);

/// How long a worker may take to load its library and initialise, whatever the per-call deadline (building
/// an engine at init can take a while).
pub const MIN_INIT_DEADLINE: Duration = Duration::from_secs(60);

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
    /// The plugin's shared library: its path is sent to each worker, which loads it (checked against its
    /// manifest); the host never does.
    pub library: PathBuf,
    /// What its manifest says it is.
    pub info: PluginInfo,
    pub(crate) isolation: Arc<Isolation>,
}

impl IsolatedPlugin {
    /// The plugin library at `library`, described by its manifest as `info`, run as `isolation` says.
    pub(crate) fn new(library: PathBuf, info: PluginInfo, isolation: Arc<Isolation>) -> IsolatedPlugin {
        IsolatedPlugin { library, info, isolation }
    }

    /// What its manifest says it is.
    pub fn info(&self) -> &PluginInfo {
        &self.info
    }
}
