//! The registry, the top floor of the plugin code: [`Discovery`] of candidate libraries, [`Registry`] ranking
//! them per backend, and [`Served`], where the serving plugin runs (in this process or isolated).

use std::collections::{BTreeMap, HashSet};
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;

use delegate_abi::abi::DelegateRootRef;
use delegate_abi::host::{HostConfig, Plugin};

use super::isolate::Isolation;
use super::library::manifest_of;

mod candidate;
mod serve;
#[cfg(test)]
mod tests;

use candidate::{from_manifest, is_library};
pub use candidate::{Candidate, Status};
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
    isolation: Option<Isolation>,
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
    /// ([`Isolation::all`](crate::plugins::isolate::Isolation::all)) or those whose manifest asks for it. Only plugins
    /// known from a manifest and not loaded yet can be isolated; embedded plugins always run here, and a
    /// library a probe loaded into this process is refused when `all` asks to isolate it. Without it, a
    /// plugin whose manifest asks for isolation serves nothing, and says why.
    pub fn isolation(mut self, isolation: Isolation) -> Discovery {
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
    isolation: Option<Arc<Isolation>>,
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
        Registry::from_candidates(candidates, options.config).isolated_by(options.isolation.map(Arc::new))
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
        Registry::from_candidates(candidates, self.config).isolated_by(self.isolation)
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
        Registry { candidates, serving, config, isolation: None }
    }

    /// This registry with plugins run in worker processes as `isolation` says (`None`: every one here).
    fn isolated_by(mut self, isolation: Option<Arc<Isolation>>) -> Registry {
        self.isolation = isolation;
        self
    }

    /// Every candidate, in search order (embedded last).
    pub fn candidates(&self) -> &[Candidate] {
        &self.candidates
    }
}
