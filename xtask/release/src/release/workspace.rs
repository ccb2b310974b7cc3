//! The workspace as a release sees it: publishable crates, their internal edges, a publish order.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use cargo_metadata::{DependencyKind, MetadataCommand};

/// One crate of the workspace.
#[derive(Clone, Debug)]
pub struct Crate {
    /// The package name.
    pub name: String,
    /// The version in its `Cargo.toml`.
    pub version: semver::Version,
    /// The directory holding its `Cargo.toml`, relative to the workspace root (`crates/blob-format`).
    pub dir: PathBuf,
    /// Whether `cargo publish` may publish it (`publish = false` says no).
    pub publishable: bool,
    /// Workspace crates it needs to build (normal and build dependencies; dev-dependencies are left out).
    pub deps: BTreeSet<String>,
}

/// Every crate of the workspace, by name.
#[derive(Clone, Debug)]
pub struct Workspace {
    /// The workspace root.
    pub root: PathBuf,
    /// The crates, by name.
    pub crates: BTreeMap<String, Crate>,
}

impl Workspace {
    /// Reads the workspace at `root` with `cargo metadata` (no dependency resolution over the network).
    pub fn load(root: &Path) -> anyhow::Result<Workspace> {
        Workspace::load_with_env(root, &BTreeMap::new())
    }

    /// [`Workspace::load`] with extra environment variables for cargo (a registry's configuration, say, that
    /// the manifests' `registry = "..."` keys need).
    pub fn load_with_env(root: &Path, env: &BTreeMap<String, String>) -> anyhow::Result<Workspace> {
        let mut command = MetadataCommand::new();
        command.manifest_path(root.join("Cargo.toml")).no_deps();
        for (key, value) in env {
            command.env(key, value);
        }
        let meta = command.exec().context("cargo metadata")?;
        let members: BTreeSet<String> =
            meta.workspace_packages().iter().map(|p| p.name.to_string()).collect();
        let mut crates = BTreeMap::new();
        for pkg in meta.workspace_packages() {
            let manifest_dir = pkg.manifest_path.parent().context("a manifest path without a directory")?;
            let dir = manifest_dir
                .as_std_path()
                .strip_prefix(meta.workspace_root.as_std_path())
                .unwrap_or(manifest_dir.as_std_path())
                .to_path_buf();
            let deps: BTreeSet<String> = pkg
                .dependencies
                .iter()
                .filter(|d| members.contains(d.name.as_str()) && d.kind != DependencyKind::Development)
                .map(|d| d.name.to_string())
                .collect();
            let publishable = pkg.publish.as_ref().is_none_or(|registries| !registries.is_empty());
            crates.insert(
                pkg.name.to_string(),
                Crate { name: pkg.name.to_string(), version: pkg.version.clone(), dir, publishable, deps },
            );
        }
        Ok(Workspace { root: meta.workspace_root.into_std_path_buf(), crates })
    }

    /// The publishable crates, each after every workspace crate it builds with (ties broken by name, so the
    /// order is the same on every machine). A publishable crate that needs an unpublishable one is an error:
    /// the registry could never resolve it.
    pub fn publish_order(&self) -> anyhow::Result<Vec<&Crate>> {
        let publishable: BTreeMap<&str, &Crate> =
            self.crates.values().filter(|c| c.publishable).map(|c| (c.name.as_str(), c)).collect();
        for krate in publishable.values() {
            if let Some(dep) = krate.deps.iter().find(|d| !publishable.contains_key(d.as_str())) {
                bail!("{} is publishable but depends on {dep}, which is not (publish = false)", krate.name);
            }
        }
        let mut done: BTreeSet<&str> = BTreeSet::new();
        let mut order = Vec::with_capacity(publishable.len());
        while order.len() < publishable.len() {
            let ready: Vec<&Crate> = publishable
                .values()
                .filter(|c| !done.contains(c.name.as_str()))
                .filter(|c| c.deps.iter().all(|d| done.contains(d.as_str())))
                .copied()
                .collect();
            if ready.is_empty() {
                let stuck: Vec<&str> = publishable.keys().filter(|n| !done.contains(*n)).copied().collect();
                bail!("the workspace's dependencies form a cycle among: {}", stuck.join(", "));
            }
            for krate in ready {
                done.insert(&krate.name);
                order.push(krate);
            }
        }
        Ok(order)
    }
}

#[cfg(test)]
mod tests {
    use super::Workspace;

    #[test]
    fn every_crate_comes_after_what_it_builds_with() {
        let ws = Workspace::load(&crate::util::project_root()).expect("cargo metadata");
        let order = ws.publish_order().expect("an order");
        let position = |name: &str| order.iter().position(|c| c.name == name);
        assert_eq!(position("et-error"), Some(0), "et-error depends on nothing of ours");
        for (i, krate) in order.iter().enumerate() {
            for dep in &krate.deps {
                let at = position(dep)
                    .unwrap_or_else(|| panic!("{} needs {dep}, which is not published", krate.name));
                assert!(at < i, "{} is published before its dependency {dep}", krate.name);
            }
        }
        assert!(position("xtask").is_none(), "xtask is publish = false");
        assert!(position("blob-format").is_some());
    }
}
