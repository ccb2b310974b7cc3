use std::collections::BTreeSet;
use std::path::PathBuf;

use proptest::prelude::*;
use semver::Version;

use super::{decide, Input, Plan, Stop};
use crate::release::commits::Commit;
use crate::release::declared::{Declared, DeclaredBreak};
use crate::release::record::Release;
use crate::release::semver_check::Outcome;
use crate::release::stability::Tier;
use crate::release::Bump;

fn v(s: &str) -> Version {
    Version::parse(s).expect("version")
}

fn release(name: &str, version: &str) -> Release {
    Release { krate: name.into(), version: v(version), commit: "f".repeat(40), date: "2026-12-01".into() }
}

fn commit(hash: &str, subject: &str) -> Commit {
    Commit::new(&format!("{hash}{}", "0".repeat(33)), subject, "", vec![])
}

fn input(
    name: &str,
    last: Option<&str>,
    commits: Vec<Commit>,
    semver: Outcome,
    tier: &str,
    deps: &[&str],
) -> Input {
    Input {
        name: name.into(),
        dir: PathBuf::from("crates").join(name),
        version: v(last.unwrap_or("0.1.0")),
        last: last.map(|l| release(name, l)),
        commits,
        history: 0,
        semver,
        tier: Tier { name: tier.into() },
        deps: deps.iter().map(|d| (*d).to_owned()).collect(),
    }
}

fn get<'a>(plan: &'a Plan, name: &str) -> &'a super::CratePlan {
    plan.crates.iter().find(|c| c.name == name).expect("in the plan")
}

#[test]
fn the_largest_reason_wins_and_breaking_propagates_by_tier() {
    let inputs = vec![
        input(
            "blob-format",
            Some("0.1.0"),
            vec![
                commit("3f2a1c4", "feat(blob-format)!: v2 header"),
                commit("1111111", "fix(blob-format): x"),
            ],
            Outcome::Major { summary: "semver requires new major version".into(), lints: vec![] },
            "stable wire format, evolving API",
            &[],
        ),
        input("cuda-rt", Some("0.1.0"), vec![], Outcome::Unchanged, "internal", &["blob-format"]),
        input(
            "host-runtime",
            Some("0.3.1"),
            vec![commit("2222222", "feat(host-runtime): y")],
            Outcome::Compatible,
            "evolving",
            &["blob-format", "cuda-rt"],
        ),
        input("delegate-host", Some("0.1.0"), vec![], Outcome::Unchanged, "stable CLI", &["host-runtime"]),
        input(
            "et-error",
            Some("0.1.0"),
            vec![commit("3333333", "docs(et-error): z")],
            Outcome::Compatible,
            "stable",
            &[],
        ),
        input("new-crate", None, vec![], Outcome::NoBaseline, "evolving", &["blob-format"]),
    ];
    let plan = decide(&inputs, &Declared::default()).expect("a plan");

    let blob = get(&plan, "blob-format");
    assert_eq!(blob.bump, Bump::Major);
    assert_eq!(blob.proposed, Some(v("0.2.0")));
    assert_eq!(blob.reasons, ["major: breaking feat in 3f2a1c4", "major: semver check"]);
    let dependents: Vec<(&str, Bump)> = blob.dependents.iter().map(|d| (d.name.as_str(), d.bump)).collect();
    assert_eq!(dependents, [("cuda-rt", Bump::Patch), ("host-runtime", Bump::Major)]);

    let cuda = get(&plan, "cuda-rt");
    assert_eq!((cuda.bump, cuda.proposed.clone()), (Bump::Patch, Some(v("0.1.1"))));
    assert_eq!(cuda.reasons, ["patch: propagated from blob-format 0.2.0 (internal tier)"]);

    let host = get(&plan, "host-runtime");
    assert_eq!((host.bump, host.proposed.clone()), (Bump::Major, Some(v("0.4.0"))));
    assert_eq!(host.reasons, ["minor: feat in 2222222", "major: propagated from blob-format 0.2.0"]);

    // Transitive: host-runtime's breaking release reaches the CLI.
    let cli = get(&plan, "delegate-host");
    assert_eq!((cli.bump, cli.proposed.clone()), (Bump::Major, Some(v("0.2.0"))));
    assert_eq!(cli.propagated_from, ["host-runtime 0.4.0"]);

    let err = get(&plan, "et-error");
    assert_eq!((err.bump, err.proposed.clone()), (Bump::None, None));
    assert_eq!(err.reasons, ["none: the 1 commit(s) since 0.1.0 need no release"]);

    // A first release keeps its version and takes nothing from its dependencies.
    let new = get(&plan, "new-crate");
    assert!(new.first_release);
    assert_eq!((new.bump, new.proposed.clone()), (Bump::None, Some(v("0.1.0"))));
    assert!(new.propagated_from.is_empty());
}

