//! The release plan: which crate gets which version, and why.
//!
//! [`gather`] reads the facts (the record, `git log`, STABILITY.md, the semver checks); [`decide`] is the pure
//! decision over them, and [`apply`] writes a plan into the tree (`--execute`).
//!
//! The version rule, per publishable crate, in publish order:
//! - Never released (no entry in `releases.toml`): a first release at the `Cargo.toml` version; commits are
//!   counted, not classified, and nothing propagates from it.
//! - Otherwise the bump is the largest of
//!   - the commit bump: the largest bump the commits touching the crate's directory since the release's commit
//!     ask for (see [`super::commits`] for the rule per type);
//!   - the semver-check bump (major for breaking API changes, minor for minor-level lints);
//!   - the propagated bump: for each dependency whose plan is a breaking (`major`) release, `major` if this
//!     crate's STABILITY.md tier is not `internal` (our crates expose their dependencies' types: a stable or
//!     evolving crate built against a new major of one is a breaking release itself), else `patch` (internal
//!     crates promise nothing, but they must be republished to build against the new version).
//!     Propagation is transitive through the order. Minor and patch releases of a dependency propagate
//!     nothing: the dependents' requirements still accept them.
//! - The version is the bump applied to the last released version with Cargo's 0.x rule ([`Bump::apply`]),
//!   or the `Cargo.toml` version when that is already higher (an applied, not yet published plan).
//! - A breaking change is declared by a commit since the release (`!` or `BREAKING CHANGE`) or, after the fact,
//!   by an entry of `declared-breaks.toml` naming the crate and that release ([`super::declared`]); either asks
//!   for a major bump. One that the semver check finds but nothing declares, such as a `fix:` that removes a
//!   public item, stops the plan ([`Stop`], which `--json` prints).
//! - A `stable ABI` crate (delegate-abi) never takes a breaking bump: abi_stable writes its version into every
//!   type layout and refuses another 0.x minor (or major), so its breaking source changes ship as a patch
//!   (minor from 1.0) and propagate to its dependents as a breaking release would.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use semver::Version;
use serde::Serialize;

use super::changelog;
use super::commits::{self, Commit};
use super::declared::DeclaredBreak;
use super::record::{Record, Release};
use super::semver_check::{Checker, Outcome};
use super::stability::{Tier, Tiers};
use super::workspace::Workspace;
use super::Bump;

pub mod decide;
pub use decide::{decide, Stop};

/// The facts about one crate that the decision needs.
#[derive(Clone, Debug)]
pub struct Input {
    /// The package name.
    pub name: String,
    /// Its directory, relative to the workspace root.
    pub dir: PathBuf,
    /// The version in its `Cargo.toml`.
    pub version: Version,
    /// Its latest release, if any.
    pub last: Option<Release>,
    /// The commits touching its directory since that release, newest first (empty for a first release).
    pub commits: Vec<Commit>,
    /// For a first release: how many commits of all history touch it.
    pub history: usize,
    /// The semver check's outcome.
    pub semver: Outcome,
    /// Its STABILITY.md tier.
    pub tier: Tier,
    /// The publishable workspace crates it builds with.
    pub deps: BTreeSet<String>,
}

/// A dependent that needs a release because of this crate's breaking one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Dependent {
    /// The dependent's name.
    pub name: String,
    /// The bump it gets from this crate.
    pub bump: Bump,
}

/// The plan for one crate.
#[derive(Clone, Debug, Serialize)]
pub struct CratePlan {
    /// The package name.
    pub name: String,
    /// Its directory, relative to the workspace root.
    pub dir: PathBuf,
    /// Its STABILITY.md tier.
    pub tier: String,
    /// The version in its `Cargo.toml` now.
    pub current: Version,
    /// The latest release, if any.
    pub last_release: Option<Release>,
    /// No release yet: this is its first.
    pub first_release: bool,
    /// The commits since the last release, newest first (empty for a first release).
    pub commits: Vec<Commit>,
    /// How many commits: since the last release, or in all history for a first release.
    pub commit_count: usize,
    /// The largest bump the commits ask for.
    pub commit_bump: Bump,
    /// The semver check's outcome.
    pub semver: Outcome,
    /// The largest bump propagated from dependencies.
    pub propagated_bump: Bump,
    /// `name version` of each dependency whose breaking release propagated here.
    pub propagated_from: Vec<String>,
    /// The bump chosen (`none` for a first release, which keeps its version).
    pub bump: Bump,
    /// The version to release; `None`: nothing to release.
    pub proposed: Option<Version>,
    /// Why: one reason per source, `minor: feat in 3f2a1c4`.
    pub reasons: Vec<String>,
    /// The breaking changes `declared-breaks.toml` declares since the last release.
    pub declared_breaks: Vec<DeclaredBreak>,
    /// A `stable ABI` crate's breaking source change released in a compatible version (its version is part of
    /// the binary ABI); it propagates to dependents as a breaking release does.
    pub source_breaking: bool,
    /// The dependents that need a release because of this one.
    pub dependents: Vec<Dependent>,
}

