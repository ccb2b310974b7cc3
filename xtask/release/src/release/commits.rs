//! The commits a release is made of: read from `git log`, classified by their conventional-commit header.
//!
//! The rule (what each commit asks of the crates whose directory it touches):
//! - `type(scope)!:` or a `BREAKING CHANGE:` / `BREAKING-CHANGE:` footer: [`Bump::Major`], whatever the type.
//! - `feat`: [`Bump::Minor`].
//! - `fix`, `perf`, `refactor`, `revert`, `build`, `deps`: [`Bump::Patch`] (the published code changed).
//! - `docs`, `test`/`tests`, `bench`, `chore`, `ci`, `style`, `fuzz`: [`Bump::None`] (nothing a user of the
//!   crate builds against changed; such commits are still listed in the plan and the changelog).
//! - Anything else, including headers that are not conventional (older commits, `wip: ...`): "other",
//!   [`Bump::Patch`]: the crate's files changed and nobody said how, so it is released, but never as more
//!   than a fix. A change that is really breaking is caught by the semver check, which then stops the plan.
//!
//! Merge commits are skipped: their changes are in the commits they merge.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context};
use serde::Serialize;

use super::Bump;

/// One commit touching a crate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Commit {
    /// The full hash.
    pub hash: String,
    /// The header line.
    pub subject: String,
    /// The conventional type, lower-cased (`feat`, `fix`, ...), or `other` when the header is not conventional.
    pub kind: String,
    /// The scope between parentheses, if any.
    pub scope: Option<String>,
    /// `!` after the type/scope, or a `BREAKING CHANGE` footer.
    pub breaking: bool,
    /// The files it changed, relative to the repository root (used to file changelog entries).
    #[serde(skip)]
    pub files: Vec<String>,
}

/// A parsed conventional-commit header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// The type, lower-cased, or `other` when the header is not conventional.
    pub kind: String,
    /// The scope, if any.
    pub scope: Option<String>,
    /// Whether the header or the body says the change is breaking.
    pub breaking: bool,
}

/// Parses a commit message's header line and body.
pub fn parse(subject: &str, body: &str) -> Header {
    let breaking_footer = body.lines().any(|line| {
        let line = line.trim_start();
        line.starts_with("BREAKING CHANGE:") || line.starts_with("BREAKING-CHANGE:")
    });
    let other = || Header { kind: "other".into(), scope: None, breaking: breaking_footer };
    let Some((head, rest)) = subject.split_once(':') else { return other() };
    if !rest.starts_with(' ') || rest.trim().is_empty() {
        return other();
    }
    let (head, bang) = match head.strip_suffix('!') {
        Some(head) => (head, true),
        None => (head, false),
    };
    let (kind, scope) = match head.split_once('(') {
        Some((kind, scope)) => match scope.strip_suffix(')') {
            Some(scope) if !scope.is_empty() && !scope.contains(['(', ')']) => (kind, Some(scope.to_owned())),
            _ => return other(),
        },
        None => (head, None),
    };
    if kind.is_empty() || !kind.chars().all(|c| c.is_ascii_alphabetic()) {
        return other();
    }
    Header { kind: kind.to_ascii_lowercase(), scope, breaking: bang || breaking_footer }
}

impl Commit {
    /// Builds a commit from its hash, message and files.
    pub fn new(hash: &str, subject: &str, body: &str, files: Vec<String>) -> Commit {
        let header = parse(subject, body);
        Commit {
            hash: hash.to_owned(),
            subject: subject.to_owned(),
            kind: header.kind,
            scope: header.scope,
            breaking: header.breaking,
            files,
        }
    }

    /// What this commit asks of the crate (see the module docs for the rule).
    pub fn bump(&self) -> Bump {
        if self.breaking {
            return Bump::Major;
        }
        match self.kind.as_str() {
            "feat" => Bump::Minor,
            "docs" | "doc" | "test" | "tests" | "bench" | "chore" | "ci" | "style" | "fuzz" => Bump::None,
            // fix, perf, refactor, revert, build, deps, and everything that is not conventional.
            _ => Bump::Patch,
        }
    }

    /// The first 7 characters of the hash.
    pub fn short(&self) -> &str {
        self.hash.get(..7).unwrap_or(&self.hash)
    }

    /// How the commit is named in a reason: `feat in 3f2a1c4`, `breaking fix in 3f2a1c4`.
    pub fn describe(&self) -> String {
        let kind = if self.breaking { format!("breaking {}", self.kind) } else { self.kind.clone() };
        format!("{kind} in {}", self.short())
    }
}

