//! Plugin discovery: every candidate library in the search path, which one serves each backend and why, and
//! why the others do not.
//!
//! # Search order
//!
//! 1. the directories given explicitly (`--plugin-dir`), in order;
//! 2. the directories in `DELEGATE_PLUGIN_PATH` (separated like `PATH`: `:` on Unix, `;` on Windows), in order;
//! 3. the embedded reference and CUDA plugins (linked into `delegate-host`), then any plugin an application embeds
//!    with [`Registry::with_embedded`], last.
//!
//! In each directory, files with the platform's library extension (`.so`, `.dylib`, `.dll`) are candidates,
//! in file-name order. A file reached twice (a directory listed twice, a symlink) is considered once. A
//! missing or unreadable explicit directory is listed as rejected; a missing `DELEGATE_PLUGIN_PATH` entry is
//! skipped.
//!
//! # Verify first, then load
//!
//! A library's constructors run the moment the dynamic loader opens it, so no library is opened before it is
//! known to be what its [manifest](crate::plugin_manifest) says. [`Registry::discover`] (the default, and what
//! `delegate-host` uses) reads each library's manifest and hashes the library's bytes; it runs no library
//! code. A library whose SHA-256 differs from its manifest's is `rejected: sha256 ...` (naming the command that
//! writes the manifest again); one without a manifest is `not loaded: no manifest` and serves nothing. A
//! verified library is `listed` and loaded only when a program asks for a backend it serves
//! ([`Registry::served`]): its bytes are read once, hashed again, and exactly those bytes are loaded (see
//! `verify`), then its self-description is compared with the manifest.
//!
//! [`Registry::probe`] is the explicitly named exception: it loads every library now (those with a manifest
//! still verified first), for callers that trust their directories and for `delegate-host --probe`. Even a
//! probe leaves a library whose manifest asks for isolation unloaded.
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
//! dropped in `--plugin-dir` replaces the embedded one, a copy of the same version there is preferred to the
//! embedded one, and a stray or tampered one changes nothing.
//!
//! # Isolation
//!
//! [`Registry::served`] is the one place that decides whether a plugin runs in this process or in a worker
//! ([`Registry::with_isolation`]); every path that runs a program asks it. A plugin whose manifest asks for
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
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use std::sync::OnceLock;

use delegate_abi::abi::DelegateRootRef;
use delegate_abi::host::{HostConfig, Plugin};
use delegate_abi::{MemoryKind, PluginInfo, WireFormatSupport};

use crate::plugin_manifest::PluginManifest;

pub(crate) mod verify;

/// Environment variable with extra plugin directories.
pub const PLUGIN_PATH_ENV: &str = "DELEGATE_PLUGIN_PATH";

/// What became of a candidate.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Status {
    /// Loaded and serving at least one backend.
    Loaded,
    /// Not usable; the reason, one line.
    Rejected(String),
    /// Loaded, but it says it cannot run on this machine (`Delegate::availability`); the reason, one line.
    /// It serves no backend.
    Unavailable(String),
    /// Loaded, but every backend it offers is served by another plugin.
    Shadowed {
        /// The winner's path; `None` when the winner is the embedded plugin.
        by: Option<PathBuf>,
    },
    /// Known from its manifest, its bytes verified, not loaded: it loads when a program needs a backend it
    /// serves.
    Listed,
    /// A library without a manifest, not loaded (discovery without probing opens no library).
    NoManifest,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Status::Loaded => f.write_str("loaded"),
            Status::Rejected(reason) => write!(f, "rejected: {reason}"),
            Status::Unavailable(reason) => write!(f, "unavailable: {reason}"),
            Status::Shadowed { by: Some(path) } => write!(f, "shadowed by {}", path.display()),
            Status::Shadowed { by: None } => f.write_str("shadowed by (embedded)"),
            Status::Listed => f.write_str("listed (from its manifest; loads when a program needs it)"),
            Status::NoManifest => f.write_str(
                "not loaded: no manifest (write one with `delegate-host plugin-manifest LIB`; --probe loads it)",
            ),
        }
    }
}

/// One library considered by discovery, or the embedded plugin.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// The file; `None` for the embedded plugin.
    pub path: Option<PathBuf>,
    /// What became of it.
    pub status: Status,
    /// Its metadata, when the handshake succeeded (or what its manifest says, for one not loaded).
    pub info: Option<PluginInfo>,
    /// The negotiated ABI version, when the handshake succeeded.
    pub abi_version: Option<u32>,
    /// Backend ids it serves (a subset of `info.backends`; empty unless loaded or listed), as decided at
    /// discovery; [`Registry::candidate_for_backend`] says who serves now.
    pub serves: Vec<String>,
    /// Its manifest, when it has one.
    pub manifest: Option<PluginManifest>,
    plugin: Option<Arc<Plugin>>,
    /// A listed candidate's library, once something asked for it: the plugin, or why it cannot serve.
    lazy: Arc<OnceLock<Result<Arc<Plugin>, String>>>,
}

impl Candidate {
    /// The loaded plugin (also for shadowed candidates, and for a listed one once it was loaded).
    pub fn plugin(&self) -> Option<&Arc<Plugin>> {
        self.plugin.as_ref().or_else(|| self.lazy.get().and_then(|r| r.as_ref().ok()))
    }

    /// Why a listed candidate could not serve when it was asked to (rejected or unavailable), if so.
    pub fn load_failure(&self) -> Option<&str> {
        self.lazy.get().and_then(|r| r.as_ref().err()).map(String::as_str)
    }

    /// The plugin's version: the loaded plugin's, or its manifest's.
    fn version(&self) -> Option<semver::Version> {
        match (&self.plugin, &self.manifest) {
            (Some(plugin), _) => Some(plugin.version().clone()),
            (None, Some(manifest)) => Some(manifest.semver()),
            (None, None) => None,
        }
    }

    /// `path` for display: the file, or `(embedded)`.
    pub fn location(&self) -> String {
        self.path.as_ref().map_or_else(|| "(embedded)".to_string(), |p| p.display().to_string())
    }

    fn rejected(path: Option<PathBuf>, reason: String) -> Candidate {
        Candidate {
            path,
            status: Status::Rejected(reason),
            info: None,
            abi_version: None,
            serves: vec![],
            manifest: None,
            plugin: None,
            lazy: Arc::default(),
        }
    }

