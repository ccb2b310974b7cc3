//! `cargo xtask release`: prints the plan (writes nothing); `--execute` applies it; `--execute --registry NAME`
//! also publishes.
//!
//! Publishing is a step [`run`] is handed (`publish`), called after [`plan::apply`] only when applying
//! changed nothing: the applied plan must be committed first (the release commit is what gets published and
//! recorded), so the flow is `--execute`, commit, `--execute --registry NAME`. A second `--execute` on a
//! committed, applied plan writes nothing ([`plan::apply`] is idempotent), so the second call goes straight
//! to publishing, and after a failed publish, running it again resumes.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context};

use super::declared::Declared;
use super::plan::{self, Plan, Stop};
use super::record::Record;
use super::workspace::Workspace;

/// The plan's flags of `cargo xtask release` (`--execute` and `--registry` live with the publishing flags).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct PlanArgs {
    /// Print the plan as JSON.
    #[arg(long)]
    pub json: bool,
    /// Skip the semver checks: a fast plan whose semver line says "skipped" (never "compatible").
    #[arg(long)]
    pub no_semver: bool,
    /// The release date written into the changelogs, YYYY-MM-DD (default: today, UTC).
    #[arg(long, value_name = "DATE")]
    pub date: Option<String>,
}

/// The publishing step: publishes the workspace at the given root, whose Cargo.toml files carry the versions.
pub type Publish<'a> = &'a dyn Fn(&Path) -> anyhow::Result<()>;

/// Computes the plan of the workspace at `root` (nothing is written).
pub fn compute(root: &Path, no_semver: bool) -> anyhow::Result<(Workspace, Plan)> {
    compute_with_env(root, no_semver, &std::collections::BTreeMap::new())
}

/// [`compute`] with extra environment for `cargo metadata` (a registry's index, say).
pub fn compute_with_env(
    root: &Path,
    no_semver: bool,
    env: &std::collections::BTreeMap<String, String>,
) -> anyhow::Result<(Workspace, Plan)> {
    let ws = Workspace::load_with_env(root, env)?;
    let record = Record::load(&ws.root)?;
    let names = ws.publish_order()?.iter().map(|c| c.name.clone()).collect();
    let declared = Declared::load(&ws.root, &names, &record)?;
    let inputs = plan::gather(&ws, &record, &plan::Options { semver: !no_semver })?;
    let plan = plan::decide(&inputs, &declared)?;
    Ok((ws, plan))
}

/// With `--json`, a plan that stops ([`Stop`]) is still an answer: `{"stopped": true, "reasons": [...]}` on
/// `out` (stdout), one object per crate, before the error goes to stderr and the exit status. Other errors and
/// the human form print nothing here.
pub fn report_stop(out: &mut dyn Write, json: bool, err: &anyhow::Error) -> anyhow::Result<()> {
    let Some(stop) = err.downcast_ref::<Stop>().filter(|_| json) else { return Ok(()) };
    let answer = serde_json::json!({ "stopped": true, "reasons": stop.reasons });
    writeln!(out, "{}", serde_json::to_string_pretty(&answer).context("serialising the stop")?)
        .context("writing the stop to stdout")
}

/// Runs the subcommand: prints the plan; with `execute`, applies it; with `publish` too (`--registry`), then
/// publishes when applying changed nothing.
pub fn run(root: &Path, args: &PlanArgs, execute: bool, publish: Option<Publish>) -> anyhow::Result<()> {
    let started = Instant::now();
    let computed = compute(root, args.no_semver);
    if let Err(err) = &computed {
        report_stop(&mut std::io::stdout().lock(), args.json, err)?;
    }
    let (ws, plan) = computed?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&plan).context("serialising the plan")?);
    } else {
        print!("{}", plan::render(&plan));
    }
    eprintln!("xtask: planned in {:.1?}", started.elapsed());
    if !execute {
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
    match publish {
        Some(_) if !changed.is_empty() => bail!(
            "applied the plan ({} files changed): commit them (the release commit), then run `cargo xtask release \
             --execute --registry NAME` again to publish",
            changed.len()
        ),
        Some(publish) => publish(&ws.root),
        None if changed.is_empty() => {
            eprintln!("xtask: the plan is already applied; `--registry NAME` publishes it");
            Ok(())
        }
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

#[cfg(test)]
mod tests {
    use super::report_stop;
    use crate::release::plan::decide::{Stop, StopReason};
    use crate::release::semver_check::Outcome;

    fn stop() -> anyhow::Error {
        let reason = StopReason {
            krate: "ref-graph".into(),
            since: "0.1.0".parse().expect("version"),
            semver: Outcome::Major {
                summary: "semver requires new major version".into(),
                lints: vec!["enum_variant_added".into()],
            },
            commits: vec!["other in 58084b0".into()],
            message: "ref-graph: the semver check finds a breaking change".into(),
        };
        anyhow::Error::from(Stop { reasons: vec![reason] }).context("planning")
    }

    #[test]
    fn a_stopped_plan_prints_its_reasons_as_json_on_stdout() {
        let mut out = Vec::new();
        report_stop(&mut out, true, &stop()).expect("printed");
        let json: serde_json::Value = serde_json::from_slice(&out).expect("JSON on stdout");
        assert_eq!(json["stopped"], true);
        let reason = &json["reasons"][0];
        assert_eq!(reason["crate"], "ref-graph");
        assert_eq!(reason["since"], "0.1.0");
        assert_eq!(reason["semver"]["result"], "major");
        assert_eq!(reason["semver"]["lints"][0], "enum_variant_added");
        assert_eq!(reason["commits"][0], "other in 58084b0");
        assert!(reason["message"].as_str().is_some_and(|m| m.starts_with("ref-graph: ")));

        // The human form keeps stdout empty (the reasons go to stderr with the error), and an error that is
        // not a stop prints nothing either.
        let mut out = Vec::new();
        report_stop(&mut out, false, &stop()).expect("nothing");
        report_stop(&mut out, true, &anyhow::anyhow!("cargo metadata failed")).expect("nothing");
        assert!(out.is_empty());
    }
}
