//! `cargo xtask release --execute --registry NAME`: publish every publishable crate, in dependency order.
//!
//! Each crate's `Cargo.toml` already carries the version to release (the plan wrote it). Before uploading
//! anything, every dependency between workspace crates must survive packaging (it names the registry; a
//! versioned dev-dependency points at a crate published earlier). Then, for each crate of
//! [`Workspace::publish_order`]:
//!
//! 1. if the registry's index already lists that version, nothing is uploaded (a failed run resumes where it
//!    stopped);
//! 2. else `cargo publish -p <crate> --registry <NAME>`;
//! 3. the release is appended to `releases.toml` unless recorded, and the record saved at once, so progress
//!    survives a crash;
//! 4. the tag `<crate>-v<version>` is created at the recorded commit (an existing tag must point there).
//!
//! It refuses a dirty working tree (`releases.toml` aside, which it writes) unless `--allow-dirty`, and it
//! never publishes to crates.io: `--registry` is required, `crates-io` and any registry whose index is
//! crates.io's are refused.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context};

use super::index::{refuse_crates_io, Index};
use super::record::{Record, Release, FILE};
use super::workspace::{Crate, Workspace};

/// `cargo xtask release`'s publishing flags (the plan's flags live beside them).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct PublishArgs {
    /// Publish the versions the crates' Cargo.toml files carry, in dependency order, record them in
    /// releases.toml and tag them (without it, nothing is published).
    #[arg(long)]
    pub execute: bool,
    /// The registry to publish to, as cargo's configuration names it (never crates-io).
    #[arg(long, value_name = "NAME", requires = "execute")]
    pub registry: Option<String>,
    /// Record and tag the versions the crates' Cargo.toml files carry as released, without uploading them
    /// anywhere (a release made before the crates go to a registry).
    #[arg(long, requires = "execute", conflicts_with = "registry")]
    pub record_only: bool,
    /// Publish from a working tree with uncommitted changes (passed on to cargo publish).
    #[arg(long)]
    pub allow_dirty: bool,
    /// Skip cargo publish's verification build of each packaged crate.
    #[arg(long)]
    pub no_verify: bool,
}

impl PublishArgs {
    /// The options of [`run`] these flags ask for.
    pub fn options(&self) -> anyhow::Result<Options> {
        let Some(registry) = self.registry.clone() else {
            bail!("--registry NAME is required: this task publishes only to a registry named explicitly");
        };
        refuse_crates_io(&registry)?;
        Ok(Options {
            registry,
            allow_dirty: self.allow_dirty,
            no_verify: self.no_verify,
            env: BTreeMap::new(),
        })
    }

    /// [`PublishArgs::options`] for the workspace at `root`, with what verification builds need: cargo publish
    /// builds every packaged crate unless `--no-verify`, and `trt-exec`/`trt-build` need libclang and the
    /// TensorRT-RTX library, `executorch-bridge` the executorch wheel (installed when missing, as for `test`).
    pub fn options_for(&self, root: &Path) -> anyhow::Result<Options> {
        let mut options = self.options()?;
        if !options.no_verify {
            options.env.extend(crate::trt_setup::ensure(root)?.vars());
            let executorch = crate::executorch_setup::ensure(root)?;
            options.env.insert(
                crate::executorch_setup::EXECUTORCH_ROOT_ENV.to_owned(),
                executorch.root.display().to_string(),
            );
        }
        Ok(options)
    }
}

/// How to publish.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// The registry's name in cargo's configuration.
    pub registry: String,
    /// Publish from a dirty working tree.
    pub allow_dirty: bool,
    /// `cargo publish --no-verify`: package without building the packaged crate.
    pub no_verify: bool,
    /// Environment variables set for every command this runs, and read (before the process's own) when looking
    /// for the registry's configuration.
    pub env: BTreeMap<String, String>,
}

/// What happened to one crate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Uploaded by this run.
    Published,
    /// The registry already had this version; nothing was uploaded.
    AlreadyInRegistry,
}

/// One crate's line of the run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// The package name.
    pub krate: String,
    /// The version published.
    pub version: semver::Version,
    /// What happened.
    pub outcome: Outcome,
}