fn declared(krate: &str, since: &str) -> DeclaredBreak {
    DeclaredBreak {
        krate: krate.into(),
        since: v(since),
        summary: "a public function removed".into(),
        reason: "its commit predates conventional headers".into(),
        commits: "fb0d6b8..58084b0".into(),
    }
}

#[test]
fn an_undeclared_breaking_fix_stops_the_plan_unless_declared_after_the_fact() {
    let breaking = Outcome::Major {
        summary: "semver requires new major version".into(),
        lints: vec!["function_missing".into()],
    };
    let inputs = vec![input(
        "alias-validate",
        Some("1.2.3"),
        vec![commit("4444444", "fix(alias-validate): tighten a rule")],
        breaking,
        "evolving",
        &[],
    )];
    let err = decide(&inputs, &Declared::default()).expect_err("stops");
    let stop = err.downcast_ref::<Stop>().expect("a typed stop");
    assert_eq!(stop.reasons.len(), 1);
    assert_eq!(
        (stop.reasons[0].krate.as_str(), &stop.reasons[0].commits[..]),
        ("alias-validate", &["fix in 4444444".to_owned()][..])
    );
    let err = err.to_string();
    assert!(err.contains("alias-validate: the semver check finds a breaking change"), "{err}");
    assert!(err.contains("fix in 4444444"), "{err}");
    assert!(
        err.contains("declared-breaks.toml (`[[breaking]]` crate = \"alias-validate\", since = \"1.2.3\""),
        "{err}"
    );

    // An entry for an older release is history: it declares nothing now.
    let old = Declared { breaks: vec![declared("alias-validate", "1.2.2")] };
    assert!(decide(&inputs, &old).is_err());

    let now = Declared { breaks: vec![declared("alias-validate", "1.2.3")] };
    let plan = decide(&inputs, &now).expect("declared");
    let c = get(&plan, "alias-validate");
    assert_eq!(c.declared_breaks, now.breaks);
    assert_eq!(
        c.reasons,
        [
            "patch: fix in 4444444",
            "major: declared in declared-breaks.toml (fb0d6b8..58084b0): a public function removed",
            "major: semver check: function_missing",
        ]
    );
    assert_eq!(c.proposed, Some(v("2.0.0")));

    // A declared break the semver check does not see is still a breaking release.
    let mut quiet = inputs.clone();
    quiet[0].semver = Outcome::Compatible;
    assert_eq!(get(&decide(&quiet, &now).expect("plan"), "alias-validate").proposed, Some(v("2.0.0")));
}