    /// A library known from its manifest, not loaded.
    fn listed(path: PathBuf, manifest: PluginManifest) -> Candidate {
        let info = PluginInfo {
            name: manifest.name.clone(),
            version: manifest.version.clone(),
            backends: manifest.backends.clone(),
            wire_formats: manifest
                .wire_formats
                .iter()
                .map(|w| WireFormatSupport { format: w.format.clone(), versions: w.versions.clone() })
                .collect(),
            memory_kinds: MemoryKind::ALL
                .into_iter()
                .filter(|k| manifest.memory_kinds.iter().any(|m| m == k.name()))
                .collect(),
            binds_aliases_in_place: manifest.binds_aliases_in_place,
        };
        Candidate {
            path: Some(path),
            status: Status::Listed,
            info: Some(info),
            abi_version: None,
            serves: vec![],
            manifest: Some(manifest),
            plugin: None,
            lazy: Arc::default(),
        }
    }

    /// A library with a manifest, refused without loading it: what the manifest says is kept for display.
    fn refused(path: PathBuf, manifest: PluginManifest, reason: String) -> Candidate {
        Candidate { status: Status::Rejected(reason), ..Candidate::listed(path, manifest) }
    }

    fn no_manifest(path: PathBuf) -> Candidate {
        Candidate { status: Status::NoManifest, ..Candidate::rejected(Some(path), String::new()) }
    }

    /// Loads a library now: verified against its manifest first when it has one.
    fn load(path: PathBuf, manifest: Option<PluginManifest>, config: &HostConfig) -> Candidate {
        match load_checked(&path, manifest.as_ref(), config) {
            Ok(plugin) => Candidate { manifest, ..Candidate::loaded(Some(path), plugin) },
            Err(reason) => {
                tracing::debug!(path = %path.display(), "plugin rejected: {reason}");
                match manifest {
                    Some(manifest) => Candidate::refused(path, manifest, reason),
                    None => Candidate::rejected(Some(path), reason),
                }
            }
        }
    }

    /// A listed candidate's plugin, loading it on first use; `None` when it cannot serve (the reason is kept,
    /// and logged once).
    fn load_listed(&self, config: &HostConfig) -> Option<Arc<Plugin>> {
        let path = self.path.as_ref().filter(|_| self.is_lazy())?;
        let result = self.lazy.get_or_init(|| {
            let loaded = load_checked(path, self.manifest.as_ref(), config).and_then(|plugin| {
                plugin.availability().map_err(|err| format!("unavailable: {}", err.message))?;
                tracing::debug!(path = %path.display(), "loaded on demand");
                Ok(Arc::new(plugin))
            });
            if let Err(reason) = &loaded {
                tracing::warn!(path = %path.display(), "plugin passed over, the next candidate serves: {reason}");
            }
            loaded
        });
        result.as_ref().ok().cloned()
    }

    /// Records that a listed candidate cannot serve here (logged once), without loading it.
    fn refuse_listed(&self, reason: &str) {
        if self.lazy.set(Err(reason.to_owned())).is_ok() {
            tracing::warn!(path = %self.location(), "plugin passed over, the next candidate serves: {reason}");
        }
    }

    fn loaded(path: Option<PathBuf>, plugin: Plugin) -> Candidate {
        let status = match plugin.availability() {
            Ok(()) => Status::Loaded,
            Err(err) => {
                tracing::debug!(plugin = %plugin.info().name, "plugin unavailable: {}", err.message);
                Status::Unavailable(err.message)
            }
        };
        Candidate {
            path,
            status,
            info: Some(plugin.info().clone()),
            abi_version: Some(plugin.abi_version()),
            serves: vec![],
            manifest: None,
            plugin: Some(Arc::new(plugin)),
            lazy: Arc::default(),
        }
    }

    /// The plugin's metadata when it may serve backends: loaded and available, or listed (verified) from a
    /// manifest.
    fn usable(&self) -> Option<&PluginInfo> {
        match self.status {
            Status::Unavailable(_) | Status::Rejected(_) | Status::NoManifest => None,
            Status::Listed => self.info.as_ref(),
            _ => self.plugin.as_ref().map(|p| p.info()),
        }
    }

    /// Whether it is a library known from its (verified) manifest and not loaded by discovery: listed, or
    /// listed and shadowed by a better candidate. It loads on first use.
    fn is_lazy(&self) -> bool {
        self.path.is_some()
            && self.plugin.is_none()
            && self.manifest.is_some()
            && matches!(self.status, Status::Listed | Status::Shadowed { .. })
    }

    /// Whether it has failed to serve since discovery (a listed one that could not load, or was refused).
    fn failed(&self) -> bool {
        self.load_failure().is_some()
    }
}

/// Loads the library at `path`, its bytes read once and, when it has a manifest, checked against the
/// manifest's SHA-256 **before** the loader sees them; then its self-description is compared with the
/// manifest. No code of the library runs when the hash differs.
pub(crate) fn load_checked(
    path: &Path,
    manifest: Option<&PluginManifest>,
    config: &HostConfig,
) -> Result<Plugin, String> {
    let bytes = verify::LibraryBytes::read(path)?;
    if let Some(manifest) = manifest {
        bytes.check(path, &manifest.sha256)?;
    }
    let sha256 = bytes.sha256.clone();
    let plugin = bytes.load(path, config)?;
    if let Some(manifest) = manifest {
        let actual = PluginManifest::describe_loaded(&plugin, path, sha256);
        let differences = manifest.differences(&actual);
        if !differences.is_empty() {
            return Err(format!(
                "the library disagrees with its manifest: {}; if you trust it, write its manifest again with \
                 `delegate-host plugin-manifest {}`",
                differences.join("; "),
                path.display()
            ));
        }
    }
    Ok(plugin)
}

/// Loads the library at `path` (the bytes hashed are the bytes loaded) and describes it as its manifest
/// would: what `delegate-host plugin-manifest` writes.
///
/// # Errors
/// The file cannot be read, or it is not a plugin this host can load (the reason, one line).
pub fn describe_library(path: &Path, config: &HostConfig) -> Result<PluginManifest, String> {
    let bytes = verify::LibraryBytes::read(path)?;
    let sha256 = bytes.sha256.clone();
    let plugin = bytes.load(path, config)?;
    Ok(PluginManifest::describe_loaded(&plugin, path, sha256))
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

/// How the plugin serving a backend runs: loaded into this process, or in worker processes.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Served {
    /// Loaded here; calls are direct.
    InProcess(Arc<Plugin>),
    /// Never loaded here: each instance runs in a worker process (see [`crate::isolate`]).
    #[cfg(target_os = "linux")]
    Isolated(crate::isolate::IsolatedPlugin),
}

impl Served {
    /// What the plugin says it is (an isolated one: what its manifest says).
    pub fn info(&self) -> &PluginInfo {
        match self {
            Served::InProcess(plugin) => plugin.info(),
            #[cfg(target_os = "linux")]
            Served::Isolated(plugin) => &plugin.info,
        }
    }

    /// The plugin, when it runs in this process; `None` when it runs in a worker.
    pub fn in_process(&self) -> Option<&Arc<Plugin>> {
        match self {
            Served::InProcess(plugin) => Some(plugin),
            #[cfg(target_os = "linux")]
            Served::Isolated(_) => None,
        }
    }