/// Publishes every publishable crate of the workspace at `root` to `options.registry`, in dependency order;
/// returns one step per crate, in that order. Stops at the first crate that fails to publish (its dependents
/// could not resolve it); running again resumes.
pub fn run(root: &Path, options: &Options) -> anyhow::Result<Vec<Step>> {
    refuse_crates_io(&options.registry)?;
    let env = |key: &str| options.env.get(key).cloned().or_else(|| std::env::var(key).ok());
    let index = Index::for_registry(&options.registry, root, &env)?;
    if !options.allow_dirty {
        ensure_clean(root, options)?;
    }
    let head = git_output(root, options, &["rev-parse", "HEAD"])?.context("the workspace has no commit")?;
    let date = super::plan::today();
    let workspace = Workspace::load_with_env(root, &options.env)?;
    let order = workspace.publish_order()?;
    check_dependencies(root, options, &index, &order)?;
    let mut record = Record::load(root)?;
    println!("publishing {} crates to `{}` ({})", order.len(), options.registry, index.url);
    let mut steps = Vec::with_capacity(order.len());
    for krate in order {
        let (name, version) = (&krate.name, &krate.version);
        let attempt = || -> anyhow::Result<Outcome> {
            let listed =
                index.versions(name).with_context(|| format!("asking `{}` for {name}", options.registry))?;
            if listed.contains(version) {
                return Ok(Outcome::AlreadyInRegistry);
            }
            cargo_publish(root, options, name)?;
            Ok(Outcome::Published)
        };
        let outcome = match attempt() {
            Ok(outcome) => outcome,
            Err(err) => {
                println!("  {:<21} {name} {version}", "failed");
                return Err(err);
            }
        };
        let release = match record.releases.iter().find(|r| &r.krate == name && &r.version == version) {
            Some(release) => release.clone(),
            None => {
                let release = Release {
                    krate: name.clone(),
                    version: version.clone(),
                    commit: head.clone(),
                    date: date.clone(),
                };
                record.releases.push(release.clone());
                record.save(root)?;
                release
            }
        };
        let tag = ensure_tag(root, options, &release)?;
        let what = match outcome {
            Outcome::Published => "published",
            Outcome::AlreadyInRegistry => "already in registry",
        };
        println!("  {what:<21} {name} {version} ({tag})");
        steps.push(Step { krate: name.clone(), version: version.clone(), outcome });
    }
    let published = steps.iter().filter(|s| s.outcome == Outcome::Published).count();
    println!("{published} published, {} already in `{}`", steps.len() - published, options.registry);
    if published > 0 {
        println!("commit {FILE}: it records this release (the tags are derived from it)");
    }
    Ok(steps)
}

/// `release --execute --record-only`: records every publishable crate's current version in `releases.toml`
/// (at HEAD, today) and tags it, uploading nothing; versions already recorded are left as they are. Returns
/// the releases recorded now.
pub fn record_only(root: &Path, allow_dirty: bool) -> anyhow::Result<Vec<Release>> {
    let options = Options { allow_dirty, ..Options::default() };
    if !allow_dirty {
        ensure_clean(root, &options)?;
    }
    let head = git_output(root, &options, &["rev-parse", "HEAD"])?.context("the workspace has no commit")?;
    let date = super::plan::today();
    let workspace = Workspace::load(root)?;
    let mut record = Record::load(root)?;
    let mut recorded = Vec::new();
    for krate in workspace.publish_order()? {
        let known = record.releases.iter().find(|r| r.krate == krate.name && r.version == krate.version);
        let release = match known {
            Some(release) => release.clone(),
            None => {
                let release = Release {
                    krate: krate.name.clone(),
                    version: krate.version.clone(),
                    commit: head.clone(),
                    date: date.clone(),
                };
                record.releases.push(release.clone());
                record.save(root)?;
                recorded.push(release.clone());
                release
            }
        };
        let tag = ensure_tag(root, &options, &release)?;
        println!("  recorded  {} {} ({tag})", krate.name, krate.version);
    }
    if !recorded.is_empty() {
        println!(
            "{} releases recorded; commit {FILE}: it records this release (the tags are derived from it)",
            recorded.len()
        );
    }
    Ok(recorded)
}

