//! `cargo xtask compat`: the compatibility gate a release must pass.
//!
//! 1. Blobs ([`golden`]): every golden blob of every wire-format version still reads, to the same model
//!    (blob-format's `golden_models` snapshots and `native` tests), and every golden blob a recorded
//!    blob-format release had is still committed, byte for byte.
//! 2. Plugins across releases: every kept release's bundles (`fixtures/releases/<version>/`, as `cargo xtask
//!    dist --out` wrote them: 0.1.0 and 0.2.0 today) are unpacked, and for each ([`kept_releases`]): the new
//!    host lists their manifests and loads (`--probe`) every old plugin whose ABI range overlaps its own; the
//!    old host (from its bundle) loads every new plugin whose range overlaps the old host's; every old plugin
//!    the new host loads shows the capabilities its manifest records (a plugin built before capabilities
//!    existed: the defaults).
//! 3. Libraries: every plugin library (new and of each kept release) exports exactly the entry symbol; its root
//!    interface version equals each kept release's (and delegate-abi's); a changed ABI or wire-format range
//!    since a kept release needs a changelog entry ([`changelog`] states the rule).
//!
//! 4. Sources ([`sources`]): the plugin and embedder sources written from each release's docs
//!    (`xtask/compat-sources/<version>/`) build against today's crates.
//!
//! Without release fixtures, step 2 runs the new host against the new plugins only and says so.

pub mod changelog;
pub mod golden;
pub mod sources;
pub mod symbols;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};
use host_runtime::plugin_manifest::{AbiSpan, ManifestCapabilities, PluginManifest};
use serde_json::Value;

use crate::dist::{self, archive, DistManifest, PluginCrate, HOST, PLUGINS};
use crate::release::workspace::Workspace;

/// Where earlier releases' bundles are kept: `fixtures/releases/<version>/` (a `dist-manifest.json` and its
/// archives).
pub const FIXTURES: &str = "fixtures/releases";

/// `cargo xtask compat`. `dist_dir` holds this tree's bundles (a `cargo xtask dist --out` directory); `None`
/// builds them first (into `<target>/dist/bundles`).
pub fn run(root: &Path, dist_dir: Option<&Path>, tensorrt: bool) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    golden::check(root)?;
    sources::check(root)?;
    let dist_dir = match dist_dir {
        Some(dir) => dir.to_path_buf(),
        None => {
            let out = dist::dist_target_dir(root)?.join("bundles");
            dist::run(root, &dist::Options { out: out.clone(), tensorrt })?;
            out
        }
    };
    let new = DistManifest::load(&dist_dir)?;
    let scratch = tempfile::Builder::new().prefix("compat").tempdir()?;
    let new_set = Unpacked::new(&dist_dir, &new, &scratch.path().join("new"))?;
    check_libraries(&new_set.plugins, "this build's")?;
    let new_host = new_set.host.clone().context("this dist has no host bundle")?;
    // The new plugins in the new host: the baseline every older host is compared with.
    expect_loaded(&new_host, new_span(), &new_set.plugins, "the new host", "new")?;

    let kept = kept_releases(root)?;
    if kept.is_empty() {
        eprintln!(
            "compat: no release fixtures under {FIXTURES}/ yet: old plugins in the new host, new plugins in the \
             old host and the ABI/wire-format changelog rule are skipped. After recording a release, keep its \
             bundles with `cargo xtask dist --out {FIXTURES}/<version>` (e.g. {FIXTURES}/0.1.0) and commit them."
        );
        eprintln!("compat: passed ({:.0?})", started.elapsed());
        return Ok(());
    }
    let workspace = Workspace::load(root)?;
    let mut problems = Vec::new();
    for (version, dir) in &kept {
        let into = scratch.path().join(version.to_string());
        problems.extend(check_release(root, &workspace, version, dir, &into, &new_set)?);
    }
    if !problems.is_empty() {
        bail!("compat: {}", problems.join("\n  "));
    }
    let list: Vec<String> = kept.iter().map(|(v, _)| v.to_string()).collect();
    eprintln!("compat: passed against releases {} ({:.0?})", list.join(", "), started.elapsed());
    Ok(())
}