    /// Whether it runs in a worker process.
    pub fn is_isolated(&self) -> bool {
        self.in_process().is_none()
    }
}

/// The directories searched, in order: `dirs`, then `env_value` split like `PATH` (empty entries dropped).
pub fn search_path(dirs: &[PathBuf], env_value: Option<&OsString>) -> Vec<(PathBuf, bool)> {
    let mut out: Vec<(PathBuf, bool)> = dirs.iter().map(|d| (d.clone(), true)).collect();
    if let Some(value) = env_value {
        out.extend(std::env::split_paths(value).filter(|p| !p.as_os_str().is_empty()).map(|p| (p, false)));
    }
    out
}

/// The manifest next to the library at `path`, if there is one; an unreadable one, or one describing
/// another library, is the library's rejection reason.
fn manifest_of(path: &Path) -> Result<Option<PluginManifest>, String> {
    let manifest_path = PluginManifest::path_for(path);
    if std::fs::symlink_metadata(&manifest_path).is_err() {
        return Ok(None);
    }
    let manifest = PluginManifest::read(&manifest_path).map_err(|err| format!("unusable manifest: {err}"))?;
    let file_name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    if manifest.library != file_name {
        return Err(format!(
            "its manifest {} describes library '{}', not '{file_name}'",
            manifest_path.display(),
            manifest.library
        ));
    }
    Ok(Some(manifest))
}

fn is_library(path: &Path) -> bool {
    path.extension().is_some_and(|ext| ext == std::env::consts::DLL_EXTENSION)
}

/// A library with a manifest, discovered without loading: refused when its ABI range misses the host's or
/// its bytes differ from the manifest's hash; otherwise listed (verified).
fn from_manifest(path: PathBuf, manifest: PluginManifest, config: &HostConfig) -> Candidate {
    let abi = delegate_abi::abi::AbiRange { min: manifest.abi.min, max: manifest.abi.max };
    if let Err(err) = delegate_abi::abi::negotiate(config.abi_range, abi) {
        return Candidate::refused(path, manifest, err.to_string());
    }
    let verified = verify::sha256(&path).and_then(|sha256| verify::check(&path, &manifest.sha256, &sha256));
    match verified {
        Ok(()) => Candidate::listed(path, manifest),
        Err(reason) => {
            tracing::debug!(path = %path.display(), "plugin rejected: {reason}");
            Candidate::refused(path, manifest, reason)
        }
    }
}

/// How discovery treats the libraries it finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Manifests only: verify, list, load on demand.
    Manifests,
    /// Load every library now (verified first when it has a manifest).
    Probe,
}

impl Registry {
    /// Discovers plugins in `dirs`, then (if `use_env`) in `DELEGATE_PLUGIN_PATH`, then (if
    /// `include_embedded`) the embedded reference and CUDA plugins, **without running any library's code**:
    /// each library is listed from its manifest and its bytes checked against the manifest's SHA-256; it is
    /// loaded only when [`Registry::served`] asks for a backend it serves. Never fails: problems are listed per
    /// candidate. [`Registry::probe`] loads every library instead.
    pub fn discover(dirs: &[PathBuf], use_env: bool, include_embedded: bool) -> Registry {
        let env_value = if use_env { std::env::var_os(PLUGIN_PATH_ENV) } else { None };
        Registry::discover_with(dirs, env_value.as_ref(), include_embedded, &HostConfig::default())
    }

    /// [`Registry::discover`] with the environment value and host configuration given explicitly.
    pub fn discover_with(
        dirs: &[PathBuf],
        env_value: Option<&OsString>,
        include_embedded: bool,
        config: &HostConfig,
    ) -> Registry {
        Registry::search(dirs, env_value, include_embedded, config, Mode::Manifests)
    }

    /// The same as [`Registry::discover_with`] (discovery has read manifests by default since issue 17); kept
    /// for callers written before.
    pub fn discover_manifests(
        dirs: &[PathBuf],
        env_value: Option<&OsString>,
        include_embedded: bool,
        config: &HostConfig,
    ) -> Registry {
        Registry::discover_with(dirs, env_value, include_embedded, config)
    }

    /// Discovers like [`Registry::discover`] but **loads every library now** (`delegate-host --probe`): for
    /// directories the caller trusts, and for libraries without a manifest. A library with a manifest is still
    /// verified before it is loaded, and one whose manifest asks for isolation is only listed. Any library
    /// that crashes when opened takes this process with it.
    pub fn probe(dirs: &[PathBuf], use_env: bool, include_embedded: bool) -> Registry {
        let env_value = if use_env { std::env::var_os(PLUGIN_PATH_ENV) } else { None };
        Registry::probe_with(dirs, env_value.as_ref(), include_embedded, &HostConfig::default())
    }

    /// [`Registry::probe`] with the environment value and host configuration given explicitly.
    pub fn probe_with(
        dirs: &[PathBuf],
        env_value: Option<&OsString>,
        include_embedded: bool,
        config: &HostConfig,
    ) -> Registry {
        Registry::search(dirs, env_value, include_embedded, config, Mode::Probe)
    }

    fn search(
        dirs: &[PathBuf],
        env_value: Option<&OsString>,
        include_embedded: bool,
        config: &HostConfig,
        mode: Mode,
    ) -> Registry {
        let mut candidates = Vec::new();
        let mut seen = HashSet::new();
        for (dir, explicit) in search_path(dirs, env_value) {
            let entries = match std::fs::read_dir(&dir) {
                Ok(entries) => entries,
                Err(err) => {
                    if explicit {
                        candidates.push(Candidate::rejected(
                            Some(dir),
                            format!("cannot read plugin directory: {err}"),
                        ));
                    } else {
                        tracing::debug!(dir = %dir.display(), "skipping {PLUGIN_PATH_ENV} entry: {err}");
                    }
                    continue;
                }
            };
            let mut files: Vec<PathBuf> =
                entries.filter_map(Result::ok).map(|e| e.path()).filter(|p| is_library(p)).collect();
            files.sort();
            for path in files {
                let key = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
                if seen.insert(key) {
                    candidates.push(Registry::consider(path, config, mode));
                }
            }
        }
        if include_embedded {
            // The embedded defaults: the reference delegate (CPU) and the CUDA delegate (listed unavailable,
            // with the reason, on a machine without a GPU).
            for root in [reference_delegate::delegate_root(), cuda_delegate::delegate_root()] {
                candidates.push(match Plugin::embedded_with(root, config) {
                    Ok(plugin) => Candidate::loaded(None, plugin),
                    Err(err) => Candidate::rejected(None, err.to_string()),
                });
            }
        }
        Registry::from_candidates(candidates, config.clone())
    }

