//! Golden blobs across releases: every blob of every released wire-format version still reads, to the same
//! model.
//!
//! - blob-format's tests: `golden_models` reads every file under `tests/golden/` and the upstream fixtures and
//!   compares the decoded model (format, header, engine extent, checksums) with its committed snapshot, and
//!   fails for a snapshot whose blob is gone; `native` checks the writer still reproduces each golden blob.
//! - The release record: every golden blob (and upstream fixture) committed at a recorded `blob-format`
//!   release's commit is still committed with the same bytes (git object ids compared), so no release's blob
//!   can be dropped or rewritten along with its snapshot.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context};

use crate::release::record::Record;
use crate::util::{cargo, run_cmd};

/// The directories holding blobs that must keep reading.
pub const BLOB_DIRS: [&str; 2] =
    ["crates/blob-format/tests/golden", "crates/blob-format/tests/fixtures/upstream"];

/// Runs blob-format's golden tests and checks the blobs of every recorded blob-format release.
pub fn check(root: &Path) -> anyhow::Result<()> {
    run_cmd(
        root,
        cargo().args(["test", "-q", "-p", "blob-format", "--test", "golden_models", "--test", "native"]),
    )?;
    let record = Record::load(root)?;
    let releases: Vec<_> = record.releases.iter().filter(|r| r.krate == "blob-format").collect();
    if releases.is_empty() {
        eprintln!("compat: no blob-format release recorded yet: the committed golden blobs are the baseline");
    }
    for release in releases {
        let missing = changed_since(root, &release.commit)?;
        if !missing.is_empty() {
            bail!(
                "golden blobs of blob-format {} (commit {}) are gone or changed: {}; a released blob stays \
                 forever (add new files for a new version)",
                release.version,
                release.commit,
                missing.join(", ")
            );
        }
        eprintln!("compat: blob-format {}'s golden blobs are all still committed", release.version);
    }
    Ok(())
}

/// The blobs under [`BLOB_DIRS`] at `commit` that the working tree no longer has with the same bytes.
pub fn changed_since(root: &Path, commit: &str) -> anyhow::Result<Vec<String>> {
    let git = |args: &[&str]| -> anyhow::Result<String> {
        let out = Command::new("git").args(args).current_dir(root).output().context("running git")?;
        if !out.status.success() {
            bail!("git {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(String::from_utf8(out.stdout)?)
    };
    git(&["cat-file", "-e", &format!("{commit}^{{commit}}")]).with_context(|| {
        format!("commit {commit} of the release record is not in this clone (fetch the full history)")
    })?;
    let mut args = vec!["ls-tree", "-r", commit, "--"];
    args.extend(BLOB_DIRS);
    let mut changed = Vec::new();
    for line in git(&args)?.lines() {
        // `<mode> blob <id>\t<path>`
        let Some((meta, path)) = line.split_once('\t') else { continue };
        let id = meta.split_whitespace().nth(2).unwrap_or_default();
        let now = root.join(path);
        let same = now.is_file() && git(&["hash-object", "--", path])?.trim() == id;
        if !same {
            changed.push(path.to_owned());
        }
    }
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// At HEAD, nothing of HEAD's golden blobs changed; a rewritten file in a scratch repository is found.
    #[test]
    fn changed_golden_blobs_are_found() {
        let dir = tempfile::tempdir().expect("tempdir");
        let git = |args: &[&str]| {
            let status = Command::new("git")
                .args(["-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"])
                .args(args)
                .current_dir(dir.path())
                .output()
                .expect("git runs");
            assert!(status.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&status.stderr));
            String::from_utf8(status.stdout).expect("utf-8")
        };
        git(&["init", "-q"]);
        let golden = dir.path().join(BLOB_DIRS[0]);
        std::fs::create_dir_all(&golden).expect("dir");
        std::fs::write(golden.join("native_1_0_a.blob"), b"one").expect("write");
        std::fs::write(golden.join("native_1_0_b.blob"), b"two").expect("write");
        git(&["add", "."]);
        git(&["commit", "-q", "-m", "release"]);
        let commit = git(&["rev-parse", "HEAD"]).trim().to_owned();
        assert!(changed_since(dir.path(), &commit).expect("check").is_empty());

        std::fs::write(golden.join("native_1_0_a.blob"), b"rewritten").expect("write");
        std::fs::remove_file(golden.join("native_1_0_b.blob")).expect("remove");
        std::fs::write(golden.join("native_1_1_new.blob"), b"new").expect("write");
        let changed = changed_since(dir.path(), &commit).expect("check");
        assert_eq!(
            changed,
            [
                "crates/blob-format/tests/golden/native_1_0_a.blob",
                "crates/blob-format/tests/golden/native_1_0_b.blob"
            ]
        );
        assert!(changed_since(dir.path(), &"0".repeat(40)).is_err(), "an unknown commit is an error");
    }
}
