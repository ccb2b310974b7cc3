//! The bundles: per plugin `<crate>-<version>-<target>.tar.gz` holding the library, its manifest (written by
//! the host just built, from the library itself), a generated README and `SHA256SUMS`; the host bundle holds
//! the binary, a README, the docs a third-party plugin author needs (generated from the crate docs) and
//! `SHA256SUMS`. Then `dist-manifest.json` lists them all.

use std::path::Path;

use anyhow::Context;
use host_runtime::plugin_manifest::PluginManifest;

use super::archive::{self, Entry};
use super::build::Built;
use super::docs::{host_docs, host_readme, plugin_readme};
use super::manifest::{
    epoch_for, head_commit, rustc_info, Artifact, DistManifest, Epoch, HostAbi, DIST_MANIFEST,
    DIST_MANIFEST_VERSION,
};
use super::{PluginCrate, HOST};
use crate::release::record::Record;
use crate::release::workspace::Workspace;
use crate::util::{dylib_name, write_plugin_manifests};

/// Writes the bundles of `built` and `dist-manifest.json` into `out` (replacing what an earlier dist left
/// there). The plugin manifests are written by the host just built, from copies of the libraries in a
/// staging directory under `out`, which is removed afterwards.
pub fn assemble(root: &Path, built: &Built, out: &Path) -> anyhow::Result<DistManifest> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let sources = Sources::load(root)?;
    let staging = tempfile::Builder::new().prefix(".staging").tempdir_in(out)?;
    let mut artifacts = Vec::new();
    for plugin in &built.plugins {
        let bundle = plugin_bundle(&sources, built, plugin, staging.path())?;
        artifacts.push(bundle.write(out)?);
    }
    artifacts.push(host_bundle(&sources, built)?.write(out)?);
    drop(staging);

    let Sources { commit, target, rustc, .. } = sources;
    let manifest = DistManifest { dist_version: DIST_MANIFEST_VERSION, commit, target, rustc, artifacts };
    let mut json = serde_json::to_string_pretty(&manifest)?;
    json.push('\n');
    std::fs::write(out.join(DIST_MANIFEST), json)?;
    Ok(manifest)
}

/// What every bundle of one dist is made from besides the binaries: the workspace's versions and
/// descriptions, the release record (for the epochs), the commit and the toolchain.
struct Sources<'a> {
    root: &'a Path,
    workspace: Workspace,
    record: Record,
    /// The HEAD commit (`+dirty` when the tree differs from it).
    commit: String,
    /// The HEAD commit's committer time: the epoch of an unreleased version without `SOURCE_DATE_EPOCH`.
    head_time: u64,
    /// The target triple built for.
    target: String,
    /// `rustc -V`.
    rustc: String,
    source_date_epoch: Option<String>,
}