#[test]
fn a_stable_abi_crate_ships_its_breaking_change_in_a_compatible_version_and_still_propagates() {
    let breaking = Outcome::Major { summary: "semver requires new major version".into(), lints: vec![] };
    let inputs = vec![
        input(
            "delegate-abi",
            Some("0.1.0"),
            vec![commit("6666666", "feat(delegate-abi)!: non_exhaustive")],
            breaking.clone(),
            "stable ABI",
            &[],
        ),
        input("host-runtime", Some("0.1.0"), vec![], Outcome::Unchanged, "evolving", &["delegate-abi"]),
    ];
    let plan = decide(&inputs, &Declared::default()).expect("plan");
    let abi = get(&plan, "delegate-abi");
    // abi_stable refuses another 0.x minor of the crate that wrote a layout: 0.2.0 would unload every plugin.
    assert_eq!((abi.bump, abi.proposed.clone(), abi.source_breaking), (Bump::Patch, Some(v("0.1.1")), true));
    assert!(abi.reasons.iter().any(|r| r.starts_with("patch: capped (stable ABI)")), "{:?}", abi.reasons);
    let host = get(&plan, "host-runtime");
    assert_eq!((host.bump, host.proposed.clone()), (Bump::Major, Some(v("0.2.0"))));
    assert_eq!(host.propagated_from, ["delegate-abi 0.1.1"]);

    // From 1.0 the major is the ABI's: a breaking change ships as a minor.
    let mut one = inputs[..1].to_vec();
    one[0].last = Some(release("delegate-abi", "1.4.2"));
    one[0].version = v("1.4.2");
    assert_eq!(
        get(&decide(&one, &Declared::default()).expect("plan"), "delegate-abi").proposed,
        Some(v("1.5.0"))
    );
}

#[test]
fn an_applied_plan_is_not_bumped_twice() {
    let mut applied = input(
        "ref-graph",
        Some("0.1.0"),
        vec![commit("5555555", "feat(ref-graph)!: new major")],
        Outcome::Skipped,
        "evolving",
        &[],
    );
    applied.version = v("0.2.0");
    let plan = decide(&[applied.clone()], &Declared::default()).expect("plan");
    assert_eq!(get(&plan, "ref-graph").proposed, Some(v("0.2.0")));
    // Docs only, but Cargo.toml was moved by an earlier --execute: that version is still to be released.
    applied.commits = vec![commit("6666666", "docs(ref-graph): x")];
    let plan = decide(&[applied], &Declared::default()).expect("plan");
    let c = get(&plan, "ref-graph");
    assert_eq!(c.proposed, Some(v("0.2.0")));
    assert!(c.reasons.iter().any(|r| r.contains("Cargo.toml already says 0.2.0")), "{:?}", c.reasons);
}

#[test]
fn a_skipped_check_never_reads_as_compatible() {
    let inputs = vec![input(
        "et-error",
        Some("0.1.0"),
        vec![commit("7777777", "fix: a")],
        Outcome::Skipped,
        "stable",
        &[],
    )];
    let plan = decide(&inputs, &Declared::default()).expect("plan");
    assert_eq!(get(&plan, "et-error").semver.describe(), "skipped (--no-semver)");
    let json = serde_json::to_value(&plan).expect("json");
    assert_eq!(json["crates"][0]["semver"]["result"], "skipped");
    assert_eq!(json["crates"][0]["bump"], "patch");
    assert_eq!(json["crates"][0]["proposed"], "0.1.1");
}

fn outcome(i: u8) -> Outcome {
    match i % 4 {
        0 => Outcome::Compatible,
        1 => Outcome::Minor { summary: "minor".into() },
        2 => Outcome::Major { summary: "major".into(), lints: vec![] },
        _ => Outcome::Skipped,
    }
}

const SUBJECTS: [&str; 5] = ["docs: a", "fix: b", "feat: c", "feat!: d", "whatever"];

prop_compose! {
    /// Up to 8 crates; crate i may depend on any crate before it (so the list is in publish order).
    fn workspace()(n in 1usize..8)(
        deps in prop::collection::vec(prop::collection::vec(any::<bool>(), 8), n),
        commits in prop::collection::vec(prop::collection::vec(0usize..5, 0..4), n),
        semver in prop::collection::vec(any::<u8>(), n),
        internal in prop::collection::vec(any::<bool>(), n),
        released in prop::collection::vec(prop::option::of((0u64..3, 0u64..3, 0u64..3)), n),
    ) -> Vec<Input> {
        (0..deps.len()).map(|i| {
            let name = format!("c{i}");
            let dep_names: Vec<String> = (0..i).filter(|&j| deps[i][j]).map(|j| format!("c{j}")).collect();
            let last = released[i].map(|(a, b, c)| format!("{a}.{b}.{c}"));
            let commits = commits[i].iter().enumerate()
                .map(|(k, &s)| commit(&format!("{i:03}{k:04}"), SUBJECTS[s])).collect();
            let mut input = input(
                &name,
                last.as_deref(),
                commits,
                if last.is_some() { outcome(semver[i]) } else { Outcome::NoBaseline },
                if internal[i] { "internal" } else { "evolving" },
                &[],
            );
            input.deps = dep_names.into_iter().collect();
            input
        }).collect()
    }
}