/// The gate against one kept release (`version`'s bundles in `dir`, unpacked into `into`): its plugins in the
/// new host with the capabilities they record, the new plugins in its host, one entry symbol and the permanent
/// root interface version, and the changelog rule since it. Returns the changelog rule's problems (and
/// plugins the new dist lacks); fails at once on the rest.
fn check_release(
    root: &Path,
    workspace: &Workspace,
    version: &semver::Version,
    dir: &Path,
    into: &Path,
    new_set: &Unpacked,
) -> anyhow::Result<Vec<String>> {
    eprintln!("compat: release {version} ({})", dir.display());
    let new_host = new_set.host.clone().context("this dist has no host bundle")?;
    let old = DistManifest::load(dir)?;
    let old_set = Unpacked::new(dir, &old, into)?;
    check_libraries(&old_set.plugins, &format!("release {version}'s"))?;
    if let Some(host) = old.artifacts.iter().find_map(|a| a.host.as_ref()) {
        anyhow::ensure!(
            host.root_interface_version == delegate_abi::abi::ROOT_INTERFACE_VERSION,
            "the root interface version changed: release {version}'s host has {}, this build has {}",
            host.root_interface_version,
            delegate_abi::abi::ROOT_INTERFACE_VERSION
        );
    }
    // Old plugins in the new host, with the capabilities they state (the defaults for plugins built before
    // capabilities were appended to the ABI).
    expect_listed(&new_host, &old_set.plugins)?;
    expect_loaded(&new_host, new_span(), &old_set.plugins, "the new host", &format!("release {version}'s"))?;
    expect_capabilities(&new_host, &old_set.plugins, &format!("release {version}'s"))?;
    // New plugins in the old host.
    let old_host = old_set.host.clone().with_context(|| format!("release {version} has no host bundle"))?;
    let old_span = old
        .artifacts
        .iter()
        .find_map(|a| a.host.as_ref())
        .map(|h| AbiSpan { min: h.abi_min, max: h.abi_max })
        .with_context(|| {
            format!("release {version}'s dist-manifest.json does not say which ABI versions its host speaks")
        })?;
    expect_loaded(&old_host, old_span, &new_set.plugins, &format!("release {version}'s host"), "new")?;
    Ok(changelog_problems(root, workspace, version, &old_set, new_set))
}

/// The changelog rule for every new plugin against its `version` bundle, and every plugin of that release the
/// new dist lacks.
fn changelog_problems(
    root: &Path,
    workspace: &Workspace,
    version: &semver::Version,
    old_set: &Unpacked,
    new_set: &Unpacked,
) -> Vec<String> {
    let mut problems = Vec::new();
    for new_plugin in &new_set.plugins {
        let Some(old_plugin) = old_set.plugins.iter().find(|p| p.krate == new_plugin.krate) else { continue };
        let Ok(since) = semver::Version::parse(&old_plugin.version) else {
            problems.push(format!(
                "release {version}'s {} has no semver version ({})",
                old_plugin.krate, old_plugin.version
            ));
            continue;
        };
        let mut logs = Vec::new();
        let spec = PLUGINS.iter().find(|p| p.krate == new_plugin.krate);
        for krate in
            [Some(new_plugin.krate.as_str()), spec.map(|p: &PluginCrate| p.library)].into_iter().flatten()
        {
            if let Some(c) = workspace.crates.get(krate) {
                let path = c.dir.join("CHANGELOG.md");
                let text = std::fs::read_to_string(root.join(&path)).unwrap_or_default();
                logs.push((path.display().to_string(), text));
            }
        }
        problems.extend(changelog::missing_entries(
            &old_plugin.manifest,
            &new_plugin.manifest,
            &since,
            &logs,
        ));
    }
    for old_plugin in &old_set.plugins {
        if !new_set.plugins.iter().any(|p| p.krate == old_plugin.krate) {
            problems.push(format!("{} (release {version}) is not in this dist", old_plugin.krate));
        }
    }
    problems
}

/// Every kept release: each `fixtures/releases/<version>/` holding a `dist-manifest.json`, oldest first.
pub fn kept_releases(root: &Path) -> anyhow::Result<Vec<(semver::Version, PathBuf)>> {
    versioned_dirs(&root.join(FIXTURES), |path| path.join(dist::DIST_MANIFEST).is_file())
}

/// The entries of `dir` named by a version (`0.2.0`) that `keep` accepts, oldest first; none when `dir` is
/// missing.
pub fn versioned_dirs(
    dir: &Path,
    keep: impl Fn(&Path) -> bool,
) -> anyhow::Result<Vec<(semver::Version, PathBuf)>> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Ok(Vec::new()) };
    let mut found = Vec::new();
    for entry in entries {
        let path = entry?.path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if let (Ok(version), true) = (semver::Version::parse(&name), keep(&path)) {
            found.push((version, path));
        }
    }
    found.sort();
    Ok(found)
}

/// One unpacked plugin bundle.
#[derive(Clone, Debug)]
struct UnpackedPlugin {
    krate: String,
    version: String,
    /// The bundle's top directory: a plugin directory.
    dir: PathBuf,
    library: PathBuf,
    manifest: PluginManifest,
}