/// The plan for every publishable crate, in publish order.
#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    /// One entry per publishable crate, dependencies first.
    pub crates: Vec<CratePlan>,
}

impl Plan {
    /// The crates the plan releases.
    pub fn releases(&self) -> impl Iterator<Item = (&CratePlan, &Version)> {
        self.crates.iter().filter_map(|c| c.proposed.as_ref().map(|v| (c, v)))
    }
}

/// What [`gather`] should do.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Run the semver checks (`--no-semver` turns them off: every released crate says "skipped").
    pub semver: bool,
}

/// Reads the facts for every publishable crate, in publish order.
pub fn gather(ws: &Workspace, record: &Record, options: &Options) -> anyhow::Result<Vec<Input>> {
    let root = ws.root.as_path();
    let tiers = Tiers::load(root)?;
    let mut checker: Option<Checker> = None;
    let mut inputs = Vec::new();
    for krate in ws.publish_order()? {
        let last = record.latest(&krate.name).cloned();
        let (commits, history) = match &last {
            Some(release) => (commits::log(root, Some(&release.commit), &krate.dir)?, 0),
            None => (Vec::new(), commits::count(root, &krate.dir)?),
        };
        let semver = match &last {
            None => Outcome::NoBaseline,
            Some(_) if !options.semver => Outcome::Skipped,
            Some(_) if commits.is_empty() => Outcome::Unchanged,
            Some(release) => {
                if checker.is_none() {
                    checker = Some(Checker::new(root, ws)?);
                }
                match checker.as_mut() {
                    Some(checker) => checker.check(&krate.name, release)?,
                    None => bail!("no semver checker"),
                }
            }
        };
        inputs.push(Input {
            name: krate.name.clone(),
            dir: krate.dir.clone(),
            version: krate.version.clone(),
            last,
            commits,
            history,
            semver,
            tier: tiers.of(&krate.name, &krate.dir),
            deps: krate.deps.clone(),
        });
    }
    Ok(inputs)
}

/// The human plan: a summary table, then each crate's facts and reasons.
pub fn render(plan: &Plan) -> String {
    let mut out = String::new();
    let width = plan.crates.iter().map(|c| c.name.len()).max().unwrap_or(5).max(5);
    let _ = writeln!(out, "{:width$}  {:<9} {:<9} {:<7} tier", "crate", "last", "proposed", "bump");
    for c in &plan.crates {
        let last = c.last_release.as_ref().map_or_else(|| "-".to_owned(), |r| r.version.to_string());
        let proposed = c.proposed.as_ref().map_or_else(|| "-".to_owned(), Version::to_string);
        let bump = if c.first_release { "first" } else { c.bump.name() };
        let _ = writeln!(out, "{:width$}  {last:<9} {proposed:<9} {bump:<7} {}", c.name, c.tier);
    }
    for c in &plan.crates {
        let _ = writeln!(out);
        let target = match &c.proposed {
            Some(v) if c.first_release => format!("{v} (first release)"),
            Some(v) => format!("{} -> {v} ({})", c.current, c.bump.name()),
            None => format!("{} (no release)", c.current),
        };
        let _ = writeln!(out, "{}  {target}", c.name);
        let _ = writeln!(out, "  tier:       {}", c.tier);
        match &c.last_release {
            None => {
                let _ = writeln!(
                    out,
                    "  last:       none: first release ({} commits in history)",
                    c.commit_count
                );
            }
            Some(r) => {
                let short = r.commit.get(..7).unwrap_or(&r.commit);
                let _ = writeln!(out, "  last:       {} ({short}, {})", r.version, r.date);
                let _ = writeln!(out, "  commits:    {} since {}", c.commit_count, r.version);
                for commit in &c.commits {
                    let kind =
                        if commit.breaking { format!("{}!", commit.kind) } else { commit.kind.clone() };
                    let _ = writeln!(out, "    {kind:<10} {} {}", commit.short(), commit.subject);
                }
            }
        }
        let _ = writeln!(out, "  semver:     {}", c.semver.describe());
        let _ = writeln!(out, "  reasons:    {}", c.reasons.join("; "));
        if !c.dependents.is_empty() {
            let list: Vec<String> =
                c.dependents.iter().map(|d| format!("{} ({})", d.name, d.bump.name())).collect();
            let _ = writeln!(out, "  dependents: {}", list.join(", "));
        }
    }
    out
}

