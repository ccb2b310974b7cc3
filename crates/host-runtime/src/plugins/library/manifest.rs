//! Plugin manifests: a small JSON file next to each plugin library saying what the library is, so that
//! discovery can list plugins and pick the one a backend needs without loading any library (as the Vulkan
//! loader reads its ICD JSON files).
//!
//! A library's code runs as soon as the dynamic loader opens it (its constructors), so a library that aborts,
//! crashes, sleeps or exits on load takes the host with it. With manifests, `delegate-host plugins` reads files
//! only, and a program loads only the libraries its backends need; a library without a manifest is listed as
//! such and loaded only when the caller asks to probe.
//!
//! The manifest of `libfoo.so` is `libfoo.plugin.json` in the same directory:
//!
//! ```json
//! {
//!   "manifest_version": 1,
//!   "library": "libfoo.so",
//!   "sha256": "9f86d0…",
//!   "name": "foo-delegate",
//!   "version": "0.3.1",
//!   "abi": { "min": 1, "max": 1 },
//!   "backends": ["FooBackend"],
//!   "wire_formats": [{ "format": "native", "versions": ">=1.0, <2" }],
//!   "memory_kinds": ["host", "pinned"],
//!   "binds_aliases_in_place": true,
//!   "target": "x86_64-linux",
//!   "rustc": "rustc version 1.95.0 (59807616e 2026-04-14)",
//!   "capabilities": {
//!     "in_place_memory_kinds": ["host", "pinned"],
//!     "caller_stream": false,
//!     "cuda_graph_capturable": false,
//!     "device_positions": false,
//!     "rewind_fork_without_reinit": true,
//!     "max_positions": 0
//!   },
//!   "isolate": true
//! }
//! ```
//!
//! `capabilities` is the library's [`delegate_abi::Capabilities`], added after release 0.1.0: a manifest
//! without it (or without one of its keys) reads as the defaults, which is what a library built before them
//! states; `in_place_memory_kinds` absent means "not stated". A manifest whose capabilities differ from the
//! library's is a mismatch like any other (the library is rejected, each difference named).
//!
//! `isolate` (optional, default `false`) asks hosts to run the library in a worker process
//! ([`crate::isolate`]). It is written from the built library, never by hand: `delegate-host plugin-manifest LIB` loads the library
//! once and writes what it says about itself plus the file's SHA-256 (`cargo xtask` does this for the plugins
//! it builds). Discovery hashes every library it lists and rejects one whose bytes differ from its manifest
//! without running any of its code (`rejected: sha256: ...`, naming the command that writes the manifest
//! again: a rebuilt library needs its manifest rewritten). When the host does load a library, it loads exactly
//! the bytes it hashed and compares the library's self-description with its manifest; a library that differs
//! is rejected with every difference named, and the next candidate for its backend serves.

use std::path::{Path, PathBuf};

use delegate_abi::host::Plugin;
use delegate_abi::{Capabilities, MemoryKind};
use serde::{Deserialize, Serialize};

/// The manifest format this build writes and reads.
pub const MANIFEST_VERSION: u32 = 1;
/// The file-name suffix replacing the library's extension.
pub const MANIFEST_SUFFIX: &str = ".plugin.json";
/// Manifests are small; anything larger is refused unread.
pub const MAX_MANIFEST_BYTES: u64 = 64 << 10;

/// What a plugin library is, as its manifest records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginManifest {
    /// [`MANIFEST_VERSION`].
    pub manifest_version: u32,
    /// The library's file name (in the manifest's directory).
    pub library: String,
    /// SHA-256 of the library file, lowercase hex.
    pub sha256: String,
    /// The plugin's name.
    pub name: String,
    /// The plugin's version (semver).
    pub version: String,
    /// The ABI versions the plugin speaks.
    pub abi: AbiSpan,
    /// Backend ids it serves.
    pub backends: Vec<String>,
    /// Wire formats and version ranges it reads.
    pub wire_formats: Vec<WireFormat>,
    /// Memory kinds it accepts (`host`, `pinned`, `managed`, `device`).
    pub memory_kinds: Vec<String>,
    /// Whether it binds aliased outputs in place.
    pub binds_aliases_in_place: bool,
    /// The machine it was built for: `<arch>-<os>` (e.g. `x86_64-linux`).
    pub target: String,
    /// The compiler that built the library, as it records itself in the library (ELF `.comment`:
    /// `rustc version 1.95.0 (…)`); absent when the library records none, and in older manifests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rustc: Option<String>,
    /// What the library states it can do; the defaults in manifests written before capabilities existed.
    #[serde(default)]
    pub capabilities: ManifestCapabilities,
    /// Whether a host runs this plugin in a worker process of its own (see [`crate::isolate`]): the
    /// deployer's choice for a library it does not trust to stay up, written with `delegate-host
    /// plugin-manifest --isolate`. Not part of the library's self-description.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub isolate: bool,
}