/// A dist unpacked: its plugins and its host binary.
struct Unpacked {
    plugins: Vec<UnpackedPlugin>,
    host: Option<PathBuf>,
}

impl Unpacked {
    /// Unpacks every archive `manifest` lists (checking each archive's SHA-256 first) into `into`.
    fn new(dist_dir: &Path, manifest: &DistManifest, into: &Path) -> anyhow::Result<Unpacked> {
        let mut plugins = Vec::new();
        let mut host = None;
        for artifact in &manifest.artifacts {
            let path = dist_dir.join(&artifact.name);
            let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
            anyhow::ensure!(
                archive::sha256_hex(&bytes) == artifact.sha256,
                "{}: SHA-256 differs from dist-manifest.json",
                path.display()
            );
            archive::unpack(&bytes, into)?;
            let top = into.join(artifact.name.trim_end_matches(".tar.gz"));
            if let Some(plugin) = &artifact.plugin {
                let library = top.join(&plugin.library);
                let manifest =
                    PluginManifest::read(&PluginManifest::path_for(&library)).map_err(anyhow::Error::from)?;
                plugins.push(UnpackedPlugin {
                    krate: artifact.krate.clone(),
                    version: artifact.version.clone(),
                    dir: top,
                    library,
                    manifest,
                });
            } else if artifact.krate == HOST {
                host = Some(top.join(format!("{HOST}{}", std::env::consts::EXE_SUFFIX)));
            }
        }
        Ok(Unpacked { plugins, host })
    }
}

/// Each plugin library exports the one entry symbol and carries the permanent root interface version.
fn check_libraries(plugins: &[UnpackedPlugin], whose: &str) -> anyhow::Result<()> {
    for plugin in plugins {
        symbols::check_entry_symbol(&plugin.library)?;
        let root = symbols::root_interface_version(&plugin.library)?;
        anyhow::ensure!(
            root == delegate_abi::abi::ROOT_INTERFACE_VERSION,
            "the root interface version changed: {whose} {} ({}) has {root}, delegate-abi's is {} (it is permanent)",
            plugin.manifest.name,
            plugin.library.display(),
            delegate_abi::abi::ROOT_INTERFACE_VERSION
        );
    }
    Ok(())
}

/// The ABI versions this build's host speaks.
fn new_span() -> AbiSpan {
    let range = delegate_abi::abi::AbiRange::CURRENT;
    AbiSpan { min: range.min, max: range.max }
}

fn overlaps(a: AbiSpan, b: AbiSpan) -> bool {
    a.min <= b.max && b.min <= a.max
}

/// `host plugins --json` over the plugins' directories: the candidates found there.
fn candidates(host: &Path, plugins: &[UnpackedPlugin], probe: bool) -> anyhow::Result<Vec<Value>> {
    let mut cmd = Command::new(host);
    if probe {
        cmd.arg("--probe");
    }
    cmd.args(["plugins", "--json"]);
    for plugin in plugins {
        cmd.arg("--plugin-dir").arg(&plugin.dir);
    }
    // Only the directories given: no DELEGATE_PLUGIN_PATH from the caller's environment.
    cmd.env_remove(host_runtime::plugins::PLUGIN_PATH_ENV);
    let out = cmd.output().with_context(|| format!("running {}", host.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "{} plugins failed ({}): {}",
        host.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let list: Vec<Value> =
        serde_json::from_slice(&out.stdout).context("plugins --json printed no JSON list")?;
    Ok(list)
}

fn candidate_for<'a>(list: &'a [Value], plugin: &UnpackedPlugin) -> Option<&'a Value> {
    list.iter()
        .find(|c| c.get("path").and_then(Value::as_str).map(Path::new) == Some(plugin.library.as_path()))
}

/// Without `--probe`, the host lists every plugin from its manifest (it reads the older manifests).
fn expect_listed(host: &Path, plugins: &[UnpackedPlugin]) -> anyhow::Result<()> {
    let list = candidates(host, plugins, false)?;
    for plugin in plugins {
        let status = candidate_for(&list, plugin).and_then(|c| c.get("status")).and_then(Value::as_str);
        anyhow::ensure!(
            matches!(status, Some("listed" | "shadowed")),
            "{} does not list {} from its manifest (status {status:?})",
            host.display(),
            plugin.library.display()
        );
    }
    Ok(())
}

