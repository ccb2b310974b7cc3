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

use std::collections::{BTreeMap, HashSet};
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;

use delegate_abi::abi::DelegateRootRef;
use delegate_abi::host::{HostConfig, Plugin};

mod candidate;
mod serve;
#[cfg(test)]
mod tests;
pub(crate) mod verify;

pub(crate) use candidate::load_checked;
pub use candidate::{describe_library, Candidate, Status};
use candidate::{from_manifest, is_library, manifest_of};
pub use serve::Served;

/// Environment variable with extra plugin directories.
pub const PLUGIN_PATH_ENV: &str = "DELEGATE_PLUGIN_PATH";

/// How [`Registry::discover`] looks for plugins: which directories, whether `DELEGATE_PLUGIN_PATH` too,
/// whether every library is loaded now (a probe) and how isolated plugins run. `Discovery::new()` searches
/// nothing, lists from manifests, and runs every plugin in this process.
///
/// ```
/// use host_runtime::plugins::{Discovery, Registry};
///
/// let registry = Registry::discover(Discovery::new().dirs(["/opt/plugins"]).use_env(true));
/// assert!(registry.served("NoSuchBackend").is_none());
/// ```
#[derive(Debug, Clone, Default)]
pub struct Discovery {
    dirs: Vec<PathBuf>,
    env: Env,
    probe: bool,
    config: HostConfig,
    #[cfg(target_os = "linux")]
    isolation: Option<crate::isolate::Isolation>,
}

/// Where the `DELEGATE_PLUGIN_PATH` value searched after the explicit directories comes from.
#[derive(Debug, Clone, Default)]
enum Env {
    /// Not searched.
    #[default]
    Ignored,
    /// This process's variable, read when discovering.
    Process,
    /// A value given by the caller.
    Value(OsString),
}

impl Discovery {
    /// No directories, no environment, manifests only, no isolation, the default host configuration.
    pub fn new() -> Discovery {
        Discovery::default()
    }

    /// Searches `dirs` first, in order (`--plugin-dir`); a missing or unreadable one is listed as rejected.
    pub fn dirs<I, P>(mut self, dirs: I) -> Discovery
    where
        I: IntoIterator<Item = P>,
        P: Into<PathBuf>,
    {
        self.dirs = dirs.into_iter().map(Into::into).collect();
        self
    }

    /// Whether the directories in this process's `DELEGATE_PLUGIN_PATH` are searched after [`Discovery::dirs`].
    pub fn use_env(mut self, use_env: bool) -> Discovery {
        self.env = if use_env { Env::Process } else { Env::Ignored };
        self
    }

    /// Searches `value`, split like `PATH`, where `DELEGATE_PLUGIN_PATH` would be (the environment itself is
    /// not read).
    pub fn env_value(mut self, value: impl Into<OsString>) -> Discovery {
        self.env = Env::Value(value.into());
        self
    }

    /// Whether every library is loaded now (`delegate-host --probe`) instead of listed from its manifest:
    /// for directories the caller trusts, and for libraries without a manifest. A library with a manifest is
    /// still verified before it is loaded, one whose manifest asks for isolation is only listed, and any
    /// library that crashes when opened takes this process with it.
    pub fn probe(mut self, probe: bool) -> Discovery {
        self.probe = probe;
        self
    }

    /// The host configuration libraries are loaded with (its ABI range), now or on first use.
    pub fn config(mut self, config: HostConfig) -> Discovery {
        self.config = config;
        self
    }

    /// Runs plugins in worker processes as `isolation` says: every library-loaded plugin
    /// ([`Isolation::all`](crate::isolate::Isolation::all)) or those whose manifest asks for it. Only plugins
    /// known from a manifest and not loaded yet can be isolated; embedded plugins always run here, and a
    /// library a probe loaded into this process is refused when `all` asks to isolate it. Without it, a
    /// plugin whose manifest asks for isolation serves nothing, and says why.
    #[cfg(target_os = "linux")]
    pub fn isolation(mut self, isolation: crate::isolate::Isolation) -> Discovery {
        self.isolation = Some(isolation);
        self
    }

    /// The value searched after the explicit directories, if any.
    fn env_path(&self) -> Option<OsString> {
        match &self.env {
            Env::Ignored => None,
            Env::Process => std::env::var_os(PLUGIN_PATH_ENV),
            Env::Value(value) => Some(value.clone()),
        }
    }
}

/// Every candidate found, and which plugins may serve each backend id, best first.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    candidates: Vec<Candidate>,
    /// Per backend, the verified candidates offering it, in preference order (highest version, then first
    /// found).
    serving: BTreeMap<String, Vec<usize>>,
    /// How listed candidates are loaded when asked for.
    config: HostConfig,
    /// How plugins run in worker processes; `None`: every plugin runs in this process.
    #[cfg(target_os = "linux")]
    isolation: Option<Arc<crate::isolate::Isolation>>,
}

/// The directories searched, in order: `dirs`, then `env_value` split like `PATH` (empty entries dropped);
/// `true` marks an explicit one.
pub fn search_path(dirs: &[PathBuf], env_value: Option<&OsString>) -> Vec<(PathBuf, bool)> {
    let mut out: Vec<(PathBuf, bool)> = dirs.iter().map(|d| (d.clone(), true)).collect();
    if let Some(value) = env_value {
        out.extend(std::env::split_paths(value).filter(|p| !p.as_os_str().is_empty()).map(|p| (p, false)));
    }
    out
}

