//! The candidates discovery finds: what became of each ([`Status`]), and how a library is listed from its
//! manifest, verified and loaded (now by a probe, or on first use).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use delegate_abi::host::{HostConfig, Plugin};
use delegate_abi::{MemoryKind, PluginInfo, WireFormatSupport};

use crate::plugins::library::manifest::PluginManifest;
use crate::plugins::library::{load_checked, verify};

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
        /// The winner's path; `None` when the winner is an embedded plugin.
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

/// One library considered by discovery, or a plugin embedded with
/// [`Registry::with_embedded`](super::Registry::with_embedded).
#[derive(Debug, Clone)]
pub struct Candidate {
    /// The file; `None` for an embedded plugin.
    pub path: Option<PathBuf>,
    /// What became of it.
    pub status: Status,
    /// Its metadata, when the handshake succeeded (or what its manifest says, for one not loaded).
    pub info: Option<PluginInfo>,
    /// The negotiated ABI version, when the handshake succeeded.
    pub abi_version: Option<u32>,
    /// Backend ids it serves (a subset of `info.backends`; empty unless loaded or listed), as decided at
    /// discovery; [`Registry::candidate_for_backend`](super::Registry::candidate_for_backend) says who serves
    /// now.
    pub serves: Vec<String>,
    /// Its manifest, when it has one.
    pub manifest: Option<PluginManifest>,
    pub(super) plugin: Option<Arc<Plugin>>,
    /// A listed candidate's library, once something asked for it: the plugin, or why it cannot serve.
    pub(super) lazy: Arc<OnceLock<Result<Arc<Plugin>, String>>>,
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
    pub(super) fn version(&self) -> Option<semver::Version> {
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

    pub(super) fn rejected(path: Option<PathBuf>, reason: String) -> Candidate {
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
    pub(super) fn listed(path: PathBuf, manifest: PluginManifest) -> Candidate {
        let mut info = PluginInfo::new(&manifest.name, &manifest.version)
            .with_memory_kinds(
                MemoryKind::ALL.into_iter().filter(|k| manifest.memory_kinds.iter().any(|m| m == k.name())),
            )
            .with_binds_aliases_in_place(manifest.binds_aliases_in_place)
            .with_capabilities(manifest.capabilities.to_capabilities());
        info.backends = manifest.backends.clone();
        info.wire_formats =
            manifest.wire_formats.iter().map(|w| WireFormatSupport::new(&w.format, &w.versions)).collect();
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
    pub(super) fn refused(path: PathBuf, manifest: PluginManifest, reason: String) -> Candidate {
        Candidate { status: Status::Rejected(reason), ..Candidate::listed(path, manifest) }
    }

    pub(super) fn no_manifest(path: PathBuf) -> Candidate {
        Candidate { status: Status::NoManifest, ..Candidate::rejected(Some(path), String::new()) }
    }

    /// Loads a library now: verified against its manifest first when it has one.
    pub(super) fn load(path: PathBuf, manifest: Option<PluginManifest>, config: &HostConfig) -> Candidate {
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
    pub(super) fn load_listed(&self, config: &HostConfig) -> Option<Arc<Plugin>> {
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
    pub(super) fn refuse_listed(&self, reason: &str) {
        if self.lazy.set(Err(reason.to_owned())).is_ok() {
            tracing::warn!(path = %self.location(), "plugin passed over, the next candidate serves: {reason}");
        }
    }

    pub(super) fn loaded(path: Option<PathBuf>, plugin: Plugin) -> Candidate {
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
    pub(super) fn usable(&self) -> Option<&PluginInfo> {
        match self.status {
            Status::Unavailable(_) | Status::Rejected(_) | Status::NoManifest => None,
            Status::Listed => self.info.as_ref(),
            _ => self.plugin.as_ref().map(|p| p.info()),
        }
    }

    /// Whether it is a library known from its (verified) manifest and not loaded by discovery: listed, or
    /// listed and shadowed by a better candidate. It loads on first use.
    pub(super) fn is_lazy(&self) -> bool {
        self.path.is_some()
            && self.plugin.is_none()
            && self.manifest.is_some()
            && matches!(self.status, Status::Listed | Status::Shadowed { .. })
    }

    /// Whether it has failed to serve since discovery (a listed one that could not load, or was refused).
    pub(super) fn failed(&self) -> bool {
        self.load_failure().is_some()
    }
}

pub(super) fn is_library(path: &Path) -> bool {
    path.extension().is_some_and(|ext| ext == std::env::consts::DLL_EXTENSION)
}

/// A library with a manifest, discovered without loading: refused when its ABI range misses the host's or
/// its bytes differ from the manifest's hash; otherwise listed (verified).
pub(super) fn from_manifest(path: PathBuf, manifest: PluginManifest, config: &HostConfig) -> Candidate {
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
