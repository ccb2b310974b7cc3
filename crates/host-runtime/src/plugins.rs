//! Plugin discovery: every candidate library in the search path, which ones loaded, which backend each
//! serves, and why the others did not.
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
//! # Which plugin serves a backend
//!
//! Plugins are keyed by (backend id, plugin version). For each backend id, the loaded plugin with the
//! **highest version** (semver order) serves it; among equal versions, the **first found** in search order
//! wins. A plugin that serves none of its backends is listed as `shadowed by <path>` (the plugin serving its
//! first backend). So a newer reference plugin dropped in `--plugin-dir` replaces the embedded one, and a
//! copy of the same version in `--plugin-dir` is preferred to the embedded one.
//!
//! A file that is not a plugin, or a plugin whose ABI the host cannot speak, is listed as
//! `rejected: <reason>`; the others still load.
//!
//! # Manifests: discovery without loading
//!
//! A library's constructors run when it is opened, so opening every library on the plugin path lets any one
//! of them take the host down. [`Registry::discover_manifests`] (what `delegate-host` uses) reads each
//! library's [manifest](crate::plugin_manifest) instead and opens nothing: candidates are `listed` with what
//! their manifest says, the duplicate rule runs on the manifests' versions, and a library is loaded only when
//! a program asks for a backend it serves ([`Registry::for_backend`]). Loading checks the library against its
//! manifest (SHA-256 and self-description) and rejects it naming every difference. A library without a
//! manifest is listed `not loaded: no manifest` and serves nothing. [`Registry::discover`] and
//! [`Registry::discover_with`] *probe* instead: they load every library now (checking those that have a
//! manifest), for callers that trust their directories and for `delegate-host --probe`.
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
    /// Known from its manifest, not loaded: it loads when a program needs a backend it serves.
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
            Status::NoManifest => f.write_str("not loaded: no manifest (--probe loads it)"),
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
    /// Its metadata, when the handshake succeeded.
    pub info: Option<PluginInfo>,
    /// The negotiated ABI version, when the handshake succeeded.
    pub abi_version: Option<u32>,
    /// Backend ids it serves (a subset of `info.backends`; empty unless loaded or listed).
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

    /// Why a listed candidate could not serve when it was asked to load (rejected or unavailable), if so.
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

    fn no_manifest(path: PathBuf) -> Candidate {
        Candidate { status: Status::NoManifest, ..Candidate::rejected(Some(path), String::new()) }
    }

    /// Loads a library now: checked against its manifest when it has one.
    fn load(path: PathBuf, manifest: Option<PluginManifest>, config: &HostConfig) -> Candidate {
        match load_checked(&path, manifest.as_ref(), config) {
            Ok(plugin) => Candidate { manifest, ..Candidate::loaded(Some(path), plugin) },
            Err(reason) => {
                tracing::debug!(path = %path.display(), "plugin rejected: {reason}");
                Candidate { manifest, ..Candidate::rejected(Some(path), reason) }
            }
        }
    }

    /// A listed candidate's plugin, loading it on first use; `None` when it cannot serve (the reason is kept).
    fn load_listed(&self, config: &HostConfig) -> Option<Arc<Plugin>> {
        let (Some(path), Status::Listed) = (&self.path, &self.status) else { return None };
        let result = self.lazy.get_or_init(|| {
            let plugin = load_checked(path, self.manifest.as_ref(), config)?;
            plugin.availability().map_err(|err| format!("unavailable: {}", err.message))?;
            tracing::debug!(path = %path.display(), "loaded on demand");
            Ok(Arc::new(plugin))
        });
        result.as_ref().ok().cloned()
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

    /// The plugin's metadata when it may serve backends: loaded and available, or listed from a manifest.
    fn usable(&self) -> Option<&PluginInfo> {
        match self.status {
            Status::Unavailable(_) | Status::Rejected(_) | Status::NoManifest => None,
            Status::Listed => self.info.as_ref(),
            _ => self.plugin.as_ref().map(|p| p.info()),
        }
    }
}

/// Loads the library at `path` and, when it has a manifest, checks the library against it.
pub(crate) fn load_checked(
    path: &Path,
    manifest: Option<&PluginManifest>,
    config: &HostConfig,
) -> Result<Plugin, String> {
    let plugin = Plugin::load(path, config).map_err(|err| err.to_string())?;
    if let Some(manifest) = manifest {
        let actual = PluginManifest::describe(&plugin, path)
            .map_err(|err| format!("cannot hash the library: {err}"))?;
        let differences = manifest.differences(&actual);
        if !differences.is_empty() {
            return Err(format!("the library disagrees with its manifest: {}", differences.join("; ")));
        }
    }
    Ok(plugin)
}