impl Registry {
    /// Discovers the plugin libraries `options` names: its directories, then (if asked) those in
    /// `DELEGATE_PLUGIN_PATH`. By default **no library's code runs**: each library is listed from its
    /// manifest and its bytes checked against the manifest's SHA-256; it is loaded only when
    /// [`Registry::served`] asks for a backend it serves. [`Discovery::probe`] loads every library now instead.
    /// Never fails: problems are listed per candidate. Embedded plugins are added with
    /// [`Registry::with_embedded`].
    pub fn discover(options: Discovery) -> Registry {
        let env_value = options.env_path();
        let mut candidates = Vec::new();
        let mut seen = HashSet::new();
        for (dir, explicit) in search_path(&options.dirs, env_value.as_ref()) {
            let mut files = match std::fs::read_dir(&dir) {
                Ok(entries) => entries
                    .filter_map(Result::ok)
                    .map(|e| e.path())
                    .filter(|p| is_library(p))
                    .collect::<Vec<_>>(),
                Err(err) if explicit => {
                    candidates
                        .push(Candidate::rejected(Some(dir), format!("cannot read plugin directory: {err}")));
                    continue;
                }
                Err(err) => {
                    tracing::debug!(dir = %dir.display(), "skipping {PLUGIN_PATH_ENV} entry: {err}");
                    continue;
                }
            };
            files.sort();
            for path in files {
                let key = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
                if seen.insert(key) {
                    candidates.push(Registry::consider(path, &options.config, options.probe));
                }
            }
        }
        #[cfg_attr(not(target_os = "linux"), allow(unused_mut))]
        let mut registry = Registry::from_candidates(candidates, options.config);
        #[cfg(target_os = "linux")]
        {
            registry.isolation = options.isolation.map(Arc::new);
        }
        registry
    }

    /// One file named like a library.
    fn consider(path: PathBuf, config: &HostConfig, probe: bool) -> Candidate {
        // Named like a library but not one: listed with the reason, never opened (a FIFO would block the
        // loader).
        let not_a_file = match std::fs::metadata(&path) {
            Ok(metadata) if metadata.is_file() => None,
            Ok(metadata) => Some(format!(
                "not a regular file (it is {})",
                crate::blob_file::file_kind(&metadata.file_type())
            )),
            Err(err) => Some(format!("cannot read it: {err} (a dangling symbolic link?)")),
        };
        if let Some(reason) = not_a_file {
            return Candidate::rejected(Some(path), reason);
        }
        let manifest = match manifest_of(&path) {
            Ok(manifest) => manifest,
            Err(reason) => return Candidate::rejected(Some(path), reason),
        };
        match (probe, manifest) {
            // Isolation is the manifest's promise that this process never runs the library: not even a probe
            // loads it.
            (true, Some(manifest)) if !manifest.isolate => Candidate::load(path, Some(manifest), config),
            (true, None) => Candidate::load(path, None, config),
            (_, Some(manifest)) => from_manifest(path, manifest, config),
            (false, None) => Candidate::no_manifest(path),
        }
    }

    /// Adds a plugin linked into this binary, from the `delegate_root()` of its library crate (e.g.
    /// `reference_delegate::delegate_root()`), as the last candidate, under the same duplicate rule as
    /// libraries (the serving order is decided again over every candidate). This is how an application ships
    /// plugins inside its own binary: this library embeds none itself.
    pub fn with_embedded(self, root: DelegateRootRef, config: &HostConfig) -> Registry {
        let mut candidates = self.candidates;
        for candidate in &mut candidates {
            // Decided again below, over every candidate.
            candidate.serves.clear();
            if matches!(candidate.status, Status::Shadowed { .. }) {
                candidate.status = if candidate.plugin.is_some() { Status::Loaded } else { Status::Listed };
            }
        }
        candidates.push(match Plugin::embedded_with(root, config) {
            Ok(plugin) => Candidate::loaded(None, plugin),
            Err(err) => Candidate::rejected(None, err.to_string()),
        });
        #[cfg_attr(not(target_os = "linux"), allow(unused_mut))]
        let mut registry = Registry::from_candidates(candidates, self.config);
        #[cfg(target_os = "linux")]
        {
            registry.isolation = self.isolation;
        }
        registry
    }

    /// Ranks the verified candidates of each backend (highest version, then first found) and marks those that
    /// serve nothing as shadowed.
    fn from_candidates(mut candidates: Vec<Candidate>, config: HostConfig) -> Registry {
        let mut serving: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (index, candidate) in candidates.iter().enumerate() {
            let Some(info) = candidate.usable() else { continue };
            for backend in &info.backends {
                serving.entry(backend.clone()).or_default().push(index);
            }
        }
        for order in serving.values_mut() {
            // Stable: equal versions keep search order.
            order.sort_by(|&a, &b| candidates[b].version().cmp(&candidates[a].version()));
        }
        for (backend, order) in &serving {
            candidates[order[0]].serves.push(backend.clone());
        }
        for index in 0..candidates.len() {
            let candidate = &candidates[index];
            let Some(info) = candidate.usable() else { continue };
            if candidate.serves.is_empty() {
                let winner = info.backends.first().and_then(|b| serving.get(b)).map(|order| order[0]);
                let by = winner.and_then(|w| candidates[w].path.clone());
                candidates[index].status = Status::Shadowed { by };
            }
        }
        for candidate in &mut candidates {
            // Keep `serves` in the plugin's own order.
            if let Some(info) = &candidate.info {
                let serves = std::mem::take(&mut candidate.serves);
                candidate.serves = info.backends.iter().filter(|b| serves.contains(b)).cloned().collect();
            }
        }
        Registry {
            candidates,
            serving,
            config,
            #[cfg(target_os = "linux")]
            isolation: None,
        }
    }

    /// Every candidate, in search order (embedded last).
    pub fn candidates(&self) -> &[Candidate] {
        &self.candidates
    }
}
