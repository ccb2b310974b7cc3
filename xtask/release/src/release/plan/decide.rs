//! [`decide`]: the pure version decision of the plan (the rule is in the parent module's docs), crate by crate
//! in publish order: what dependencies propagate, what commits and the semver check ask, the version, and who
//! depends on it.

use std::collections::BTreeSet;

use anyhow::bail;
use serde::Serialize;

use super::{CratePlan, Dependent, Input, Plan};
use crate::release::commits::Commit;
use crate::release::declared::{self, Declared};
use crate::release::record::Release;
use crate::release::semver_check::Outcome;
use crate::release::stability::Tier;
use crate::release::Bump;

/// Decides the plan. `inputs` must be in publish order (each crate after its dependencies). Fails with a
/// [`Stop`] naming every crate whose semver check finds a breaking change that neither a commit nor
/// `declared` (`declared-breaks.toml`) declares.
pub fn decide(inputs: &[Input], declared: &Declared) -> anyhow::Result<Plan> {
    let names: BTreeSet<&str> = inputs.iter().map(|i| i.name.as_str()).collect();
    let mut plans: Vec<CratePlan> = Vec::with_capacity(inputs.len());
    let mut errors = Vec::new();
    for input in inputs {
        let propagated = propagation(input, &names, &plans)?;
        let mut plan = CratePlan::start(input, &propagated);
        match &input.last {
            None => {
                plan.proposed = Some(input.version.clone());
                plan.reasons.push(format!("first release at {} (Cargo.toml)", input.version));
            }
            Some(last) => {
                plan.declared_breaks = declared.for_release(&input.name, &last.version).cloned().collect();
                if let Some(error) = decide_release(&mut plan, input, last, propagated.reasons)? {
                    errors.push(error);
                }
            }
        }
        plans.push(plan);
    }
    if !errors.is_empty() {
        return Err(Stop { reasons: errors }.into());
    }
    link_dependents(&mut plans);
    Ok(Plan { crates: plans })
}

/// What a crate's dependencies' breaking releases ask of it.
struct Propagation {
    /// The largest bump.
    bump: Bump,
    /// `name version` of each dependency whose breaking release propagates.
    from: Vec<String>,
    /// One reason per such dependency.
    reasons: Vec<String>,
}

/// The bumps `input` gets from the breaking releases of its dependencies in `planned` (the plans decided so
/// far, which must hold every dependency: the inputs come in publish order). A breaking release propagates a
/// major bump (a patch to an internal-tier crate); a first release is built against whatever its
/// dependencies release, so nothing propagates to it, nor from a dependency's first release.
fn propagation(input: &Input, names: &BTreeSet<&str>, planned: &[CratePlan]) -> anyhow::Result<Propagation> {
    let mut out = Propagation { bump: Bump::None, from: Vec::new(), reasons: Vec::new() };
    for dep in input.deps.iter().filter(|d| names.contains(d.as_str())) {
        let Some(dep_plan) = planned.iter().find(|p| p.name == *dep) else {
            bail!("{} comes before its dependency {dep}: the inputs are not in publish order", input.name);
        };
        let breaking = dep_plan.bump == Bump::Major || dep_plan.source_breaking;
        if input.last.is_none() || dep_plan.first_release || !breaking {
            continue;
        }
        let Some(version) = &dep_plan.proposed else { continue };
        let bump = if input.tier.is_internal() { Bump::Patch } else { Bump::Major };
        let why = if input.tier.is_internal() { " (internal tier)" } else { "" };
        out.bump = out.bump.max(bump);
        out.from.push(format!("{dep} {version}"));
        out.reasons.push(format!("{}: propagated from {dep} {version}{why}", bump.name()));
    }
    Ok(out)
}

/// Decides the bump and version of a crate released before as `last`: the largest of what its commits, its
/// declared breaks (`plan.declared_breaks`), its semver check and its dependencies ask. Returns the reason the
/// plan stops when the semver check finds a breaking change that neither declares.
fn decide_release(
    plan: &mut CratePlan,
    input: &Input,
    last: &Release,
    propagated: Vec<String>,
) -> anyhow::Result<Option<StopReason>> {
    if input.version < last.version {
        bail!(
            "{}: Cargo.toml says {}, older than the recorded release {}",
            input.name,
            input.version,
            last.version
        );
    }
    plan.reasons.extend(commit_reason(input, plan.commit_bump));
    let declared_bump = if plan.declared_breaks.is_empty() { Bump::None } else { Bump::Major };
    for b in &plan.declared_breaks {
        plan.reasons.push(format!("major: declared in {} ({}): {}", declared::FILE, b.commits, b.summary));
    }
    let semver_bump = input.semver.bump();
    if semver_bump > Bump::None {
        let lints = match &input.semver {
            Outcome::Major { lints, .. } if !lints.is_empty() => format!(": {}", lints.join(", ")),
            _ => String::new(),
        };
        plan.reasons.push(format!("{}: semver check{lints}", semver_bump.name()));
    }
    let error = (semver_bump == Bump::Major && plan.commit_bump.max(declared_bump) < Bump::Major)
        .then(|| undeclared_breaking(input, last));
    plan.reasons.extend(propagated);
    plan.bump = plan.commit_bump.max(declared_bump).max(semver_bump).max(plan.propagated_bump);
    cap_binary_abi(plan, input, last);
    propose(plan, input, last);
    Ok(error)
}