/// An ABI version range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AbiSpan {
    /// Oldest version spoken.
    pub min: u32,
    /// Newest version spoken.
    pub max: u32,
}

/// A wire format and the versions read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireFormat {
    /// Format name, e.g. `native`.
    pub format: String,
    /// Semver requirement on the format's version.
    pub versions: String,
}

/// [`delegate_abi::Capabilities`] as a manifest spells them: memory kinds by name, every key optional (a
/// missing one reads as the default).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ManifestCapabilities {
    /// Memory kinds updated in place, by name; absent: not stated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_place_memory_kinds: Option<Vec<String>>,
    /// Queues its work on the caller's stream.
    pub caller_stream: bool,
    /// Can be captured into a CUDA graph.
    pub cuda_graph_capturable: bool,
    /// Reads positions from device memory.
    pub device_positions: bool,
    /// Rewinds and forks without a new `init`.
    pub rewind_fork_without_reinit: bool,
    /// The most positions it supports; `0`: no limit stated.
    pub max_positions: u64,
}

impl From<&Capabilities> for ManifestCapabilities {
    fn from(c: &Capabilities) -> ManifestCapabilities {
        ManifestCapabilities {
            in_place_memory_kinds: c
                .in_place_memory_kinds
                .as_ref()
                .map(|kinds| kinds.iter().map(|k| k.name().to_owned()).collect()),
            caller_stream: c.caller_stream,
            cuda_graph_capturable: c.cuda_graph_capturable,
            device_positions: c.device_positions,
            rewind_fork_without_reinit: c.rewind_fork_without_reinit,
            max_positions: c.max_positions,
        }
    }
}

impl ManifestCapabilities {
    /// As the ABI states them; a memory-kind name this build does not know is skipped (the host never
    /// passes memory of that kind).
    pub fn to_capabilities(&self) -> Capabilities {
        let mut capabilities = Capabilities::default()
            .with_caller_stream(self.caller_stream)
            .with_cuda_graph_capturable(self.cuda_graph_capturable)
            .with_device_positions(self.device_positions)
            .with_rewind_fork_without_reinit(self.rewind_fork_without_reinit)
            .with_max_positions(self.max_positions);
        capabilities.in_place_memory_kinds = self
            .in_place_memory_kinds
            .as_ref()
            .map(|names| names.iter().filter_map(|n| MemoryKind::from_name(n)).collect());
        capabilities
    }

    /// Each capability as `(key, value)`, for naming differences.
    fn fields(&self) -> [(&'static str, String); 6] {
        let kinds = self
            .in_place_memory_kinds
            .as_ref()
            .map_or("(not stated)".into(), |k| format!("[{}]", k.join(",")));
        [
            ("in_place_memory_kinds", kinds),
            ("caller_stream", self.caller_stream.to_string()),
            ("cuda_graph_capturable", self.cuda_graph_capturable.to_string()),
            ("device_positions", self.device_positions.to_string()),
            ("rewind_fork_without_reinit", self.rewind_fork_without_reinit.to_string()),
            ("max_positions", self.max_positions.to_string()),
        ]
    }
}

/// Why a manifest could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ManifestError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The manifest.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not a manifest this build reads.
    #[error("{path}: {problem}")]
    Invalid {
        /// The manifest.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
}

/// The machine this build runs on, as manifests spell `target`.
pub fn host_target() -> String {
    format!("{}-{}", std::env::consts::ARCH, std::env::consts::OS)
}

impl PluginManifest {
    /// Where the manifest of `library` lives: `libfoo.so` -> `libfoo.plugin.json`.
    pub fn path_for(library: &Path) -> PathBuf {
        let stem = library.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        library.with_file_name(format!("{stem}{MANIFEST_SUFFIX}"))
    }