/// Fails before anything is uploaded when a dependency between workspace crates would not survive packaging:
///
/// - a versioned dev-dependency on a crate not published before it: `cargo publish` keeps versioned
///   dev-dependencies and the registry must resolve them, so the crate could never be published (nor could a
///   cycle through a dev-dependency). A path-only dev-dependency is dropped from the package and is fine;
/// - a kept dependency that does not name the registry (`registry = "NAME"`, in `[workspace.dependencies]`):
///   packaging would look it up on crates.io, where a crate of the same name may be someone else's.
fn check_dependencies(root: &Path, options: &Options, index: &Index, order: &[&Crate]) -> anyhow::Result<()> {
    let mut command = cargo_metadata::MetadataCommand::new();
    command.manifest_path(root.join("Cargo.toml")).no_deps();
    for (key, value) in &options.env {
        command.env(key, value);
    }
    let meta = command.exec().context("cargo metadata")?;
    let position = |name: &str| order.iter().position(|c| c.name == name);
    let same_index = |url: &str| {
        url.trim_start_matches("sparse+").trim_end_matches('/') == index.url.trim_end_matches('/')
    };
    let mut problems = Vec::new();
    for pkg in meta.workspace_packages() {
        let Some(at) = position(pkg.name.as_str()) else { continue };
        for dep in &pkg.dependencies {
            let internal = meta.workspace_packages().iter().any(|p| p.name.as_str() == dep.name);
            let kept = dep.req != semver::VersionReq::STAR
                || dep.kind != cargo_metadata::DependencyKind::Development;
            if !internal || !kept {
                continue;
            }
            if dep.kind == cargo_metadata::DependencyKind::Development
                && position(&dep.name).is_none_or(|dep_at| dep_at >= at)
            {
                problems.push(format!(
                    "{} dev-depends on {} with a version, but {} is not published before it: make that \
                     dev-dependency path-only (`{} = {{ path = \"...\" }}`) so cargo publish drops it",
                    pkg.name, dep.name, dep.name, dep.name
                ));
            } else if !dep.registry.as_deref().is_some_and(same_index) {
                problems.push(format!(
                    "{} depends on {}, which does not name registry `{}`: add `registry = \"{}\"` to its entry \
                     (packaging would look for {} on {})",
                    pkg.name,
                    dep.name,
                    options.registry,
                    options.registry,
                    dep.name,
                    dep.registry.as_deref().unwrap_or("crates.io")
                ));
            }
        }
    }
    if !problems.is_empty() {
        bail!("these crates cannot be published to `{}`:\n{}", options.registry, problems.join("\n"));
    }
    Ok(())
}