    /// One file named like a library.
    fn consider(path: PathBuf, config: &HostConfig, mode: Mode) -> Candidate {
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
        match (mode, manifest) {
            // Isolation is the manifest's promise that this process never runs the library: not even a probe
            // loads it.
            (Mode::Probe, Some(manifest)) if !manifest.isolate => {
                Candidate::load(path, Some(manifest), config)
            }
            (Mode::Probe, None) => Candidate::load(path, None, config),
            (_, Some(manifest)) => from_manifest(path, manifest, config),
            (Mode::Manifests, None) => Candidate::no_manifest(path),
        }
    }

    /// Adds a plugin linked into this binary, from the `delegate_root()` of its library crate (e.g.
    /// `my_delegate::delegate_root()`), as the last candidate: an application ships a third party's plugin
    /// inside its own binary, next to the embedded reference plugin, under the same duplicate rule.
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

    /// The plugin serving `backend` when it runs in this process.
    #[deprecated(
        note = "use `Registry::served`, the one function that decides whether a plugin runs in this process or \
                isolated; this returns `None` for an isolated plugin"
    )]
    pub fn for_backend(&self, backend: &str) -> Option<Arc<Plugin>> {
        self.served(backend).and_then(|served| served.in_process().cloned())
    }

    /// Runs plugins in worker processes as `isolation` says: every library-loaded plugin
    /// ([`Isolation::all`](crate::isolate::Isolation::all)) or those whose manifest asks for it. Only plugins
    /// known from a manifest and not loaded yet can be isolated; embedded plugins always run here, and a
    /// library a probe already loaded into this process is refused when `all` asks to isolate it.
    #[cfg(target_os = "linux")]
    pub fn with_isolation(mut self, isolation: crate::isolate::Isolation) -> Registry {
        self.isolation = Some(Arc::new(isolation));
        self
    }

    /// How the plugin serving `backend` runs — the one decision every path that runs a program (TOML, `.pte`,
    /// the ExecuTorch bridge, the library API) takes here: [`Served::Isolated`] for a listed plugin that the
    /// isolation settings cover (its library is not loaded here), otherwise the plugin loaded into this
    /// process (a listed one now, once, verified against its manifest). The verified candidates are tried best
    /// first; one that cannot serve is passed over (one log line) and [`Registry::unavailable_for`] says why.
    /// A plugin whose manifest asks for isolation is never loaded into a host without isolation settings.
    pub fn served(&self, backend: &str) -> Option<Served> {
        self.serving.get(backend)?.iter().find_map(|&index| self.try_serve(&self.candidates[index]))
    }

    /// `candidate` serving, or `None` (the reason recorded) when it cannot.
    fn try_serve(&self, candidate: &Candidate) -> Option<Served> {
        if candidate.failed() {
            return None;
        }
        match self.placement(candidate) {
            Placement::Isolated => self.isolated(candidate),
            Placement::Refused(reason) => {
                candidate.refuse_listed(reason);
                None
            }
            Placement::InProcess if candidate.is_lazy() => {
                candidate.load_listed(&self.config).map(Served::InProcess)
            }
            Placement::InProcess => candidate.plugin.clone().map(Served::InProcess),
        }
    }

    #[cfg(target_os = "linux")]
    fn isolated(&self, candidate: &Candidate) -> Option<Served> {
        let (Some(isolation), Some(path), Some(info)) = (&self.isolation, &candidate.path, &candidate.info)
        else {
            return None;
        };
        Some(Served::Isolated(crate::isolate::IsolatedPlugin {
            library: path.clone(),
            info: info.clone(),
            isolation: isolation.clone(),
        }))
    }

    #[cfg(not(target_os = "linux"))]
    fn isolated(&self, _candidate: &Candidate) -> Option<Served> {
        None
    }

    /// Where `candidate` runs under this registry's isolation settings.
    fn placement(&self, candidate: &Candidate) -> Placement {
        let asks = candidate.manifest.as_ref().is_some_and(|m| m.isolate);
        #[cfg(target_os = "linux")]
        let isolation = self.isolation.as_ref().map(|i| i.applies(asks));
        #[cfg(not(target_os = "linux"))]
        let isolation: Option<bool> = None;
        match (candidate.is_lazy(), &candidate.path, isolation) {
            // Embedded plugins are our own code: always here.
            (_, None, _) => Placement::InProcess,
            (true, Some(_), Some(true)) => Placement::Isolated,
            (true, Some(_), None) if asks => {
                Placement::Refused("its manifest asks to run it in a worker process, and this host runs none")
            }
            (true, Some(_), _) => Placement::InProcess,
            // Loaded into this process by a probe.
            (false, Some(_), Some(true)) => Placement::Refused(
                "a probe loaded it into this process, so it cannot run isolated (probing and isolating every \
                 plugin exclude each other)",
            ),
            _ => Placement::InProcess,
        }
    }

    /// Whether `candidate` runs in a worker process under this registry's isolation settings.
    pub fn runs_isolated(&self, candidate: &Candidate) -> bool {
        matches!(self.placement(candidate), Placement::Isolated)
    }

    /// Plugins that offer `backend` but cannot serve it — those that said they cannot run on this machine,
    /// listed ones that failed to load, disagreed with their manifest or must run isolated, libraries whose
    /// bytes differ from their manifest — and libraries without a manifest (which may offer it): (plugin name,
    /// or the library for one without a manifest; the reason).
    pub fn unavailable_for<'r>(&'r self, backend: &'r str) -> impl Iterator<Item = (String, String)> + 'r {
        self.candidates.iter().filter_map(move |c| {
            if c.status == Status::NoManifest {
                let path = c.path.as_deref()?.display().to_string();
                let reason = format!(
                    "it has no manifest, so this host does not know what it serves and never opens it; write \
                     one with `delegate-host plugin-manifest {path}`"
                );
                return Some((path, reason));
            }
            let info = c.info.as_ref().filter(|info| info.backends.iter().any(|b| b == backend))?;
            let reason = match (&c.status, c.load_failure()) {
                (Status::Unavailable(reason), _) => reason,
                (Status::Rejected(reason), _) if c.manifest.is_some() => reason,
                (_, Some(reason)) => reason,
                _ => return None,
            };
            Some((info.name.clone(), reason.to_owned()))
        })
    }

    /// The candidate serving `backend` now: the best verified one that has not failed to serve. Loads
    /// nothing (a listed candidate not asked for yet is taken to serve).
    pub fn candidate_for_backend(&self, backend: &str) -> Option<&Candidate> {
        let order = self.serving.get(backend)?;
        order.iter().map(|&i| &self.candidates[i]).find(|c| !c.failed())
    }

    /// Why [`Registry::candidate_for_backend`] serves `backend`, one phrase: the only candidate, the highest
    /// version, the first found among equal versions, and any better candidate passed over with its reason.
    pub fn why_serves(&self, backend: &str) -> Option<String> {
        let order: Vec<&Candidate> =
            self.serving.get(backend)?.iter().map(|&i| &self.candidates[i]).collect();
        let at = order.iter().position(|c| !c.failed())?;
        let winner = order[at];
        let version = winner.version().map_or_else(|| "?".to_owned(), |v| v.to_string());
        let rest = &order[at + 1..];
        let mut why = match rest.first() {
            None if at == 0 => "the only verified candidate that offers it".to_owned(),
            None => "the last verified candidate that offers it".to_owned(),
            Some(next) if next.version() < winner.version() => {
                format!("the highest version ({version}) of {} verified candidates", rest.len() + 1)
            }
            Some(_) => format!("found first of the verified candidates at version {version}"),
        };
        for passed in &order[..at] {
            let reason = passed.load_failure().unwrap_or("failed");
            why.push_str(&format!("; {} was passed over: {reason}", passed.location()));
        }
        Some(why)
    }

    /// Every backend id served, sorted (a backend whose every candidate failed to serve is not).
    pub fn backends(&self) -> Vec<String> {
        self.serving.keys().filter(|b| self.candidate_for_backend(b).is_some()).cloned().collect()
    }
}