    /// The manifest of a loaded plugin and its library file.
    ///
    /// # Errors
    /// The library file cannot be read (to hash it).
    pub fn describe(plugin: &Plugin, library: &Path) -> std::io::Result<PluginManifest> {
        Ok(PluginManifest::describe_loaded(plugin, library, sha256_file(library)?))
    }

    /// The manifest of a loaded plugin whose library's bytes hashed to `sha256` (the bytes that were loaded;
    /// see [`crate::plugins::describe_library`]).
    pub fn describe_loaded(plugin: &Plugin, library: &Path, sha256: String) -> PluginManifest {
        let info = plugin.info();
        let abi = plugin.abi_range();
        PluginManifest {
            manifest_version: MANIFEST_VERSION,
            library: library.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
            sha256,
            name: info.name.clone(),
            version: info.version.clone(),
            abi: AbiSpan { min: abi.min, max: abi.max },
            backends: info.backends.clone(),
            wire_formats: info
                .wire_formats
                .iter()
                .map(|w| WireFormat { format: w.format.clone(), versions: w.versions.clone() })
                .collect(),
            memory_kinds: info.memory_kinds.iter().map(|k| k.name().to_owned()).collect(),
            binds_aliases_in_place: info.binds_aliases_in_place,
            target: host_target(),
            rustc: rustc_version(library),
            capabilities: ManifestCapabilities::from(&info.capabilities),
            isolate: false,
        }
    }

    /// Reads and checks a manifest: a regular file of at most [`MAX_MANIFEST_BYTES`], of a version this build
    /// reads, for this machine, naming a library file without a directory, with a semver version.
    ///
    /// # Errors
    /// [`ManifestError`] naming the file and the problem.
    pub fn read(path: &Path) -> Result<PluginManifest, ManifestError> {
        let io = |source| ManifestError::Io { path: path.to_owned(), source };
        let invalid = |problem: String| ManifestError::Invalid { path: path.to_owned(), problem };
        // One non-blocking open, checked through its descriptor: a FIFO swapped in cannot block discovery.
        let text =
            crate::blob_file::read_prefix(path, MAX_MANIFEST_BYTES + 1).map_err(|err| match err.kind() {
                std::io::ErrorKind::InvalidInput => invalid(err.to_string()),
                _ => io(err),
            })?;
        if text.len() as u64 > MAX_MANIFEST_BYTES {
            return Err(invalid(format!("more than the {MAX_MANIFEST_BYTES} bytes a manifest may have")));
        }
        let manifest: PluginManifest =
            serde_json::from_slice(&text).map_err(|err| invalid(format!("not a plugin manifest: {err}")))?;
        if manifest.manifest_version != MANIFEST_VERSION {
            return Err(invalid(format!(
                "manifest version {} (this build reads {MANIFEST_VERSION})",
                manifest.manifest_version
            )));
        }
        if manifest.target != host_target() {
            return Err(invalid(format!("built for {}, this machine is {}", manifest.target, host_target())));
        }
        if manifest.library.is_empty()
            || Path::new(&manifest.library).file_name() != Some(manifest.library.as_ref())
        {
            return Err(invalid(format!(
                "library '{}' must be a file name in the manifest's directory",
                manifest.library
            )));
        }
        if semver::Version::parse(&manifest.version).is_err() {
            return Err(invalid(format!("version '{}' is not semver", manifest.version)));
        }
        Ok(manifest)
    }

    /// The library this manifest describes, next to `manifest_path`.
    pub fn library_path(&self, manifest_path: &Path) -> PathBuf {
        manifest_path.with_file_name(&self.library)
    }

    /// The version, parsed ([`PluginManifest::read`] checked it).
    pub fn semver(&self) -> semver::Version {
        semver::Version::parse(&self.version).unwrap_or_else(|_| semver::Version::new(0, 0, 0))
    }

