//! `declared-breaks.toml`: breaking changes declared after the fact.
//!
//! Commits are never rewritten, so a breaking change made by a commit whose header does not say so (`issue 19:
//! ...`, `wip`) is declared here instead: one `[[breaking]]` entry per crate and release, with what broke, why
//! it is accepted, and the commits it covers. The rule the plan applies is the commit rule's ([`super::commits`])
//! with this file as one more source: a crate's breaking change is declared when a commit since its last
//! release says so (`type(scope)!:` or a `BREAKING CHANGE:` footer) **or** an entry here names the crate and
//! that last release (`since`). A declared break asks for a major bump and is written into the crate's changelog
//! (`### Breaking changes`); a breaking change the semver check finds that neither declares stops the plan.
//!
//! Entries stay after their release as its history: once the crate is released again, `since` no longer names
//! its last release and the entry no longer applies.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use super::record::Record;

/// The file's name, at the workspace root (beside [`super::record::FILE`]).
pub const FILE: &str = "declared-breaks.toml";

/// One breaking change declared after the fact.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeclaredBreak {
    /// The package name.
    #[serde(rename = "crate")]
    pub krate: String,
    /// The release it breaks from: the entry applies while this is the crate's last release.
    pub since: semver::Version,
    /// What broke, in the user's terms (the semver check's findings, summarised).
    pub summary: String,
    /// Why it is accepted rather than undone.
    pub reason: String,
    /// The commits it covers, as a git range (`fb0d6b8..58084b0`).
    pub commits: String,
}

/// Every declared break, in file order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Declared {
    /// The entries.
    #[serde(default, rename = "breaking")]
    pub breaks: Vec<DeclaredBreak>,
}

impl Declared {
    /// The file's path in the workspace at `root`.
    pub fn path(root: &Path) -> PathBuf {
        root.join(FILE)
    }

    /// Reads the file (none: nothing declared) and checks every entry against the workspace's publishable
    /// crates (`crates`) and the release record: an entry must name a crate and one of its recorded releases,
    /// and say what, why and which commits.
    pub fn load(root: &Path, crates: &BTreeSet<String>, record: &Record) -> anyhow::Result<Declared> {
        let path = Declared::path(root);
        let declared = match std::fs::read_to_string(&path) {
            Ok(text) => toml::from_str(&text).with_context(|| format!("{}", path.display()))?,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Declared::default(),
            Err(err) => return Err(err).with_context(|| format!("reading {}", path.display())),
        };
        declared.check(crates, record).with_context(|| format!("{}", path.display()))?;
        Ok(declared)
    }

    /// The entries that apply to `krate` whose last release is `last`.
    pub fn for_release<'a>(
        &'a self,
        krate: &'a str,
        last: &'a semver::Version,
    ) -> impl Iterator<Item = &'a DeclaredBreak> + 'a {
        self.breaks.iter().filter(move |b| b.krate == krate && b.since == *last)
    }

    fn check(&self, crates: &BTreeSet<String>, record: &Record) -> anyhow::Result<()> {
        for (i, b) in self.breaks.iter().enumerate() {
            let at = format!("[[breaking]] #{} ({} since {})", i + 1, b.krate, b.since);
            if !crates.contains(&b.krate) {
                bail!("{at}: no publishable crate is named {:?}", b.krate);
            }
            if !record.releases.iter().any(|r| r.krate == b.krate && r.version == b.since) {
                bail!("{at}: releases.toml records no release {} of {}", b.since, b.krate);
            }
            for (field, value) in [("summary", &b.summary), ("reason", &b.reason), ("commits", &b.commits)] {
                if value.trim().is_empty() {
                    bail!(
                        "{at}: `{field}` is empty (say what broke, why it is accepted, and the commit range)"
                    );
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::{Declared, FILE};
    use crate::release::record::{Record, Release};

    fn record() -> Record {
        let release = |version: &str| Release {
            krate: "ref-graph".into(),
            version: version.parse().expect("version"),
            commit: "f".repeat(40),
            date: "2026-12-01".into(),
        };
        Record { releases: vec![release("0.1.0"), release("0.2.0")] }
    }

    fn load(text: &str) -> anyhow::Result<Declared> {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join(FILE), text).expect("write");
        Declared::load(dir.path(), &BTreeSet::from(["ref-graph".to_owned()]), &record())
    }

    const ENTRY: &str =
        "[[breaking]]\ncrate = \"ref-graph\"\nsince = \"0.1.0\"\nsummary = \"Op gained variants\"\n\
                         reason = \"payload 1.3\"\ncommits = \"fb0d6b8..58084b0\"\n";

    #[test]
    fn an_entry_applies_only_while_its_release_is_the_last() {
        let declared = load(ENTRY).expect("valid");
        let v = |s: &str| s.parse::<semver::Version>().expect("version");
        assert_eq!(declared.for_release("ref-graph", &v("0.1.0")).count(), 1);
        assert_eq!(declared.for_release("ref-graph", &v("0.2.0")).count(), 0);
        assert_eq!(declared.for_release("et-error", &v("0.1.0")).count(), 0);
        let none = Declared::load(
            &std::env::temp_dir().join("no-such-workspace"),
            &BTreeSet::new(),
            &Record::default(),
        )
        .expect("no file: nothing declared");
        assert!(none.breaks.is_empty());
    }

    #[test]
    fn a_bad_entry_is_named() {
        let err = |text: String| format!("{:#}", load(&text).expect_err("refused"));
        let e = err(ENTRY.replace("\"ref-graph\"", "\"ref-grph\""));
        assert!(e.contains("[[breaking]] #1 (ref-grph since 0.1.0): no publishable crate"), "{e}");
        let e = err(ENTRY.replace("0.1.0", "0.1.1"));
        assert!(e.contains("releases.toml records no release 0.1.1 of ref-graph"), "{e}");
        let e = err(ENTRY.replace("payload 1.3", " "));
        assert!(e.contains("`reason` is empty"), "{e}");
        let e = err(format!("{ENTRY}typo = 1\n"));
        assert!(e.contains(FILE) && e.contains("typo"), "{e}");
    }
}
