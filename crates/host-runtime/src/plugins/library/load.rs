//! Loading a plugin library: its bytes read once, checked against its manifest before the loader sees them,
//! and its self-description compared with the manifest.

use std::path::Path;

use delegate_abi::host::{HostConfig, Plugin};

use super::manifest::PluginManifest;
use super::verify;

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

/// The manifest next to the library at `path`, if there is one; an unreadable one, or one describing
/// another library, is the library's rejection reason.
pub(crate) fn manifest_of(path: &Path) -> Result<Option<PluginManifest>, String> {
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