proptest! {
    #[test]
    fn the_version_rule_holds(inputs in workspace()) {
        let undeclared: Vec<DeclaredBreak> = inputs
            .iter()
            .filter(|i| {
                i.semver.bump() == Bump::Major
                    && i.commits.iter().map(Commit::bump).max().unwrap_or(Bump::None) < Bump::Major
            })
            .filter_map(|i| i.last.as_ref().map(|last| declared(&i.name, &last.version.to_string())))
            .collect();
        prop_assert_eq!(decide(&inputs, &Declared::default()).is_err(), !undeclared.is_empty());
        let all = Declared { breaks: undeclared };
        let plan = decide(&inputs, &all).expect("every breaking change declared");
        prop_assert_eq!(plan.crates.len(), inputs.len());
        for (input, c) in inputs.iter().zip(&plan.crates) {
            prop_assert_eq!(&input.name, &c.name);
            // Only a breaking release has dependents, and only released crates that build with it.
            prop_assert!(c.dependents.is_empty() || ((c.bump == Bump::Major || c.source_breaking) && !c.first_release));
            for dependent in &c.dependents {
                let d = inputs.iter().find(|i| i.name == dependent.name).expect("a crate");
                prop_assert!(d.last.is_some() && d.deps.contains(&c.name));
            }
            let Some(last) = &input.last else {
                prop_assert_eq!(c.proposed.as_ref(), Some(&input.version));
                continue;
            };
            let commit_bump = input.commits.iter().map(Commit::bump).max().unwrap_or(Bump::None);
            let mut propagated = Bump::None;
            for dep in &input.deps {
                let d = plan.crates.iter().find(|p| &p.name == dep).expect("dep planned");
                if !d.first_release && d.bump == Bump::Major {
                    propagated = propagated.max(if input.tier.is_internal() { Bump::Patch } else { Bump::Major });
                    prop_assert!(d.dependents.iter().any(|x| x.name == c.name));
                }
            }
            prop_assert_eq!(c.bump, commit_bump.max(input.semver.bump()).max(propagated));
            match &c.proposed {
                Some(next) => {
                    prop_assert!(next > &last.version);
                    prop_assert_eq!(next, &c.bump.apply(&last.version));
                }
                None => prop_assert_eq!(c.bump, Bump::None),
            }
            prop_assert_eq!(c.reasons.is_empty(), false);
        }
    }
}

#[test]
fn the_real_workspace_plans_every_publishable_crate_in_publish_order() {
    let root = crate::util::project_root();
    let (ws, plan) = crate::release::command::compute(&root, true).expect("a plan");
    let order: Vec<&str> = ws.publish_order().expect("order").iter().map(|c| c.name.as_str()).collect();
    let planned: Vec<&str> = plan.crates.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(planned, order);
    assert!(planned.contains(&"blob-format") && !planned.contains(&"xtask"));
    let record = crate::release::record::Record::load(&root).expect("record");
    for c in &plan.crates {
        assert_eq!(c.first_release, record.latest(&c.name).is_none(), "{}", c.name);
        if c.first_release {
            assert_eq!(c.proposed.as_ref(), Some(&c.current), "{}", c.name);
        } else {
            assert!(
                !matches!(c.semver, Outcome::Compatible),
                "--no-semver never says compatible: {}",
                c.name
            );
        }
    }
    let text = super::render(&plan);
    assert!(text.contains("blob-format"), "{text}");
}