/// With `--probe`, the host loads every plugin whose ABI range overlaps `host_span` (it negotiated a version:
/// `abi_version` is set; a plugin that loads but has no device is `unavailable`, still loaded) and refuses the
/// others cleanly.
fn expect_loaded(
    host: &Path,
    host_span: AbiSpan,
    plugins: &[UnpackedPlugin],
    host_name: &str,
    plugins_name: &str,
) -> anyhow::Result<()> {
    let list = candidates(host, plugins, true)?;
    for plugin in plugins {
        let candidate = candidate_for(&list, plugin)
            .with_context(|| format!("{host_name} does not list {}", plugin.library.display()))?;
        let status = candidate.get("status").and_then(Value::as_str).unwrap_or("?");
        let negotiated = candidate.get("abi_version").and_then(Value::as_u64);
        let span = plugin.manifest.abi;
        if overlaps(span, host_span) {
            anyhow::ensure!(
                negotiated.is_some() && matches!(status, "loaded" | "unavailable" | "shadowed"),
                "{host_name} (ABI {}..={}) does not load {plugins_name} plugin {} (ABI {}..={}): status {status}, \
                 reason {}",
                host_span.min,
                host_span.max,
                plugin.manifest.name,
                span.min,
                span.max,
                candidate.get("reason").unwrap_or(&Value::Null)
            );
            eprintln!(
                "compat: {host_name} loads {plugins_name} {} {} (ABI {} negotiated)",
                plugin.manifest.name,
                plugin.manifest.version,
                negotiated.unwrap_or_default()
            );
        } else {
            anyhow::ensure!(
                status == "rejected",
                "{host_name} (ABI {}..={}) must refuse {plugins_name} plugin {} (ABI {}..={}); status {status}",
                host_span.min,
                host_span.max,
                plugin.manifest.name,
                span.min,
                span.max
            );
            eprintln!(
                "compat: {host_name} refuses {plugins_name} {} (no common ABI version)",
                plugin.manifest.name
            );
        }
    }
    Ok(())
}

/// The capabilities `--json` shows for a plugin whose manifest records `c` (the defaults when it records
/// none).
fn capabilities_json(c: &ManifestCapabilities) -> Value {
    serde_json::json!({
        "in_place_memory_kinds": c.in_place_memory_kinds,
        "caller_stream": c.caller_stream,
        "cuda_graph_capturable": c.cuda_graph_capturable,
        "device_positions": c.device_positions,
        "rewind_fork_without_reinit": c.rewind_fork_without_reinit,
        "max_positions": c.max_positions,
    })
}

/// With `--probe`, every plugin that loads shows the capabilities its manifest records: an older plugin's
/// library, read through the appended ABI fields it lacks, gives the defaults its manifest implies.
fn expect_capabilities(host: &Path, plugins: &[UnpackedPlugin], plugins_name: &str) -> anyhow::Result<()> {
    let list = candidates(host, plugins, true)?;
    for plugin in plugins {
        let Some(candidate) = candidate_for(&list, plugin).filter(|c| !c["abi_version"].is_null()) else {
            continue;
        };
        let expected = capabilities_json(&plugin.manifest.capabilities);
        anyhow::ensure!(
            candidate["capabilities"] == expected,
            "{plugins_name} plugin {} loads with capabilities {}, its manifest records {expected}",
            plugin.manifest.name,
            candidate["capabilities"]
        );
        eprintln!(
            "compat: {plugins_name} {} has the capabilities it records ({expected})",
            plugin.manifest.name
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abi_ranges_overlap_when_they_share_a_version() {
        let s = |min, max| AbiSpan { min, max };
        assert!(overlaps(s(1, 1), s(1, 1)));
        assert!(overlaps(s(1, 2), s(2, 3)));
        assert!(!overlaps(s(1, 1), s(2, 2)));
        assert!(!overlaps(s(3, 4), s(1, 2)));
    }

    #[test]
    fn every_version_directory_with_a_dist_manifest_is_a_kept_release_oldest_first() {
        let root = tempfile::tempdir().expect("tempdir");
        assert!(kept_releases(root.path()).expect("no fixtures").is_empty());
        for (version, with_manifest) in [("0.1.0", true), ("0.10.0", true), ("0.9.0", true), ("1.0.0", false)]
        {
            let dir = root.path().join(FIXTURES).join(version);
            std::fs::create_dir_all(&dir).expect("dir");
            if with_manifest {
                std::fs::write(dir.join(dist::DIST_MANIFEST), "{}").expect("write");
            }
        }
        std::fs::create_dir_all(root.path().join(FIXTURES).join("notes")).expect("dir");
        let kept = kept_releases(root.path()).expect("read");
        let versions: Vec<String> = kept.iter().map(|(v, _)| v.to_string()).collect();
        assert_eq!(versions, ["0.1.0", "0.9.0", "0.10.0"]);
        assert!(kept[2].1.ends_with("fixtures/releases/0.10.0"));
    }
}