/// Where a candidate runs.
enum Placement {
    InProcess,
    Isolated,
    Refused(&'static str),
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;
    use std::sync::OnceLock;

    fn in_process(registry: &Registry, backend: &str) -> Option<Arc<Plugin>> {
        registry.served(backend).and_then(|served| served.in_process().cloned())
    }

    fn dylib_name(stem: &str) -> String {
        format!("{}{stem}{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX)
    }

    /// The built `abi-test` plugin.
    fn abi_test_plugin() -> &'static Path {
        static PATH: OnceLock<PathBuf> = OnceLock::new();
        PATH.get_or_init(|| test_plugin_dir().join(dylib_name("abi_test")))
    }

    /// The built test plugins: `$DELEGATE_TEST_PLUGIN_DIR`, else built once into `target/plugin-tests`.
    fn test_plugin_dir() -> &'static Path {
        static DIR: OnceLock<PathBuf> = OnceLock::new();
        DIR.get_or_init(|| match std::env::var_os("DELEGATE_TEST_PLUGIN_DIR") {
            // Relative to the workspace root (tests run in the crate directory).
            Some(dir) => Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(dir),
            None => {
                let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
                let target = root.join("target/plugin-tests");
                let status = Command::new(env!("CARGO"))
                    .current_dir(&root)
                    .args([
                        "build",
                        "--quiet",
                        "-p",
                        "abi-test",
                        "-p",
                        "crash-on-load",
                        "-p",
                        "panic-on-info",
                    ])
                    .arg("--target-dir")
                    .arg(&target)
                    .status()
                    .expect("cargo runs");
                assert!(status.success(), "building the test plugins failed");
                target.join("debug")
            }
        })
    }

    fn dir_with(files: &[(&str, Option<&[u8]>)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("temp dir");
        for (name, contents) in files {
            let path = dir.path().join(name);
            match contents {
                Some(bytes) => std::fs::write(&path, bytes).expect("write"),
                None => {
                    std::fs::copy(abi_test_plugin(), &path).expect("copy plugin");
                }
            }
        }
        dir
    }

    fn statuses(registry: &Registry) -> Vec<(String, String)> {
        registry
            .candidates()
            .iter()
            .map(|c| {
                let name = c
                    .path
                    .as_ref()
                    .and_then(|p| p.file_name())
                    .map_or("(embedded)".into(), |n| n.to_string_lossy().into_owned());
                (name, c.status.to_string())
            })
            .collect()
    }

    #[test]
    fn a_text_file_is_rejected_while_the_real_plugin_and_the_embedded_one_load() {
        let fake = dylib_name("fake");
        let real = dylib_name("abi_test");
        let dir =
            dir_with(&[(&fake, Some(b"not a library\n")), (&real, None), ("README.txt", Some(b"ignored"))]);
        let registry = Registry::probe_with(&[dir.path().to_path_buf()], None, true, &HostConfig::default());
        let statuses = statuses(&registry);
        assert_eq!(statuses.len(), 4, "{statuses:?}");
        assert_eq!(statuses[0].0, real);
        assert_eq!(statuses[0].1, "loaded");
        assert_eq!(statuses[1].0, fake);
        assert!(statuses[1].1.starts_with("rejected: not a loadable library: "), "{}", statuses[1].1);
        assert_eq!(statuses[2], ("(embedded)".to_string(), "loaded".to_string()));
        // The embedded CUDA delegate: loaded where a GPU is, else unavailable with the reason.
        assert_eq!(statuses[3].0, "(embedded)");
        assert!(statuses[3].1 == "loaded" || statuses[3].1.starts_with("unavailable: "), "{}", statuses[3].1);

        let plugin = in_process(&registry, "AbiTestBackend").expect("served");
        assert_eq!(plugin.info().name, "abi-test");
        assert!(in_process(&registry, "ReferenceBackend").is_some(), "{:?}", registry.backends());
        assert!(in_process(&registry, "Nope").is_none());
        assert!(registry.backends().contains(&"AbiTestBackend".to_string()));
    }

    #[test]
    fn things_named_like_libraries_that_are_not_files_are_listed_with_the_reason() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir(dir.path().join(dylib_name("a_directory"))).expect("mkdir");
        #[cfg(unix)]
        std::os::unix::fs::symlink(dir.path().join("nowhere"), dir.path().join(dylib_name("b_dangling")))
            .expect("symlink");
        let fifo = dir.path().join(dylib_name("c_fifo"));
        let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo runs");
        assert!(made.success());
        let registry = Registry::probe_with(&[dir.path().to_path_buf()], None, false, &HostConfig::default());
        let statuses = statuses(&registry);
        assert_eq!(statuses.len(), 3, "{statuses:?}");
        assert_eq!(statuses[0].1, "rejected: not a regular file (it is a directory)");
        assert!(statuses[1].1.starts_with("rejected: cannot read it: "), "{}", statuses[1].1);
        assert!(statuses[1].1.ends_with("(a dangling symbolic link?)"), "{}", statuses[1].1);
        assert_eq!(statuses[2].1, "rejected: not a regular file (it is a FIFO)");
    }