impl<'a> Sources<'a> {
    fn load(root: &'a Path) -> anyhow::Result<Sources<'a>> {
        let (commit, head_time) = head_commit(root)?;
        let (target, rustc) = rustc_info()?;
        Ok(Sources {
            root,
            workspace: Workspace::load(root)?,
            record: Record::load(root)?,
            commit,
            head_time,
            target,
            rustc,
            source_date_epoch: std::env::var("SOURCE_DATE_EPOCH").ok(),
        })
    }

    /// `krate`'s version in the workspace.
    fn version_of(&self, krate: &str) -> anyhow::Result<semver::Version> {
        let found = self.workspace.crates.get(krate);
        Ok(found.with_context(|| format!("no crate {krate} in the workspace"))?.version.clone())
    }

    /// `krate`'s `package.description`, empty when it has none.
    fn description_of(&self, krate: &str) -> String {
        let Some(c) = self.workspace.crates.get(krate) else { return String::new() };
        let text = std::fs::read_to_string(self.root.join(&c.dir).join("Cargo.toml")).unwrap_or_default();
        let value: toml::Value = toml::from_str(&text).unwrap_or(toml::Value::Table(Default::default()));
        let description = value.get("package").and_then(|p| p.get("description")).and_then(|d| d.as_str());
        description.unwrap_or("").to_owned()
    }

    /// The mtime of `krate`'s bundle at `version` (see [`epoch_for`]).
    fn epoch(&self, krate: &str, version: &semver::Version) -> anyhow::Result<Epoch> {
        epoch_for(&self.record, krate, version, self.source_date_epoch.as_deref(), self.head_time)
    }
}

/// One plugin's bundle: its library copied into `staging/<stem>`, where the host just built writes the
/// manifest from it, as discovery will read it.
fn plugin_bundle(
    sources: &Sources,
    built: &Built,
    plugin: &PluginCrate,
    staging: &Path,
) -> anyhow::Result<Bundle> {
    let version = sources.version_of(plugin.krate)?;
    let library = dylib_name(plugin.stem);
    let dir = staging.join(plugin.stem);
    std::fs::create_dir_all(&dir)?;
    std::fs::copy(built.release_dir.join(&library), dir.join(&library))
        .with_context(|| format!("copying {library}"))?;
    write_plugin_manifests(&dir, &built.host(), &[plugin.stem], |cmd| {
        if let Some(trt) = &built.trt {
            trt.apply(cmd);
        }
    })?;
    let manifest_path = PluginManifest::path_for(&dir.join(&library));
    let manifest = PluginManifest::read(&manifest_path).map_err(anyhow::Error::from)?;
    let manifest_name = manifest_path.file_name().context("manifest name")?.to_string_lossy().into_owned();
    let readme = plugin_readme(
        plugin,
        &version,
        &sources.target,
        &manifest,
        &sources.description_of(plugin.krate),
        &sources.commit,
    );
    let entries = vec![
        Entry::executable(library.clone(), std::fs::read(dir.join(&library))?),
        Entry::file(manifest_name, std::fs::read(&manifest_path)?),
        Entry::file("README.md", readme),
    ];
    Ok(Bundle {
        top: format!("{}-{version}-{}", plugin.krate, sources.target),
        entries,
        epoch: sources.epoch(plugin.krate, &version)?,
        kind: "plugin",
        krate: plugin.krate,
        version,
        plugin: Some(manifest),
        host: None,
    })
}

/// The host's bundle: the binary, its README and the plugin author's docs.
fn host_bundle(sources: &Sources, built: &Built) -> anyhow::Result<Bundle> {
    let version = sources.version_of(HOST)?;
    let host_abi = HostAbi {
        abi_min: delegate_abi::abi::ABI_VERSION_MIN,
        abi_max: delegate_abi::abi::ABI_VERSION_MAX,
        root_interface_version: delegate_abi::abi::ROOT_INTERFACE_VERSION.to_owned(),
    };
    let mut entries = vec![
        Entry::executable(format!("{HOST}{}", std::env::consts::EXE_SUFFIX), std::fs::read(built.host())?),
        Entry::file("README.md", host_readme(&version, &sources.target, &host_abi, &sources.commit)),
    ];
    entries.extend(host_docs(sources.root)?);
    Ok(Bundle {
        top: format!("{HOST}-{version}-{}", sources.target),
        entries,
        epoch: sources.epoch(HOST, &version)?,
        kind: "host",
        krate: HOST,
        version,
        plugin: None,
        host: Some(host_abi),
    })
}

/// One archive before it is written: its files and the [`Artifact`] fields that do not come from its bytes.
struct Bundle {
    /// The archive's top directory, and its name without `.tar.gz`.
    top: String,
    entries: Vec<Entry>,
    epoch: Epoch,
    /// `plugin` or `host`.
    kind: &'static str,
    krate: &'static str,
    version: semver::Version,
    plugin: Option<PluginManifest>,
    host: Option<HostAbi>,
}

impl Bundle {
    /// Adds `SHA256SUMS`, writes `<top>.tar.gz` into `out` and describes it.
    fn write(self, out: &Path) -> anyhow::Result<Artifact> {
        let Bundle { top, mut entries, epoch, kind, krate, version, plugin, host } = self;
        let sums = archive::sha256sums(&entries);
        entries.push(Entry::file("SHA256SUMS", sums));
        let files = entries.iter().map(|e| (e.path.clone(), archive::sha256_hex(&e.bytes))).collect();
        let bytes = archive::tar_gz(&top, &entries, epoch.seconds)?;
        let name = format!("{top}.tar.gz");
        std::fs::write(out.join(&name), &bytes).with_context(|| format!("writing {name}"))?;
        Ok(Artifact {
            name,
            kind: kind.to_owned(),
            krate: krate.to_owned(),
            version: version.to_string(),
            sha256: archive::sha256_hex(&bytes),
            epoch,
            files,
            plugin,
            host,
        })
    }
}