/// A `stable ABI` crate's breaking bump becomes the largest compatible one (patch at 0.x, minor from 1.0):
/// abi_stable refuses a layout written by another 0.x minor (or major) of the crate, so a breaking version
/// would make every plugin built with the last release unloadable in new hosts, and every new plugin in old
/// hosts. Its breaking source changes still propagate to dependents ([`CratePlan::source_breaking`]).
fn cap_binary_abi(plan: &mut CratePlan, input: &Input, last: &Release) {
    if plan.bump != Bump::Major || !input.tier.is_binary_abi() {
        return;
    }
    plan.source_breaking = true;
    plan.bump = if last.version.major == 0 { Bump::Patch } else { Bump::Minor };
    plan.reasons.push(format!(
        "{}: capped (stable ABI): the version is part of the plugins' binary ABI, so the breaking source \
         changes ship in a compatible version",
        plan.bump.name()
    ));
}

/// `minor: feat in 3f2a1c4 (+2 more)`: the first commit asking for `bump`, the largest any asks for.
fn commit_reason(input: &Input, bump: Bump) -> Option<String> {
    if bump == Bump::None {
        return None;
    }
    let first = input.commits.iter().find(|c| c.bump() == bump)?;
    let more = input.commits.iter().filter(|c| c.bump() == bump).count().saturating_sub(1);
    let more = if more > 0 { format!(" (+{more} more)") } else { String::new() };
    Some(format!("{}: {}{more}", bump.name(), first.describe()))
}

/// Why the plan stops: every crate whose breaking change nobody declares. `release --json` prints it as JSON.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Stop {
    /// One reason per crate, in publish order.
    pub reasons: Vec<StopReason>,
}

/// One crate's undeclared breaking change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StopReason {
    /// The package name.
    #[serde(rename = "crate")]
    pub krate: String,
    /// Its last release.
    pub since: semver::Version,
    /// The semver check's outcome (the breaking lints).
    pub semver: Outcome,
    /// The commits since that release, as the plan names them (`fix in 3f2a1c4`).
    pub commits: Vec<String>,
    /// The whole reason, with both ways out.
    pub message: String,
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the plan stops:")?;
        for reason in &self.reasons {
            write!(f, "\n  {}", reason.message)?;
        }
        Ok(())
    }
}

impl std::error::Error for Stop {}

/// The reason a breaking change the semver check finds and nothing since `last` declares stops the plan, with
/// both ways out.
fn undeclared_breaking(input: &Input, last: &Release) -> StopReason {
    let commits: Vec<String> = input.commits.iter().map(Commit::describe).collect();
    let message = format!(
        "{}: the semver check finds a breaking change ({}), but no commit since {} declares one ({}). Mark the \
         commit breaking (`fix(...)!:` or a `BREAKING CHANGE:` footer), or declare it after the fact in {} \
         (`[[breaking]]` crate = \"{}\", since = \"{}\", summary, reason, commits)",
        input.name,
        input.semver.describe(),
        last.version,
        if commits.is_empty() { "no commits".to_owned() } else { commits.join(", ") },
        declared::FILE,
        input.name,
        last.version
    );
    StopReason {
        krate: input.name.clone(),
        since: last.version.clone(),
        semver: input.semver.clone(),
        commits,
        message,
    }
}

/// The version `plan.bump` gives after `last` (or Cargo.toml's, when it already says more), or none and why.
fn propose(plan: &mut CratePlan, input: &Input, last: &Release) {
    let next = plan.bump.apply(&last.version);
    let proposed = next.clone().max(input.version.clone());
    if proposed > next {
        plan.reasons.push(format!("Cargo.toml already says {proposed} (not released yet)"));
    }
    if proposed > last.version {
        plan.proposed = Some(proposed);
    } else if input.commits.is_empty() {
        plan.reasons.push(format!("none: no commit since {}", last.version));
    } else {
        plan.reasons.push(format!(
            "none: the {} commit(s) since {} need no release",
            input.commits.len(),
            last.version
        ));
    }
}

/// Fills each plan's `dependents`: who needs a release because of its breaking one.
fn link_dependents(plans: &mut [CratePlan]) {
    for i in 0..plans.len() {
        let Some(version) = plans[i].proposed.clone() else { continue };
        let source = format!("{} {version}", plans[i].name);
        let dependents: Vec<Dependent> = plans
            .iter()
            .filter(|p| p.propagated_from.contains(&source))
            .map(|p| Dependent {
                name: p.name.clone(),
                bump: if p.tier_is_internal() { Bump::Patch } else { Bump::Major },
            })
            .collect();
        plans[i].dependents = dependents;
    }
}

impl CratePlan {
    /// The plan of `input` before its bump is decided: the facts, and what its dependencies propagate.
    fn start(input: &Input, propagated: &Propagation) -> CratePlan {
        CratePlan {
            name: input.name.clone(),
            dir: input.dir.clone(),
            tier: input.tier.name.clone(),
            current: input.version.clone(),
            last_release: input.last.clone(),
            first_release: input.last.is_none(),
            commits: input.commits.clone(),
            commit_count: if input.last.is_none() { input.history } else { input.commits.len() },
            commit_bump: input.commits.iter().map(Commit::bump).max().unwrap_or(Bump::None),
            semver: input.semver.clone(),
            propagated_bump: propagated.bump,
            propagated_from: propagated.from.clone(),
            bump: Bump::None,
            proposed: None,
            reasons: Vec::new(),
            declared_breaks: Vec::new(),
            source_breaking: false,
            dependents: Vec::new(),
        }
    }

    fn tier_is_internal(&self) -> bool {
        Tier { name: self.tier.clone() }.is_internal()
    }
}