    #[test]
    fn equal_versions_first_found_wins_and_later_ones_are_shadowed() {
        let first = dir_with(&[(&dylib_name("abi_test_a"), None)]);
        let second = dir_with(&[(&dylib_name("abi_test_b"), None)]);
        let env = std::env::join_paths([second.path()]).expect("joins");
        let registry =
            Registry::probe_with(&[first.path().to_path_buf()], Some(&env), false, &HostConfig::default());
        let winner = first.path().join(dylib_name("abi_test_a"));
        assert_eq!(registry.candidates()[0].status, Status::Loaded);
        assert_eq!(registry.candidates()[0].serves, ["AbiTestBackend"]);
        assert_eq!(registry.candidates()[1].status, Status::Shadowed { by: Some(winner.clone()) });
        assert_eq!(registry.candidates()[1].status.to_string(), format!("shadowed by {}", winner.display()));
        assert_eq!(
            in_process(&registry, "AbiTestBackend").and_then(|p| p.path().map(Path::to_path_buf)),
            Some(winner)
        );
    }

    #[test]
    fn the_same_file_reached_twice_is_one_candidate_and_missing_dirs_are_reported() {
        let dir = dir_with(&[(&dylib_name("abi_test"), None)]);
        let missing = dir.path().join("does-not-exist");
        let env = std::env::join_paths([dir.path(), missing.as_path()]).expect("joins");
        let registry = Registry::probe_with(
            &[dir.path().to_path_buf(), missing.clone()],
            Some(&env),
            false,
            &HostConfig::default(),
        );
        let statuses = statuses(&registry);
        assert_eq!(statuses.len(), 2, "{statuses:?}");
        assert_eq!(statuses[0].1, "loaded");
        assert_eq!(registry.candidates()[1].path.as_deref(), Some(missing.as_path()));
        assert!(statuses[1].1.starts_with("rejected: cannot read plugin directory: "), "{}", statuses[1].1);
    }

    #[test]
    fn an_incompatible_abi_is_rejected_with_both_ranges() {
        let dir = dir_with(&[(&dylib_name("abi_test"), None)]);
        let config = HostConfig::default().with_abi_range(delegate_abi::abi::AbiRange::new(2, 3));
        let registry = Registry::probe_with(&[dir.path().to_path_buf()], None, false, &config);
        assert_eq!(
            registry.candidates()[0].status,
            Status::Rejected("plugin speaks ABI 1..=1, host 2..=3".into())
        );
        assert!(registry.backends().is_empty());
    }

    macro_rules! versioned {
        ($module:ident, $ty:ident, $version:literal, [$($backend:literal),*]) => {
            enum $ty {}
            impl delegate_abi::testing::Fixture for $ty {
                fn info() -> PluginInfo {
                    PluginInfo {
                        name: stringify!($ty).into(),
                        version: $version.into(),
                        backends: vec![$($backend.into()),*],
                        binds_aliases_in_place: false,
                        ..delegate_abi::testing::info("", "")
                    }
                }
            }
            mod $module {
                delegate_abi::export_delegate!(@embedded delegate_abi::testing::Scripted<super::$ty>);
            }
        };
    }

    versioned!(v1_0, V1_0, "1.0.0", ["X", "Y"]);
    versioned!(v1_10, V1_10, "1.10.0", ["X"]);
    versioned!(v1_2, V1_2, "1.2.0", ["X"]);

    #[test]
    fn the_highest_semver_version_serves_a_backend_per_backend() {
        let load = |root| Plugin::embedded(root).expect("embedded");
        let candidates = vec![
            Candidate::loaded(Some("a.so".into()), load(v1_0::delegate_root())),
            Candidate::loaded(Some("b.so".into()), load(v1_10::delegate_root())),
            Candidate::loaded(Some("c.so".into()), load(v1_2::delegate_root())),
        ];
        let registry = Registry::from_candidates(candidates, HostConfig::default());
        // 1.10.0 > 1.2.0 in semver order (not in string order).
        assert_eq!(in_process(&registry, "X").map(|p| p.info().name.clone()).as_deref(), Some("V1_10"));
        // The oldest still serves the backend nobody else offers.
        assert_eq!(in_process(&registry, "Y").map(|p| p.info().name.clone()).as_deref(), Some("V1_0"));
        let c = registry.candidates();
        assert_eq!((c[0].status.clone(), c[0].serves.clone()), (Status::Loaded, vec!["Y".to_string()]));
        assert_eq!((c[1].status.clone(), c[1].serves.clone()), (Status::Loaded, vec!["X".to_string()]));
        assert_eq!(c[2].status, Status::Shadowed { by: Some("b.so".into()) });
    }

    #[test]
    fn an_application_embeds_more_plugins_under_the_same_duplicate_rule() {
        let load = |root| Plugin::embedded(root).expect("embedded");
        let registry = Registry::from_candidates(
            vec![Candidate::loaded(Some("a.so".into()), load(v1_2::delegate_root()))],
            HostConfig::default(),
        );
        let config = HostConfig::default();
        // An older embedded copy is shadowed by the discovered plugin ...
        let registry = registry.with_embedded(v1_0::delegate_root(), &config);
        let c = registry.candidates();
        assert_eq!((c[0].status.clone(), c[0].serves.clone()), (Status::Loaded, vec!["X".to_string()]));
        assert_eq!((c[1].path.clone(), c[1].serves.clone()), (None, vec!["Y".to_string()]), "serves Y alone");
        // ... and a newer one takes the backend over, the decision made again over every candidate.
        let registry = registry.with_embedded(v1_10::delegate_root(), &config);
        let c = registry.candidates();
        assert_eq!(c[0].status, Status::Shadowed { by: None });
        assert_eq!(c[1].serves, ["Y"]);
        assert_eq!((c[2].status.clone(), c[2].serves.clone()), (Status::Loaded, vec!["X".to_string()]));
        assert_eq!(in_process(&registry, "X").map(|p| p.info().name.clone()).as_deref(), Some("V1_10"));
        assert_eq!(registry.candidates().len(), 3);
    }

    #[test]
    fn search_path_puts_explicit_dirs_before_the_environment() {
        let env = std::env::join_paths(["/b", "", "/c"]).expect("joins");
        let path = search_path(&[PathBuf::from("/a")], Some(&env));
        assert_eq!(
            path,
            [(PathBuf::from("/a"), true), (PathBuf::from("/b"), false), (PathBuf::from("/c"), false)]
        );
    }