/// Writes the plan into the workspace: each released crate's `Cargo.toml` version, its requirement in the
/// root `[workspace.dependencies]`, and its finalised `CHANGELOG.md` (dated `date`, `YYYY-MM-DD`). Idempotent.
/// Returns the files it changed. Publishing (and recording releases) is the next step's.
pub fn apply(ws: &Workspace, plan: &Plan, date: &str) -> anyhow::Result<Vec<PathBuf>> {
    let mut changed = Vec::new();
    let root_manifest = ws.root.join("Cargo.toml");
    let mut root_text = read(&root_manifest)?;
    let root_before = root_text.clone();
    for (krate, version) in plan.releases() {
        let dir = ws.root.join(&krate.dir);
        if *version != krate.current {
            let manifest = dir.join("Cargo.toml");
            let text = read(&manifest)?;
            let new =
                set_package_version(&text, version).with_context(|| format!("{}", manifest.display()))?;
            write(&manifest, &text, &new, &mut changed)?;
        }
        root_text = set_workspace_dependency(&root_text, &krate.name, version)
            .with_context(|| format!("{}", root_manifest.display()))?;
        let path = dir.join("CHANGELOG.md");
        let text = read(&path)?;
        let entry = changelog::Entry {
            version: version.to_string(),
            date: date.to_owned(),
            commits: &krate.commits,
            breaking: krate.declared_breaks.iter().map(changelog::declared_item).collect(),
            dependencies: krate.propagated_from.clone(),
            special: changelog::special(&krate.name),
        };
        let new = changelog::finalise(&text, &entry).with_context(|| format!("{}", path.display()))?;
        write(&path, &text, &new, &mut changed)?;
    }
    write(&root_manifest, &root_before, &root_text, &mut changed)?;
    Ok(changed)
}

/// Sets `[package] version` (a literal: independently versioned crates never inherit it).
pub fn set_package_version(text: &str, version: &Version) -> anyhow::Result<String> {
    let mut doc: toml_edit::DocumentMut = text.parse().context("parsing the manifest")?;
    let package = doc.get_mut("package").and_then(|p| p.as_table_like_mut()).context("no [package] table")?;
    match package.get_mut("version") {
        Some(item) if item.is_str() => {
            let decor = item.as_value().map(|v| v.decor().clone());
            let mut value = toml_edit::Value::from(version.to_string());
            if let Some(decor) = decor {
                *value.decor_mut() = decor;
            }
            *item = toml_edit::Item::Value(value);
        }
        Some(_) => {
            bail!("[package] version is not a literal string (inherited?): each crate has its own version")
        }
        None => bail!("[package] has no version"),
    }
    Ok(doc.to_string())
}

/// Sets the `version` requirement of `name` in `[workspace.dependencies]` (left alone when it has none).
pub fn set_workspace_dependency(text: &str, name: &str, version: &Version) -> anyhow::Result<String> {
    let mut doc: toml_edit::DocumentMut = text.parse().context("parsing the workspace manifest")?;
    let Some(dep) = doc
        .get_mut("workspace")
        .and_then(|w| w.get_mut("dependencies"))
        .and_then(|d| d.get_mut(name))
        .and_then(|d| d.as_table_like_mut())
    else {
        return Ok(text.to_owned());
    };
    if let Some(item) = dep.get_mut("version") {
        let decor = item.as_value().map(|v| v.decor().clone());
        let mut value = toml_edit::Value::from(version.to_string());
        if let Some(decor) = decor {
            *value.decor_mut() = decor;
        }
        *item = toml_edit::Item::Value(value);
    }
    Ok(doc.to_string())
}

fn read(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

fn write(path: &Path, old: &str, new: &str, changed: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    if old != new {
        std::fs::write(path, new).with_context(|| format!("writing {}", path.display()))?;
        changed.push(path.to_path_buf());
    }
    Ok(())
}

/// Today's date in UTC, `YYYY-MM-DD`.
pub fn today() -> String {
    jiff::Timestamp::now().to_zoned(jiff::tz::TimeZone::UTC).date().to_string()
}

#[cfg(test)]
mod tests;