#[test]
fn versions_are_rewritten_in_place() {
    let root = crate::util::project_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let manifest = dir.path().join("Cargo.toml");
    std::fs::copy(root.join("crates/blob-format/Cargo.toml"), &manifest).expect("copy");
    let before = std::fs::read_to_string(&manifest).expect("read");
    // Whatever blob-format's version is today, only that line changes.
    let current = before.lines().find(|l| l.starts_with("version = ")).expect("a version line").to_owned();
    let after = super::set_package_version(&before, &v("9.9.9")).expect("rewrite");
    std::fs::write(&manifest, &after).expect("write");
    let changed: Vec<(&str, &str)> = before.lines().zip(after.lines()).filter(|(a, b)| a != b).collect();
    assert_eq!(changed, [(current.as_str(), "version = \"9.9.9\"")]);
    assert_eq!(before.lines().count(), after.lines().count());

    let workspace = std::fs::read_to_string(root.join("Cargo.toml")).expect("read");
    let line = workspace.lines().find(|l| l.starts_with("blob-format = ")).expect("a requirement").to_owned();
    let after = super::set_workspace_dependency(&workspace, "blob-format", &v("9.9.9")).expect("rewrite");
    let changed: Vec<(&str, &str)> = workspace.lines().zip(after.lines()).filter(|(a, b)| a != b).collect();
    let expected = format!("{}version = \"9.9.9\" }}", &line[..line.find("version = ").expect("versioned")]);
    assert_eq!(changed, [(line.as_str(), expected.as_str())]);
    let inherited = "[package]\nname = \"x\"\nversion.workspace = true\n";
    assert!(super::set_package_version(inherited, &v("0.2.0")).is_err());
}

#[test]
fn apply_writes_versions_requirements_and_changelogs() {
    use crate::release::workspace::{Crate, Workspace};
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    std::fs::create_dir_all(root.join("crates/a")).expect("mkdir");
    std::fs::write(
        root.join("Cargo.toml"),
        "[workspace]\nmembers = [\"crates/a\"]\n\n[workspace.dependencies]\n# Ours.\na = { path = \"crates/a\", version = \"0.1.0\" } # keep\n",
    )
    .expect("write");
    std::fs::write(
        root.join("crates/a/Cargo.toml"),
        "[package]\nname = \"a\"\nversion = \"0.1.0\" # the version\n",
    )
    .expect("write");
    std::fs::write(
        root.join("crates/a/CHANGELOG.md"),
        "# Changelog\n\n## [Unreleased]\n\n### Fixed\n- A bug.\n",
    )
    .expect("write");
    let krate = Crate {
        name: "a".into(),
        version: v("0.1.0"),
        dir: "crates/a".into(),
        publishable: true,
        deps: BTreeSet::new(),
    };
    let ws = Workspace { root: root.to_path_buf(), crates: [("a".to_owned(), krate)].into_iter().collect() };
    let inputs = vec![input(
        "a",
        Some("0.1.0"),
        vec![commit("8888888", "fix(a): a bug")],
        Outcome::Skipped,
        "evolving",
        &[],
    )];
    let plan = decide(&inputs, &Declared::default()).expect("plan");
    let changed = super::apply(&ws, &plan, "2026-12-01").expect("apply");
    assert_eq!(changed.len(), 3, "{changed:?}");
    let read = |p: &str| std::fs::read_to_string(root.join(p)).expect("read");
    assert_eq!(read("crates/a/Cargo.toml"), "[package]\nname = \"a\"\nversion = \"0.1.1\" # the version\n");
    assert!(read("Cargo.toml").contains("a = { path = \"crates/a\", version = \"0.1.1\" } # keep\n"));
    assert_eq!(
        read("crates/a/CHANGELOG.md"),
        "# Changelog\n\n## [Unreleased]\n\n## [0.1.1] - 2026-12-01\n\n### Fixed\n- A bug.\n\n### Commits\n- fix(a): a bug (`8888888`)\n"
    );
    // Applying again changes nothing.
    let mut again = plan.clone();
    again.crates[0].current = v("0.1.1");
    assert!(super::apply(&ws, &again, "2026-12-01").expect("apply").is_empty());
}

#[test]
fn today_is_the_utc_date_releases_record() {
    let today = super::today();
    let date: jiff::civil::Date = today.parse().expect("YYYY-MM-DD");
    assert_eq!(today.len(), 10, "{today}");
    assert!(date.year() >= 2026, "{today}");
}