    #[test]
    fn a_plugin_whose_manifest_asks_for_isolation_never_loads_into_a_host_without_workers() {
        let dir = dir_with_manifest(|m| m.isolate = true);
        let registry = discover_manifests(dir.path());
        assert!(registry.served("AbiTestBackend").is_none());
        assert!(registry.candidates()[0].plugin().is_none(), "the library was not opened");
        let reasons: Vec<(String, String)> = registry.unavailable_for("AbiTestBackend").collect();
        assert_eq!(
            reasons,
            [(
                "abi-test".to_owned(),
                "its manifest asks to run it in a worker process, and this host runs none".to_owned()
            )]
        );
        // With workers, it is served isolated (still without opening the library here).
        let isolated = discover_manifests(dir.path())
            .with_isolation(crate::isolate::Isolation::new("/nonexistent/worker", ["worker"]));
        match isolated.served("AbiTestBackend") {
            Some(Served::Isolated(plugin)) => assert_eq!(plugin.info.name, "abi-test"),
            other => panic!("expected an isolated plugin, got {other:?}"),
        }
        assert!(isolated.candidates()[0].plugin().is_none());
        // Without the manifest's flag, only `all` isolates it.
        let plain = dir_with_manifest(|_| {});
        let here = discover_manifests(plain.path())
            .with_isolation(crate::isolate::Isolation::new("/nonexistent/worker", ["worker"]));
        assert!(matches!(here.served("AbiTestBackend"), Some(Served::InProcess(_))));
    }

    /// A directory with the abi-test plugin and its manifest as the tool writes it; `edit` changes the manifest.
    fn dir_with_manifest(edit: impl FnOnce(&mut PluginManifest)) -> tempfile::TempDir {
        let real = dylib_name("abi_test");
        let dir = dir_with(&[(&real, None)]);
        let library = dir.path().join(&real);
        let plugin = Plugin::load(&library, &HostConfig::default()).expect("the test plugin loads");
        let mut manifest = PluginManifest::describe(&plugin, &library).expect("hashable");
        edit(&mut manifest);
        std::fs::write(PluginManifest::path_for(&library), manifest.to_json()).expect("write manifest");
        dir
    }

    fn discover_manifests(dir: &Path) -> Registry {
        Registry::discover_manifests(&[dir.to_path_buf()], None, false, &HostConfig::default())
    }

    #[test]
    fn manifests_list_plugins_without_loading_and_a_backend_loads_on_first_use() {
        let dir = dir_with_manifest(|_| {});
        let registry = discover_manifests(dir.path());
        let candidate = &registry.candidates()[0];
        assert_eq!(candidate.status, Status::Listed);
        assert_eq!(candidate.serves, ["AbiTestBackend"], "the duplicate rule runs on the manifest");
        assert!(candidate.plugin().is_none() && candidate.abi_version.is_none(), "nothing loaded yet");
        let plugin = in_process(&registry, "AbiTestBackend").expect("loads on demand");
        assert_eq!(plugin.info().name, "abi-test");
        assert!(registry.candidates()[0].plugin().is_some(), "kept for the next caller");
        assert!(
            Arc::ptr_eq(&plugin, &in_process(&registry, "AbiTestBackend").expect("served")),
            "loaded once"
        );
    }

    #[test]
    fn a_manifest_that_cannot_apply_is_refused_without_loading() {
        type Edit = fn(&mut PluginManifest);
        let cases: [(Edit, &str); 4] = [
            (
                |m| m.abi = crate::plugin_manifest::AbiSpan { min: 2, max: 3 },
                "plugin speaks ABI 2..=3, host 1..=1",
            ),
            (|m| m.target = "sparc-plan9".into(), "built for sparc-plan9, this machine is"),
            (|m| m.library = "libother.so".into(), "describes library 'libother.so', not 'libabi_test.so'"),
            (|m| m.manifest_version = 2, "manifest version 2 (this build reads 1)"),
        ];
        for (edit, reason) in cases {
            let dir = dir_with_manifest(edit);
            let registry = discover_manifests(dir.path());
            let candidate = &registry.candidates()[0];
            assert!(
                matches!(&candidate.status, Status::Rejected(r) if r.contains(reason)),
                "{:?} lacks {reason}",
                candidate.status
            );
            assert!(in_process(&registry, "AbiTestBackend").is_none());
        }
    }

    #[test]
    fn a_library_that_differs_from_its_manifest_serves_nothing_and_says_why() {
        let dir = dir_with_manifest(|m| m.backends.push("ExtraBackend".into()));
        let registry = discover_manifests(dir.path());
        assert!(in_process(&registry, "AbiTestBackend").is_none(), "refused when loaded");
        // Not listed as served once it failed (a run's error said "loaded: AbiTestBackend").
        assert!(!registry.backends().contains(&"AbiTestBackend".to_owned()), "{:?}", registry.backends());
        let reasons: Vec<(String, String)> = registry.unavailable_for("AbiTestBackend").collect();
        let library = dir.path().join(dylib_name("abi_test"));
        let expected = format!(
            "the library disagrees with its manifest: backends: manifest AbiTestBackend,ExtraBackend, library \
             AbiTestBackend; if you trust it, write its manifest again with `delegate-host plugin-manifest {}`",
            library.display()
        );
        assert_eq!(reasons, [("abi-test".to_owned(), expected.clone())]);
        // Probing loads it at once and rejects it for the same reason.
        let probed = Registry::probe_with(&[dir.path().to_path_buf()], None, false, &HostConfig::default());
        assert_eq!(probed.candidates()[0].status, Status::Rejected(expected));
    }

    #[test]
    fn without_a_manifest_a_library_is_listed_and_loaded_only_by_probing() {
        let dir = dir_with(&[(&dylib_name("abi_test"), None)]);
        let registry = discover_manifests(dir.path());
        assert_eq!(registry.candidates()[0].status, Status::NoManifest);
        assert!(in_process(&registry, "AbiTestBackend").is_none());
        let probed = Registry::probe_with(&[dir.path().to_path_buf()], None, false, &HostConfig::default());
        assert_eq!(probed.candidates()[0].status, Status::Loaded);
    }

    /// Copies the built `stem` into `dir` beside a manifest claiming `ReferenceBackend` at 9.0.0, with the
    /// given SHA-256 (`None`: the copy's own); returns the copy's path.
    fn claims_reference_9(dir: &Path, stem: &str, sha256: Option<&str>) -> PathBuf {
        let library = dir.join(dylib_name(stem));
        std::fs::copy(test_plugin_dir().join(dylib_name(stem)), &library).expect("built fixture");
        let sha256 = match sha256 {
            Some(sha) => sha.to_owned(),
            None => crate::plugin_manifest::sha256_file(&library).expect("hashable"),
        };
        let manifest = PluginManifest {
            manifest_version: crate::plugin_manifest::MANIFEST_VERSION,
            library: dylib_name(stem),
            sha256,
            name: stem.into(),
            version: "9.0.0".into(),
            abi: crate::plugin_manifest::AbiSpan { min: 1, max: 1 },
            backends: vec!["ReferenceBackend".into()],
            wire_formats: vec![],
            memory_kinds: vec!["host".into()],
            binds_aliases_in_place: true,
            target: crate::plugin_manifest::host_target(),
            rustc: None,
            isolate: false,
        };
        std::fs::write(PluginManifest::path_for(&library), manifest.to_json()).expect("write manifest");
        library
    }

