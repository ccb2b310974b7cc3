//! Finalising a crate's `CHANGELOG.md` for a release (Keep a Changelog).
//!
//! `## [Unreleased]` becomes `## [<version>] - <date>` and a fresh, empty `## [Unreleased]` goes above it.
//! The hand-written text is kept verbatim, so every section a maintainer wrote (blob-format's wire-format
//! notes, delegate-abi's ABI notes) stays where it was. Below it come what the text does not cover yet:
//! - `### Breaking changes`: the breaking changes declared after the fact in `declared-breaks.toml` (what
//!   broke, why, which commits), which no commit header says;
//! - `### Dependencies`: the dependencies whose breaking release made this one (propagated bumps);
//! - for crates with a separate section ([`special`]: blob-format's `Wire format`, delegate-abi's `ABI`),
//!   `### <section> (commits)`: the commits that touched the files defining it, kept apart from the rest;
//! - `### Commits`: every other commit since the last release that the text does not mention (by short hash
//!   or by its header). First releases list no commits: their hand-written text is the whole history.
//!
//! Finalising is idempotent: a changelog that already has a section for the version is left as it is.

use anyhow::bail;

use super::commits::Commit;
use super::declared::DeclaredBreak;

/// A changelog section kept apart from the other commits: its title and the files (prefixes, relative to the
/// repository root) whose commits belong in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Special {
    /// The section title.
    pub title: &'static str,
    /// Path prefixes of the files that define it.
    pub paths: &'static [&'static str],
}

/// The separate section of `krate`, if it has one.
pub fn special(krate: &str) -> Option<Special> {
    match krate {
        "blob-format" => Some(Special {
            title: "Wire format",
            paths: &[
                "crates/blob-format/schema/",
                "crates/blob-format/src/native/",
                "crates/blob-format/tests/golden/",
            ],
        }),
        "delegate-abi" => Some(Special {
            title: "ABI",
            paths: &[
                "crates/delegate-abi/src/abi.rs",
                "crates/delegate-abi/src/tensor.rs",
                "crates/delegate-abi/src/export.rs",
            ],
        }),
        _ => None,
    }
}

/// What goes into one release's section besides the hand-written text.
#[derive(Clone, Debug, Default)]
pub struct Entry<'a> {
    /// The version released.
    pub version: String,
    /// `YYYY-MM-DD`.
    pub date: String,
    /// The commits since the last release (empty for a first release).
    pub commits: &'a [Commit],
    /// The breaking changes declared after the fact, each one line ([`declared_item`]).
    pub breaking: Vec<String>,
    /// `dependency version` of each breaking dependency release that made this one.
    pub dependencies: Vec<String>,
    /// The crate's separate section, if any.
    pub special: Option<Special>,
}

const UNRELEASED: &str = "## [Unreleased]";

/// The finalised text. Errors when there is no `## [Unreleased]` heading to finalise.
pub fn finalise(text: &str, entry: &Entry) -> anyhow::Result<String> {
    let heading = format!("## [{}]", entry.version);
    if text.lines().any(|l| l.trim_end() == heading || l.starts_with(&format!("{heading} "))) {
        return Ok(text.to_owned());
    }
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let Some(start) = lines.iter().position(|l| l.trim_end() == UNRELEASED) else {
        bail!("no `{UNRELEASED}` heading to finalise");
    };
    let end =
        lines[start + 1..].iter().position(|l| l.starts_with("## ")).map_or(lines.len(), |i| start + 1 + i);
    let body: String = lines[start + 1..end].concat();
    let body = body.trim_matches('\n');

    let mentioned = |c: &Commit| body.contains(c.short()) || body.contains(c.subject.as_str());
    let (mut special_commits, mut other_commits) = (Vec::new(), Vec::new());
    for commit in entry.commits.iter().filter(|c| !mentioned(c)) {
        let is_special = entry
            .special
            .is_some_and(|s| commit.files.iter().any(|f| s.paths.iter().any(|p| f.starts_with(p))));
        if is_special {
            special_commits.push(commit);
        } else {
            other_commits.push(commit);
        }
    }
    // Oldest first, as a history reads.
    special_commits.reverse();
    other_commits.reverse();

    let mut out: String = lines[..start].concat();
    out.push_str(UNRELEASED);
    out.push_str("\n\n");
    out.push_str(&format!("{heading} - {}\n", entry.date));
    // The hand-written text first, verbatim; then what it does not cover.
    if !body.is_empty() {
        out.push_str(&format!("\n{body}\n"));
    }
    let mut add = |title: &str, items: Vec<String>| {
        if !items.is_empty() {
            out.push_str(&format!("\n### {title}\n"));
            for item in items {
                out.push_str(&format!("- {item}\n"));
            }
        }
    };
    add("Breaking changes", entry.breaking.clone());
    add(
        "Dependencies",
        entry.dependencies.iter().map(|d| format!("Built against {d} (a breaking release).")).collect(),
    );
    if let Some(special) = entry.special {
        add(&format!("{} (commits)", special.title), special_commits.iter().map(|c| item(c)).collect());
    }
    add("Commits", other_commits.iter().map(|c| item(c)).collect());
    if end < lines.len() {
        out.push('\n');
        out.push_str(&lines[end..].concat());
    }
    Ok(out)
}

