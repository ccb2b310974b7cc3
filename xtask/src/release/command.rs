//! `cargo xtask release`: prints the plan (writes nothing); `--execute` applies it; `--execute --registry NAME`
//! also publishes.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Instant;

use anyhow::Context;

use super::plan::{self, Plan};
use super::record::Record;
use super::workspace::Workspace;

/// The `release` subcommand's options.
#[derive(Clone, Debug, Default)]
pub struct Args {
    /// Print the plan as JSON instead of the table.
    pub json: bool,
    /// Skip the semver checks (a fast plan: every released crate says "skipped").
    pub no_semver: bool,
    /// Crates whose undeclared breaking change (found by the semver check) is accepted.
    pub accept_breaking: Vec<String>,
    /// Apply the plan: versions, requirements, changelogs.
    pub execute: bool,
    /// After applying, publish to this registry (`--execute` only).
    pub registry: Option<String>,
    /// The release date (`YYYY-MM-DD`; default: today, UTC).
    pub date: Option<String>,
}

/// Computes the plan of the workspace at `root` (nothing is written).
pub fn compute(
    root: &Path,
    no_semver: bool,
    accept_breaking: &BTreeSet<String>,
) -> anyhow::Result<(Workspace, Plan)> {
    let ws = Workspace::load(root)?;
    let record = Record::load(&ws.root)?;
    let inputs = plan::gather(&ws, &record, &plan::Options { semver: !no_semver })?;
    let plan = plan::decide(&inputs, accept_breaking)?;
    Ok((ws, plan))
}

/// Runs the subcommand.
pub fn run(root: &Path, args: &Args) -> anyhow::Result<()> {
    let started = Instant::now();
    let accept: BTreeSet<String> = args.accept_breaking.iter().cloned().collect();
    let (ws, plan) = compute(root, args.no_semver, &accept)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&plan).context("serialising the plan")?);
    } else {
        print!("{}", plan::render(&plan));
    }
    eprintln!("xtask: planned in {:.1?}", started.elapsed());
    if !args.execute {
        if !args.json {
            println!("\nNothing written. `cargo xtask release --execute` applies this plan.");
        }
        return Ok(());
    }
    if args.no_semver {
        eprintln!("xtask: warning: applying a plan without semver checks: the versions rest on commit messages alone");
    }
    let date = match &args.date {
        Some(date) => date.clone(),
        None => plan::today(),
    };
    let mut changed = plan::apply(&ws, &plan, &date)?;
    if changed.iter().any(|p| p.ends_with("Cargo.toml")) {
        // The lock file names every workspace crate's version: bring it along (workspace entries only).
        let lock = ws.root.join("Cargo.lock");
        let before = std::fs::read(&lock).ok();
        let mut cmd = crate::util::cargo();
        cmd.args(["update", "--workspace"]);
        crate::util::run_cmd(&ws.root, &mut cmd)?;
        if std::fs::read(&lock).ok() != before {
            changed.push(lock);
        }
    }
    for path in &changed {
        eprintln!("xtask: wrote {}", path.strip_prefix(&ws.root).unwrap_or(path).display());
    }
    match &args.registry {
        Some(registry) => publish(root, &ws, &plan, registry),
        None => {
            eprintln!(
                "xtask: applied the plan ({} files). Commit it, then `cargo xtask release --execute --registry NAME` \
                 publishes every crate whose version the registry lacks, records it in releases.toml and tags it.",
                changed.len()
            );
            Ok(())
        }
    }
}

/// The publish step, after [`plan::apply`]: the seam for `release::publish` (its own task). Until it lands,
/// `--registry` applies the plan and stops here with an error, so nothing pretends to have published.
fn publish(_root: &Path, _ws: &Workspace, _plan: &Plan, registry: &str) -> anyhow::Result<()> {
    anyhow::bail!(
        "the plan is applied, but publishing to `{registry}` is not part of this build yet (release::publish lands \
         with the publish task); nothing was published or recorded"
    )
}