    fn served_by_embedded(registry: &Registry) {
        let served = in_process(registry, "ReferenceBackend").expect("the embedded plugin serves");
        assert_eq!((served.path(), served.info().name.as_str()), (None, "reference-delegate"));
        assert_eq!(registry.candidate_for_backend("ReferenceBackend").map(|c| c.path.clone()), Some(None));
        assert!(registry.backends().contains(&"ReferenceBackend".to_owned()));
    }

    #[test]
    fn a_library_whose_bytes_differ_from_its_manifest_never_runs_and_the_embedded_plugin_serves() {
        // crash-on-load aborts this test process the moment any of its code runs.
        let dir = tempfile::tempdir().expect("temp dir");
        let wrong = "ab".repeat(32);
        let library = claims_reference_9(dir.path(), "crash_on_load", Some(&wrong));
        let dirs = [dir.path().to_path_buf()];
        let config = HostConfig::default();
        for registry in [
            Registry::discover_with(&dirs, None, true, &config),
            Registry::probe_with(&dirs, None, true, &config),
        ] {
            let candidate = &registry.candidates()[0];
            let status = candidate.status.to_string();
            assert!(status.starts_with(&format!("rejected: sha256: manifest {wrong}, library ")), "{status}");
            assert!(
                status.ends_with(&format!("`delegate-host plugin-manifest {}`", library.display())),
                "{status}"
            );
            assert!(candidate.plugin().is_none() && candidate.serves.is_empty());
            served_by_embedded(&registry);
            let reasons: Vec<(String, String)> = registry.unavailable_for("ReferenceBackend").collect();
            assert_eq!(reasons.len(), 1, "{reasons:?}");
            assert_eq!(reasons[0].0, "crash_on_load");
            assert!(reasons[0].1.starts_with("sha256: manifest "), "{reasons:?}");
        }
    }

    #[test]
    fn a_winner_that_fails_when_loaded_is_passed_over_for_the_next_verified_candidate() {
        // Both hash right and claim 9.0.0, so each wins on paper; loading finds abi-test disagreeing with the
        // manifest, and panic-on-info's self-description panicking.
        for (stem, failure) in [
            (
                "abi_test",
                "the library disagrees with its manifest: name: manifest abi_test, library abi-test",
            ),
            ("panic_on_info", "plugin refused the handshake: "),
        ] {
            let dir = tempfile::tempdir().expect("temp dir");
            let library = claims_reference_9(dir.path(), stem, None);
            let registry =
                Registry::discover_with(&[dir.path().to_path_buf()], None, true, &HostConfig::default());
            assert_eq!(registry.candidates()[0].status, Status::Listed);
            assert_eq!(registry.candidates()[0].serves, ["ReferenceBackend"]);
            assert_eq!(
                registry.why_serves("ReferenceBackend").as_deref(),
                Some("the highest version (9.0.0) of 2 verified candidates")
            );
            served_by_embedded(&registry);
            let reason = registry.candidates()[0].load_failure().expect("recorded").to_owned();
            assert!(reason.starts_with(failure), "{reason}");
            let why = registry.why_serves("ReferenceBackend").expect("served");
            assert_eq!(
                why,
                format!(
                    "the last verified candidate that offers it; {} was passed over: {reason}",
                    library.display()
                )
            );
        }
    }

    #[test]
    fn a_probe_never_loads_a_library_whose_manifest_asks_for_isolation() {
        let asks = dir_with_manifest(|m| m.isolate = true);
        let config = HostConfig::default();
        let probed = Registry::probe_with(&[asks.path().to_path_buf()], None, false, &config);
        assert_eq!(probed.candidates()[0].status, Status::Listed);
        assert!(probed.candidates()[0].plugin().is_none());
        assert!(probed.served("AbiTestBackend").is_none(), "no workers here");
        let isolated = Registry::probe_with(&[asks.path().to_path_buf()], None, false, &config)
            .with_isolation(crate::isolate::Isolation::new("/nonexistent/worker", ["worker"]));
        assert!(isolated.served("AbiTestBackend").is_some_and(|s| s.is_isolated()));
        assert!(isolated.runs_isolated(&isolated.candidates()[0]));
    }

    #[test]
    fn isolating_every_plugin_refuses_one_a_probe_already_loaded() {
        let plain = dir_with_manifest(|_| {});
        let registry =
            Registry::probe_with(&[plain.path().to_path_buf()], None, false, &HostConfig::default())
                .with_isolation(crate::isolate::Isolation::new("/nonexistent/worker", ["worker"]).all(true));
        assert_eq!(registry.candidates()[0].status, Status::Loaded);
        assert!(registry.served("AbiTestBackend").is_none(), "never silently in process");
        let reasons: Vec<(String, String)> = registry.unavailable_for("AbiTestBackend").collect();
        assert_eq!(reasons.len(), 1);
        assert!(reasons[0].1.starts_with("a probe loaded it into this process"), "{reasons:?}");
    }

    #[test]
    fn a_library_without_a_manifest_is_named_with_the_command_that_writes_one() {
        let dir = dir_with(&[(&dylib_name("abi_test"), None)]);
        let registry = discover_manifests(dir.path());
        let library = dir.path().join(dylib_name("abi_test"));
        let reasons: Vec<(String, String)> = registry.unavailable_for("AnyBackend").collect();
        assert_eq!(reasons.len(), 1);
        assert_eq!(reasons[0].0, library.display().to_string());
        assert!(
            reasons[0]
                .1
                .ends_with(&format!("write one with `delegate-host plugin-manifest {}`", library.display())),
            "{reasons:?}"
        );
    }

    #[test]
    fn a_shadowed_library_serves_when_the_better_one_fails_when_loaded() {
        // Both hash right; the first claims a newer version than the library says, so it fails when loaded.
        let newer = dir_with_manifest(|m| m.version = "9.0.0".into());
        let plain = dir_with_manifest(|_| {});
        let dirs = [newer.path().to_path_buf(), plain.path().to_path_buf()];
        let registry = Registry::discover_with(&dirs, None, false, &HostConfig::default());
        let second = plain.path().join(dylib_name("abi_test"));
        assert!(matches!(registry.candidates()[1].status, Status::Shadowed { .. }));
        let served = in_process(&registry, "AbiTestBackend").expect("the shadowed one serves");
        assert_eq!(served.path(), Some(second.as_path()));
        assert_eq!(
            registry.candidate_for_backend("AbiTestBackend").and_then(|c| c.path.clone()),
            Some(second)
        );
        assert!(registry.candidates()[0]
            .load_failure()
            .is_some_and(|r| r.contains("version: manifest 9.0.0")));
    }
}