/// `cargo publish -p <krate> --registry <NAME>` in the workspace, its output kept for the error.
fn cargo_publish(root: &Path, options: &Options, krate: &str) -> anyhow::Result<()> {
    let mut cmd = crate::util::cargo();
    cmd.args(["publish", "-p", krate, "--registry", &options.registry]).current_dir(root).envs(&options.env);
    if options.no_verify {
        cmd.arg("--no-verify");
    }
    if options.allow_dirty {
        cmd.arg("--allow-dirty");
    }
    let out = cmd.output().context("running cargo publish")?;
    if !out.status.success() {
        bail!(
            "`cargo publish -p {krate} --registry {}` failed ({}):\n{}",
            options.registry,
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Fails on uncommitted changes, untracked files included, except the record this task writes.
fn ensure_clean(root: &Path, options: &Options) -> anyhow::Result<()> {
    let status = git_output(root, options, &["status", "--porcelain"])?.unwrap_or_default();
    let dirty: Vec<&str> = status.lines().filter(|line| line.get(3..) != Some(FILE)).collect();
    if !dirty.is_empty() {
        bail!(
            "the working tree has uncommitted changes (commit them, or pass --allow-dirty):\n{}",
            dirty.join("\n")
        );
    }
    Ok(())
}

/// Makes sure `release`'s tag exists and points at its recorded commit; returns the tag.
fn ensure_tag(root: &Path, options: &Options, release: &Release) -> anyhow::Result<String> {
    let tag = release.tag();
    let target =
        git_output(root, options, &["rev-parse", "-q", "--verify", &format!("refs/tags/{tag}^{{commit}}")])?;
    match target {
        Some(commit) if commit == release.commit => {}
        Some(commit) => bail!(
            "the tag {tag} points at {commit}, but {FILE} records {} {} at {}: fix the tag or the record",
            release.krate,
            release.version,
            release.commit
        ),
        None => {
            let mut cmd = Command::new("git");
            cmd.args(["tag", &tag, &release.commit]).envs(&options.env);
            crate::util::run_cmd(root, &mut cmd)?;
        }
    }
    Ok(tag)
}

/// A git command's trimmed standard output; `None` when it exits non-zero without printing anything.
fn git_output(root: &Path, options: &Options, args: &[&str]) -> anyhow::Result<Option<String>> {
    let out = Command::new("git")
        .args(args)
        .current_dir(root)
        .envs(&options.env)
        .output()
        .with_context(|| format!("running git {}", args.join(" ")))?;
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if out.status.success() {
        return Ok(Some(stdout));
    }
    if stdout.is_empty() && out.stderr.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    bail!("`git {}` failed ({}): {}", args.join(" "), out.status, String::from_utf8_lossy(&out.stderr).trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dependencies_that_would_not_survive_packaging_stop_the_run_before_any_upload() {
        let dir = tempfile::tempdir().expect("tempdir");
        let write = |path: &str, text: &str| {
            let path = dir.path().join(path);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(path, text).expect("write");
        };
        let package =
            |name: &str| format!("[package]\nname = \"{name}\"\nversion = \"0.1.0\"\nedition = \"2021\"\n");
        let with_deps = |name: &str, a: &str, dev_b: &str| {
            write(
                &format!("{name}/Cargo.toml"),
                &format!("{}[dependencies]\n{a}\n[dev-dependencies]\n{dev_b}\n", package(name)),
            )
        };
        write("Cargo.toml", "[workspace]\nmembers = [\"a\", \"b\"]\nresolver = \"2\"\n");
        write("a/src/lib.rs", "");
        write("b/src/lib.rs", "");
        let options = Options {
            registry: "loc".into(),
            env: [("CARGO_REGISTRIES_LOC_INDEX".to_owned(), "sparse+http://127.0.0.1:9/index/".to_owned())]
                .into(),
            ..Options::default()
        };
        let env = |key: &str| options.env.get(key).cloned();
        let index = Index::for_registry("loc", dir.path(), &env).expect("configured");
        let check = || {
            let workspace = Workspace::load_with_env(dir.path(), &options.env).expect("cargo metadata");
            let order = workspace.publish_order().expect("an order");
            check_dependencies(dir.path(), &options, &index, &order)
        };

        // a <- b (normal), a -> b (dev, versioned): a cycle only a path-only dev-dependency can publish.
        with_deps("a", "", "b = { path = \"../b\", version = \"0.1.0\", registry = \"loc\" }");
        with_deps("b", "a = { path = \"../a\", version = \"0.1.0\", registry = \"loc\" }", "");
        let err = check().expect_err("a cannot be published");
        assert!(err.to_string().contains("a dev-depends on b with a version"), "{err}");

        with_deps("a", "", "b = { path = \"../b\" }");
        check().expect("path-only dev-dependencies are dropped");

        with_deps("b", "a = { path = \"../a\", version = \"0.1.0\" }", "");
        let err = check().expect_err("b's dependency would be looked up on crates.io");
        assert!(err.to_string().contains("b depends on a, which does not name registry `loc`"), "{err}");
    }

    #[test]
    fn publishing_needs_a_named_registry_other_than_crates_io() {
        let none = PublishArgs { execute: true, ..PublishArgs::default() };
        assert!(none.options().is_err());
        let crates_io = PublishArgs { registry: Some("crates-io".into()), ..none.clone() };
        let err = crates_io.options().expect_err("refused");
        assert!(err.to_string().contains("never publishes to crates.io"), "{err}");
        let options = Options { registry: "crates-io".into(), ..Options::default() };
        let err = run(&crate::util::project_root(), &options).expect_err("refused");
        assert!(err.to_string().contains("never publishes to crates.io"), "{err}");
    }
}