/// The commits since `since` (exclusive; `None`: all of history) that touch `dir`, newest first, merges skipped.
pub fn log(root: &Path, since: Option<&str>, dir: &Path) -> anyhow::Result<Vec<Commit>> {
    let range = match since {
        Some(commit) => {
            ensure_commit(root, commit)?;
            format!("{commit}..HEAD")
        }
        None => "HEAD".to_owned(),
    };
    let out = git(
        root,
        &[
            "log",
            "--no-merges",
            "--name-only",
            "--format=%x1e%H%x1f%s%x1f%b%x1f",
            &range,
            "--",
            &dir.to_string_lossy(),
        ],
    )?;
    let mut commits = Vec::new();
    for record in out.split('\x1e').filter(|r| !r.trim().is_empty()) {
        let fields: Vec<&str> = record.splitn(4, '\x1f').collect();
        let [hash, subject, body, files] = fields[..] else {
            bail!("unexpected `git log` output: {record:?}");
        };
        let files = files.lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_owned).collect();
        commits.push(Commit::new(hash.trim(), subject, body, files));
    }
    Ok(commits)
}

/// How many commits of all history touch `dir` (for first releases, whose commits are not listed).
pub fn count(root: &Path, dir: &Path) -> anyhow::Result<usize> {
    let out = git(root, &["rev-list", "--no-merges", "--count", "HEAD", "--", &dir.to_string_lossy()])?;
    out.trim().parse().with_context(|| format!("`git rev-list --count` printed {out:?}"))
}

fn ensure_commit(root: &Path, commit: &str) -> anyhow::Result<()> {
    let spec = format!("{commit}^{{commit}}");
    git(root, &["rev-parse", "--verify", "--quiet", &spec]).with_context(|| {
        format!(
            "the recorded release commit {commit} is not in this clone's history (a shallow clone? run \
             `git fetch --unshallow`)"
        )
    })?;
    Ok(())
}

/// Runs git in `root` and returns its standard output; a failure is an error naming the command.
pub fn git(root: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(root)
        .output()
        .with_context(|| format!("cannot run git {}", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "`git {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    String::from_utf8(out.stdout).context("git printed something that is not UTF-8")
}

#[cfg(test)]
mod tests {
    use super::{parse, Commit, Header};
    use crate::release::Bump;

    fn header(kind: &str, scope: Option<&str>, breaking: bool) -> Header {
        Header { kind: kind.into(), scope: scope.map(Into::into), breaking }
    }

    #[test]
    fn conventional_headers_parse() {
        assert_eq!(parse("feat(host-runtime): a thing", ""), header("feat", Some("host-runtime"), false));
        assert_eq!(parse("fix: a bug", ""), header("fix", None, false));
        assert_eq!(parse("feat(blob-format)!: new major", ""), header("feat", Some("blob-format"), true));
        assert_eq!(parse("refactor!: drop x", ""), header("refactor", None, true));
        assert_eq!(parse("Docs(x): Capital", ""), header("docs", Some("x"), false));
        assert_eq!(
            parse("fix(abi): y", "Some text.\n\nBREAKING CHANGE: the table moved"),
            header("fix", Some("abi"), true)
        );
        assert_eq!(parse("fix(abi): y", "BREAKING-CHANGE: z"), header("fix", Some("abi"), true));
    }

    #[test]
    fn other_headers_are_other() {
        for subject in [
            "Merge branch 'bridge' into integrate",
            "bench: bytes copied: per step", // conventional, kept below
            "update readme",
            "feat(: broken scope",
            "feat(): empty scope",
            "fix:no space",
            "fix: ",
            "two words: not a type",
            "",
        ] {
            let parsed = parse(subject, "");
            if subject.starts_with("bench") {
                assert_eq!(parsed, header("bench", None, false));
            } else {
                assert_eq!(parsed.kind, "other", "{subject:?}");
                assert!(!parsed.breaking);
            }
        }
        assert!(parse("random words", "BREAKING CHANGE: yes").breaking);
    }

    #[test]
    fn commit_bumps_follow_the_rule() {
        let bump = |subject: &str, body: &str| Commit::new("0123456789", subject, body, vec![]).bump();
        assert_eq!(bump("feat(x): a", ""), Bump::Minor);
        assert_eq!(bump("fix(x): a", ""), Bump::Patch);
        assert_eq!(bump("perf: a", ""), Bump::Patch);
        assert_eq!(bump("refactor(x): a", ""), Bump::Patch);
        assert_eq!(bump("docs(x): a", ""), Bump::None);
        assert_eq!(bump("test(x): a", ""), Bump::None);
        assert_eq!(bump("chore: a", ""), Bump::None);
        assert_eq!(bump("wip", ""), Bump::Patch);
        assert_eq!(bump("docs(x)!: a", ""), Bump::Major);
        assert_eq!(bump("fix(x): a", "BREAKING CHANGE: b"), Bump::Major);
        let commit = Commit::new("0123456789abcdef", "fix(x)!: a", "", vec![]);
        assert_eq!(commit.short(), "0123456");
        assert_eq!(commit.describe(), "breaking fix in 0123456");
    }
}