    /// Every field where `loaded` (what the library says now) differs from this manifest, one phrase each
    /// (`version: manifest 0.1.0, library 0.2.0`); empty when they agree.
    pub fn differences(&self, loaded: &PluginManifest) -> Vec<String> {
        let mut out = Vec::new();
        let mut field = |name: &str, ours: String, theirs: String| {
            if ours != theirs {
                out.push(format!("{name}: manifest {ours}, library {theirs}"));
            }
        };
        field("sha256", self.sha256.clone(), loaded.sha256.clone());
        field("name", self.name.clone(), loaded.name.clone());
        field("version", self.version.clone(), loaded.version.clone());
        field(
            "abi",
            format!("{}..={}", self.abi.min, self.abi.max),
            format!("{}..={}", loaded.abi.min, loaded.abi.max),
        );
        field("backends", self.backends.join(","), loaded.backends.join(","));
        let formats = |w: &[WireFormat]| {
            w.iter().map(|w| format!("{} {}", w.format, w.versions)).collect::<Vec<_>>().join("; ")
        };
        field("wire_formats", formats(&self.wire_formats), formats(&loaded.wire_formats));
        field("memory_kinds", self.memory_kinds.join(","), loaded.memory_kinds.join(","));
        field(
            "binds_aliases_in_place",
            self.binds_aliases_in_place.to_string(),
            loaded.binds_aliases_in_place.to_string(),
        );
        for ((key, ours), (_, theirs)) in
            self.capabilities.fields().into_iter().zip(loaded.capabilities.fields())
        {
            field(&format!("capabilities.{key}"), ours, theirs);
        }
        out
    }

    /// The manifest as pretty JSON with a trailing newline.
    pub fn to_json(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).unwrap_or_default();
        text.push('\n');
        text
    }
}

/// The rustc version a library records about itself: the `rustc version …` entry of its ELF `.comment`
/// section. `None` for other object formats, a library without one, or one that cannot be read.
pub fn rustc_version(library: &Path) -> Option<String> {
    use object::{Object, ObjectSection};
    let bytes = std::fs::read(library).ok()?;
    let file = object::File::parse(bytes.as_slice()).ok()?;
    let comment = file.section_by_name(".comment")?.data().ok()?;
    comment
        .split(|&b| b == 0)
        .filter_map(|entry| std::str::from_utf8(entry).ok())
        .find(|entry| entry.starts_with("rustc version "))
        .map(str::to_owned)
}

/// SHA-256 of a regular file, lowercase hex: the hash discovery and loading compare with a manifest's.
///
/// # Errors
/// The file cannot be opened or read, or is not a regular file (the reason).
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    super::verify::sha256(path).map_err(std::io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rustc_version_is_read_from_the_library_and_optional_in_the_file() {
        // This test executable was built by rustc, which records itself in `.comment` (ELF).
        let exe = std::env::current_exe().expect("test executable");
        if cfg!(target_os = "linux") {
            let rustc = rustc_version(&exe).expect("an ELF built by rustc records its version");
            assert!(rustc.starts_with("rustc version 1."), "{rustc}");
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let not_a_library = dir.path().join("libnot.so");
        std::fs::write(&not_a_library, b"not an object file").expect("write");
        assert_eq!(rustc_version(&not_a_library), None);

        // A manifest written before `rustc` existed still reads; one without it writes no `rustc` key.
        let old = format!(
            r#"{{"manifest_version": 1, "library": "libfoo.so", "sha256": "00", "name": "foo", "version": "0.1.0",
                "abi": {{"min": 1, "max": 1}}, "backends": ["Foo"], "wire_formats": [], "memory_kinds": ["host"],
                "binds_aliases_in_place": false, "target": "{}"}}"#,
            host_target()
        );
        let path = dir.path().join("libfoo.plugin.json");
        std::fs::write(&path, old).expect("write");
        let manifest = PluginManifest::read(&path).expect("an older manifest reads");
        assert_eq!(manifest.rustc, None);
        // Written before capabilities: the defaults, which is what a library of that age states.
        assert_eq!(manifest.capabilities, ManifestCapabilities::default());
        assert_eq!(manifest.capabilities.to_capabilities(), Capabilities::default());
        assert!(!manifest.to_json().contains("rustc"));
        let with = PluginManifest { rustc: Some("rustc version 1.95.0".into()), ..manifest };
        assert!(with.to_json().contains(r#""rustc": "rustc version 1.95.0""#));
    }
}
