//! Plugin discovery: every candidate library in the search path, which one serves each backend and why, and
//! why the others do not.
//!
//! # Embedding
//!
//! This library links no plugin. [`Registry::discover`] takes a [`Discovery`] (directories, the environment,
//! probing, isolation) and finds plugin *libraries*; an application that ships plugins inside its own binary
//! registers each with [`Registry::with_embedded`], from the `delegate_root()` of the plugin's library crate:
//!
//! ```
//! use delegate_abi::host::HostConfig;
//! use host_runtime::plugins::{Discovery, Registry};
//!
//! let plugin_dirs = [std::path::PathBuf::from("/opt/plugins")];
//! let registry = Registry::discover(Discovery::new().dirs(&plugin_dirs).use_env(true))
//!     .with_embedded(reference_delegate::delegate_root(), &HostConfig::default());
//! assert!(registry.served("ReferenceBackend").is_some());
//! ```
//!
//! `delegate-host` and `et-run` embed the reference and CUDA delegates this way; `examples/embed.rs` is a
//! whole application with the reference delegate alone.
//!
//! # Search order
//!
//! 1. the directories given explicitly ([`Discovery::dirs`], `--plugin-dir`), in order;
//! 2. the directories in `DELEGATE_PLUGIN_PATH` ([`Discovery::use_env`]; separated like `PATH`: `:` on Unix,
//!    `;` on Windows), in order;
//! 3. the plugins the application embeds with [`Registry::with_embedded`], in the order it adds them, last.
//!
//! In each directory, files with the platform's library extension (`.so`, `.dylib`, `.dll`) are candidates,
//! in file-name order. A file reached twice (a directory listed twice, a symlink) is considered once. A
//! missing or unreadable explicit directory is listed as rejected; a missing `DELEGATE_PLUGIN_PATH` entry is
//! skipped.
//!
//! # Verify first, then load
//!
//! A library's constructors run the moment the dynamic loader opens it, so no library is opened before it is
//! known to be what its [manifest](crate::plugin_manifest) says. [`Registry::discover`] (by default, and what
//! `delegate-host` uses) reads each library's manifest and hashes the library's bytes; it runs no library
//! code. A library whose SHA-256 differs from its manifest's is `rejected: sha256 ...` (naming the command that
//! writes the manifest again); one without a manifest is `not loaded: no manifest` and serves nothing. A
//! verified library is `listed` and loaded only when a program asks for a backend it serves
//! ([`Registry::served`]): its bytes are read once, hashed again, and exactly those bytes are loaded (see
//! `verify`), then its self-description is compared with the manifest.
//!
//! Probing ([`Discovery::probe`]) is the explicitly named exception: it loads every library now (those with a
//! manifest still verified first), for callers that trust their directories and for `delegate-host --probe`.
//! Even a probe leaves a library whose manifest asks for isolation unloaded.
//!
//! # Which plugin serves a backend
//!
//! Plugins are keyed by (backend id, plugin version). For each backend id the verified candidates (loaded,
//! or listed with a matching hash) are ranked: **highest version** first (semver order), among equal versions
//! the **first found** in search order. The first that can serve, serves; one that fails when it is loaded
//! (it cannot be opened, its self-description differs from its manifest or panics, it says it cannot run
//! here, or it must run isolated in a host that runs no workers) is passed over with one log line, and the
//! next serves. A plugin that serves none of its backends is listed as `shadowed by <path>`.
//! [`Registry::why_serves`] says which candidate serves a backend and why. So a newer reference plugin
//! dropped in `--plugin-dir` replaces an embedded one, a copy of the same version there is preferred to the
//! embedded one, and a stray or tampered one changes nothing.
//!
//! # Isolation
//!
//! [`Registry::served`] is the one place that decides whether a plugin runs in this process or in a worker
//! ([`Discovery::isolation`]); every path that runs a program asks it. A plugin whose manifest asks for
//! isolation is never loaded into this process, not even by a probe.
//!
//! # Libraries are never unloaded
//!
//! Every library opened here, including rejected plugins whose handshake failed, stays loaded until the
//! process exits: unloading Rust code that may have registered thread-local destructors is unsound, and the
//! plugin's tables and strings are `'static` borrows (see [`delegate_abi::host`]). Only the dynamic loader's
//! failure to open a file leaves nothing behind.
//!
//! # Floors
//!
//! The code is layered, each floor using only those below it:
//! 1. `library`: the manifest ([`crate::plugin_manifest`]), verifying a library's bytes, loading it checked;
//! 2. `isolate`: a plugin run in a worker process, which loads it through the library floor (Linux; elsewhere
//!    its types are uninhabited);
//! 3. `registry`: [`Discovery`], [`Registry`] and [`Served`], which decide where each backend's plugin runs.

#[cfg(target_os = "linux")]
pub mod isolate;
#[cfg(not(target_os = "linux"))]
#[path = "plugins/isolate_off.rs"]
pub(crate) mod isolate;
pub(crate) mod library;
mod registry;

pub use isolate::IsolatedPlugin;
pub use library::describe_library;
pub use registry::{search_path, Candidate, Discovery, Registry, Served, Status, PLUGIN_PATH_ENV};