/// Every candidate found, and which plugin serves each backend id.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    candidates: Vec<Candidate>,
    serving: BTreeMap<String, usize>,
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

impl Registry {
    /// Discovers plugins in `dirs`, then (if `use_env`) in `DELEGATE_PLUGIN_PATH`, then (if
    /// `include_embedded`) the embedded reference and CUDA plugins, **probing**: every library is loaded now
    /// (those with a manifest are checked against it). Never fails: problems are listed per candidate. For
    /// directories the caller trusts; see [`Registry::discover_manifests`] for discovery that opens nothing.
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
        Registry::search(dirs, env_value, include_embedded, config, true)
    }

    /// Discovery that opens no library: candidates are listed from their manifests (a library without one is
    /// listed and serves nothing), and a library is loaded, and checked against its manifest, only when
    /// [`Registry::for_backend`] asks for a backend it serves. The embedded plugins are loaded as always.
    pub fn discover_manifests(
        dirs: &[PathBuf],
        env_value: Option<&OsString>,
        include_embedded: bool,
        config: &HostConfig,
    ) -> Registry {
        Registry::search(dirs, env_value, include_embedded, config, false)
    }

    fn search(
        dirs: &[PathBuf],
        env_value: Option<&OsString>,
        include_embedded: bool,
        config: &HostConfig,
        probe: bool,
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
                if !seen.insert(key) {
                    continue;
                }
                // Named like a library but not one: listed with the reason, never opened (a FIFO would
                // block the loader).
                let not_a_file = match std::fs::metadata(&path) {
                    Ok(metadata) if metadata.is_file() => None,
                    Ok(metadata) => Some(format!(
                        "not a regular file (it is {})",
                        crate::blob_file::file_kind(&metadata.file_type())
                    )),
                    Err(err) => Some(format!("cannot read it: {err} (a dangling symbolic link?)")),
                };
                if let Some(reason) = not_a_file {
                    candidates.push(Candidate::rejected(Some(path), reason));
                    continue;
                }
                let manifest = match manifest_of(&path) {
                    Ok(manifest) => manifest,
                    Err(reason) => {
                        candidates.push(Candidate::rejected(Some(path), reason));
                        continue;
                    }
                };
                candidates.push(match (probe, manifest) {
                    (true, manifest) => Candidate::load(path, manifest, config),
                    (false, Some(manifest)) => {
                        // A plugin whose ABI range misses the host's is refused from its manifest alone.
                        let abi =
                            delegate_abi::abi::AbiRange { min: manifest.abi.min, max: manifest.abi.max };
                        match delegate_abi::abi::negotiate(config.abi_range, abi) {
                            Ok(_) => Candidate::listed(path, manifest),
                            Err(err) => Candidate {
                                manifest: Some(manifest),
                                ..Candidate::rejected(Some(path), err.to_string())
                            },
                        }
                    }
                    (false, None) => Candidate::no_manifest(path),
                });
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

    /// Applies the duplicate rule (highest version, then first found) to candidates in search order.
    fn from_candidates(mut candidates: Vec<Candidate>, config: HostConfig) -> Registry {
        let mut serving: BTreeMap<String, usize> = BTreeMap::new();
        for (index, candidate) in candidates.iter().enumerate() {
            let Some(info) = candidate.usable() else { continue };
            for backend in &info.backends {
                match serving.get(backend) {
                    Some(&current) => {
                        if candidate.version() > candidates[current].version() {
                            serving.insert(backend.clone(), index);
                        }
                    }
                    None => {
                        serving.insert(backend.clone(), index);
                    }
                }
            }
        }
        for (backend, &index) in &serving {
            candidates[index].serves.push(backend.clone());
        }
        for index in 0..candidates.len() {
            let candidate = &candidates[index];
            let Some(info) = candidate.usable() else { continue };
            if candidate.serves.is_empty() {
                let winner = info.backends.first().and_then(|b| serving.get(b)).copied();
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

    /// The plugin serving `backend`, if any (a shared handle; the library stays loaded regardless). A
    /// candidate listed from its manifest is loaded now, once, and checked against its manifest; when that
    /// fails it serves nothing and [`Registry::unavailable_for`] says why.
    pub fn for_backend(&self, backend: &str) -> Option<Arc<Plugin>> {
        let candidate = &self.candidates[*self.serving.get(backend)?];
        match candidate.status {
            Status::Listed => candidate.load_listed(&self.config),
            _ => candidate.plugin.clone(),
        }
    }

    /// Runs plugins in worker processes as `isolation` says: every library-loaded plugin
    /// ([`Isolation::all`](crate::isolate::Isolation::all)) or those whose manifest asks for it. Only plugins
    /// known from a manifest and not loaded yet can be isolated; embedded plugins always run here.
    #[cfg(target_os = "linux")]
    pub fn with_isolation(mut self, isolation: crate::isolate::Isolation) -> Registry {
        self.isolation = Some(Arc::new(isolation));
        self
    }

    /// How the plugin serving `backend` runs: [`Served::Isolated`] for a listed plugin that the isolation
    /// settings cover (its library is not loaded here), otherwise [`Registry::for_backend`]'s plugin. A
    /// plugin whose manifest asks for isolation is never loaded into a host without isolation settings: it
    /// serves nothing there, and [`Registry::unavailable_for`] says why.
    pub fn served(&self, backend: &str) -> Option<Served> {
        let candidate = &self.candidates[*self.serving.get(backend)?];
        #[cfg(target_os = "linux")]
        if let (Status::Listed, Some(manifest), Some(path), Some(info)) =
            (&candidate.status, &candidate.manifest, &candidate.path, &candidate.info)
        {
            match &self.isolation {
                Some(isolation) if isolation.applies(manifest.isolate) => {
                    return Some(Served::Isolated(crate::isolate::IsolatedPlugin {
                        library: path.clone(),
                        info: info.clone(),
                        isolation: isolation.clone(),
                    }))
                }
                None if manifest.isolate => {
                    let _ = candidate
                        .lazy
                        .set(Err("its manifest asks to run it in a worker process, and this host runs none"
                            .to_owned()));
                    return None;
                }
                _ => {}
            }
        }
        self.for_backend(backend).map(Served::InProcess)
    }

    /// Plugins that offer `backend` but cannot serve it: those that said they cannot run on this machine, and
    /// listed ones that failed to load or disagreed with their manifest: (name, reason).
    pub fn unavailable_for<'r>(&'r self, backend: &'r str) -> impl Iterator<Item = (&'r str, &'r str)> + 'r {
        self.candidates.iter().filter_map(move |c| {
            let info = c.info.as_ref().filter(|info| info.backends.iter().any(|b| b == backend))?;
            match (&c.status, c.load_failure()) {
                (Status::Unavailable(reason), _) => Some((info.name.as_str(), reason.as_str())),
                (Status::Listed, Some(reason)) => Some((info.name.as_str(), reason)),
                _ => None,
            }
        })
    }

    /// The candidate serving `backend`, if any.
    pub fn candidate_for_backend(&self, backend: &str) -> Option<&Candidate> {
        self.serving.get(backend).map(|&i| &self.candidates[i])
    }

    /// Every backend id served, sorted.
    pub fn backends(&self) -> Vec<String> {
        self.serving.keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;
    use std::sync::OnceLock;

    fn dylib_name(stem: &str) -> String {
        format!("{}{stem}{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX)
    }

    /// The built `abi-test` plugin: `$DELEGATE_TEST_PLUGIN_DIR`, else built once into `target/plugin-tests`.
    fn abi_test_plugin() -> &'static Path {
        static PATH: OnceLock<PathBuf> = OnceLock::new();
        PATH.get_or_init(|| {
            let dir = match std::env::var_os("DELEGATE_TEST_PLUGIN_DIR") {
                // Relative to the workspace root (tests run in the crate directory).
                Some(dir) => Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(dir),
                None => {
                    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
                    let target = root.join("target/plugin-tests");
                    let status = Command::new(env!("CARGO"))
                        .current_dir(&root)
                        .args(["build", "--quiet", "-p", "abi-test", "--target-dir"])
                        .arg(&target)
                        .status()
                        .expect("cargo runs");
                    assert!(status.success(), "building abi-test failed");
                    target.join("debug")
                }
            };
            dir.join(dylib_name("abi_test"))
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
        let registry =
            Registry::discover_with(&[dir.path().to_path_buf()], None, true, &HostConfig::default());
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

        let plugin = registry.for_backend("AbiTestBackend").expect("served");
        assert_eq!(plugin.info().name, "abi-test");
        assert!(registry.for_backend("ReferenceBackend").is_some(), "{:?}", registry.backends());
        assert!(registry.for_backend("Nope").is_none());
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
        let registry =
            Registry::discover_with(&[dir.path().to_path_buf()], None, false, &HostConfig::default());
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
            Registry::discover_with(&[first.path().to_path_buf()], Some(&env), false, &HostConfig::default());
        let winner = first.path().join(dylib_name("abi_test_a"));
        assert_eq!(registry.candidates()[0].status, Status::Loaded);
        assert_eq!(registry.candidates()[0].serves, ["AbiTestBackend"]);
        assert_eq!(registry.candidates()[1].status, Status::Shadowed { by: Some(winner.clone()) });
        assert_eq!(registry.candidates()[1].status.to_string(), format!("shadowed by {}", winner.display()));
        assert_eq!(
            registry.for_backend("AbiTestBackend").and_then(|p| p.path().map(Path::to_path_buf)),
            Some(winner)
        );
    }

    #[test]
    fn the_same_file_reached_twice_is_one_candidate_and_missing_dirs_are_reported() {
        let dir = dir_with(&[(&dylib_name("abi_test"), None)]);
        let missing = dir.path().join("does-not-exist");
        let env = std::env::join_paths([dir.path(), missing.as_path()]).expect("joins");
        let registry = Registry::discover_with(
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
        let registry = Registry::discover_with(&[dir.path().to_path_buf()], None, false, &config);
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
        assert_eq!(registry.for_backend("X").map(|p| p.info().name.clone()).as_deref(), Some("V1_10"));
        // The oldest still serves the backend nobody else offers.
        assert_eq!(registry.for_backend("Y").map(|p| p.info().name.clone()).as_deref(), Some("V1_0"));
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
        assert_eq!(registry.for_backend("X").map(|p| p.info().name.clone()).as_deref(), Some("V1_10"));
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
        let reasons: Vec<(&str, &str)> = registry.unavailable_for("AbiTestBackend").collect();
        assert_eq!(
            reasons,
            [("abi-test", "its manifest asks to run it in a worker process, and this host runs none")]
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
        let plugin = registry.for_backend("AbiTestBackend").expect("loads on demand");
        assert_eq!(plugin.info().name, "abi-test");
        assert!(registry.candidates()[0].plugin().is_some(), "kept for the next caller");
        assert!(
            Arc::ptr_eq(&plugin, &registry.for_backend("AbiTestBackend").expect("served")),
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
            assert!(registry.for_backend("AbiTestBackend").is_none());
        }
    }

    #[test]
    fn a_library_that_differs_from_its_manifest_serves_nothing_and_says_why() {
        let dir = dir_with_manifest(|m| m.backends.push("ExtraBackend".into()));
        let registry = discover_manifests(dir.path());
        assert!(registry.for_backend("AbiTestBackend").is_none(), "refused when loaded");
        let reasons: Vec<(&str, &str)> = registry.unavailable_for("AbiTestBackend").collect();
        assert_eq!(
            reasons,
            [("abi-test", "the library disagrees with its manifest: backends: manifest AbiTestBackend,ExtraBackend, library AbiTestBackend")]
        );
        // Probing loads it at once and rejects it for the same reason.
        let probed =
            Registry::discover_with(&[dir.path().to_path_buf()], None, false, &HostConfig::default());
        assert!(
            matches!(&probed.candidates()[0].status, Status::Rejected(r) if r.ends_with("library AbiTestBackend"))
        );
    }

    #[test]
    fn without_a_manifest_a_library_is_listed_and_loaded_only_by_probing() {
        let dir = dir_with(&[(&dylib_name("abi_test"), None)]);
        let registry = discover_manifests(dir.path());
        assert_eq!(registry.candidates()[0].status, Status::NoManifest);
        assert!(registry.for_backend("AbiTestBackend").is_none());
        let probed =
            Registry::discover_with(&[dir.path().to_path_buf()], None, false, &HostConfig::default());
        assert_eq!(probed.candidates()[0].status, Status::Loaded);
    }
}