/// A declared break as a changelog line: what broke, why, and the commits (declared after the fact).
pub fn declared_item(b: &DeclaredBreak) -> String {
    format!(
        "{} ({}; commits `{}`, declared after the fact).",
        b.summary.trim_end_matches('.'),
        b.reason.trim_end_matches('.'),
        b.commits
    )
}

fn item(commit: &Commit) -> String {
    format!("{} (`{}`)", commit.subject, commit.short())
}

#[cfg(test)]
mod tests {
    use super::{finalise, special, Entry};
    use crate::release::commits::Commit;

    const SAMPLE: &str = "# Changelog\n\nAll notable changes.\n\n## [Unreleased]\n\n### Added\n- A reader.\n\n\
                          ### Wire format\n- Format 1.0 (`fix(blob-format): golden blobs`).\n\n## [0.1.0] - 2026-01-01\n\n\
                          ### Added\n- First release.\n";

    fn commits() -> Vec<Commit> {
        // Newest first, as `git log` lists them.
        vec![
            Commit::new(
                "cccccccccc",
                "feat(blob-format): a new field",
                "",
                vec!["crates/blob-format/schema/blob.fbs".into()],
            ),
            Commit::new(
                "bbbbbbbbbb",
                "fix(blob-format): golden blobs",
                "",
                vec!["crates/blob-format/tests/golden/a".into()],
            ),
            Commit::new(
                "aaaaaaaaaa",
                "docs(blob-format): typo",
                "",
                vec!["crates/blob-format/src/lib.rs".into()],
            ),
        ]
    }

    #[test]
    fn unreleased_becomes_the_version_and_text_is_kept() {
        let commits = commits();
        let entry = Entry {
            version: "0.2.0".into(),
            date: "2026-12-01".into(),
            commits: &commits,
            breaking: vec!["Header lost a field (accepted; commits `a..b`, declared after the fact).".into()],
            dependencies: vec!["et-error 0.2.0".into()],
            special: special("blob-format"),
        };
        let out = finalise(SAMPLE, &entry).expect("finalise");
        insta::assert_snapshot!(out, @r"
        # Changelog

        All notable changes.

        ## [Unreleased]

        ## [0.2.0] - 2026-12-01

        ### Added
        - A reader.

        ### Wire format
        - Format 1.0 (`fix(blob-format): golden blobs`).

        ### Breaking changes
        - Header lost a field (accepted; commits `a..b`, declared after the fact).

        ### Dependencies
        - Built against et-error 0.2.0 (a breaking release).

        ### Wire format (commits)
        - feat(blob-format): a new field (`ccccccc`)

        ### Commits
        - docs(blob-format): typo (`aaaaaaa`)

        ## [0.1.0] - 2026-01-01

        ### Added
        - First release.
        ");
        // Idempotent: the version's section exists now.
        assert_eq!(finalise(&out, &entry).expect("again"), out);
    }

    proptest::proptest! {
        /// Whatever the hand-written text, it is kept verbatim under the version, there is one fresh
        /// `[Unreleased]`, and every commit it does not mention is listed once.
        #[test]
        fn hand_written_text_is_kept_and_commits_are_listed(
            lines in proptest::collection::vec("(### [A-Z][a-z]{1,8}|- [a-z `]{0,30}|)", 0..12),
            subjects in proptest::collection::vec("(feat|fix|docs)\\(x\\): [a-z ]{1,20}", 0..5),
        ) {
            let body = lines.join("\n");
            let text = format!("# Changelog\n\n## [Unreleased]\n\n{body}\n\n## [0.1.0] - 2026-01-01\n\n- Old.\n");
            let commits: Vec<Commit> = subjects
                .iter()
                .enumerate()
                .map(|(i, s)| Commit::new(&format!("{i:07x}{}", "9".repeat(33)), s, "", vec![]))
                .collect();
            let entry = Entry { version: "0.2.0".into(), date: "2026-12-01".into(), commits: &commits, ..Entry::default() };
            let out = finalise(&text, &entry).expect("finalise");
            proptest::prop_assert_eq!(out.matches("## [Unreleased]").count(), 1);
            proptest::prop_assert_eq!(out.matches("## [0.2.0] - 2026-12-01").count(), 1);
            proptest::prop_assert!(out.contains(body.trim_matches('\n')));
            proptest::prop_assert!(out.ends_with("## [0.1.0] - 2026-01-01\n\n- Old.\n"));
            let released = &out[out.find("## [0.2.0]").expect("heading")..out.find("## [0.1.0]").expect("old")];
            for commit in &commits {
                let mentioned = body.contains(commit.short()) || body.contains(commit.subject.as_str());
                proptest::prop_assert_eq!(released.matches(&format!("(`{}`)", commit.short())).count(), usize::from(!mentioned));
            }
            proptest::prop_assert_eq!(finalise(&out, &entry).expect("again"), out);
        }
    }

    #[test]
    fn a_first_release_keeps_the_text_only() {
        let text = "# Changelog\n\n## [Unreleased]\n\n### Added\n- First release.\n";
        let entry = Entry { version: "0.1.0".into(), date: "2026-12-01".into(), ..Entry::default() };
        let out = finalise(text, &entry).expect("finalise");
        assert_eq!(
            out,
            "# Changelog\n\n## [Unreleased]\n\n## [0.1.0] - 2026-12-01\n\n### Added\n- First release.\n"
        );
        assert!(finalise("# Changelog\n", &entry).is_err(), "nothing to finalise");
    }
}
