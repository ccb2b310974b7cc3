//! `releases.toml`: the committed record of every release.
//!
//! Tags may not travel with every clone, so the record is the source of truth: each entry names the crate, the
//! version, the commit it was cut from and the date (which `dist` also uses as every bundled file's mtime).
//! The tag of an entry is always [`Release::tag`]; `cargo xtask release --execute` creates it after recording.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// The record's file name, at the workspace root.
pub const FILE: &str = "releases.toml";

/// One released version of one crate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Release {
    /// The package name.
    #[serde(rename = "crate")]
    pub krate: String,
    /// The version released.
    pub version: semver::Version,
    /// The full commit hash the release was cut from.
    pub commit: String,
    /// The release date, `YYYY-MM-DD` (UTC).
    pub date: String,
}

impl Release {
    /// The git tag derived from this entry: `<crate>-v<version>`.
    pub fn tag(&self) -> String {
        format!("{}-v{}", self.krate, self.version)
    }
}

/// Every release, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The entries, in the order they were recorded.
    #[serde(default, rename = "release")]
    pub releases: Vec<Release>,
}

impl Record {
    /// The record's path in the workspace at `root`.
    pub fn path(root: &Path) -> PathBuf {
        root.join(FILE)
    }

    /// Reads the record; a workspace without one has released nothing.
    pub fn load(root: &Path) -> anyhow::Result<Record> {
        let path = Record::path(root);
        match std::fs::read_to_string(&path) {
            Ok(text) => toml::from_str(&text).with_context(|| format!("{}", path.display())),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(Record::default()),
            Err(err) => Err(err).with_context(|| format!("reading {}", path.display())),
        }
    }

    /// Writes the record back, with the header that says what it is.
    pub fn save(&self, root: &Path) -> anyhow::Result<()> {
        let body = toml::to_string(self).context("serialising the release record")?;
        let text = format!(
            "# Every release of every crate of this workspace, oldest first. Written by `cargo xtask release \
             --execute`;\n# git tags `<crate>-v<version>` are derived from it.\n\n{body}"
        );
        let path = Record::path(root);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
    }

    /// The latest release of `krate`, by version.
    pub fn latest(&self, krate: &str) -> Option<&Release> {
        self.releases.iter().filter(|r| r.krate == krate).max_by(|a, b| a.version.cmp(&b.version))
    }
}

#[cfg(test)]
mod tests {
    use super::{Record, Release};

    #[test]
    fn the_record_round_trips_and_derives_tags() {
        let dir = tempfile::tempdir().expect("tempdir");
        let record = Record {
            releases: vec![
                Release {
                    krate: "et-error".into(),
                    version: "0.1.0".parse().expect("version"),
                    commit: "0".repeat(40),
                    date: "2026-12-01".into(),
                },
                Release {
                    krate: "et-error".into(),
                    version: "0.2.0".parse().expect("version"),
                    commit: "1".repeat(40),
                    date: "2026-12-02".into(),
                },
            ],
        };
        record.save(dir.path()).expect("save");
        let back = Record::load(dir.path()).expect("load");
        assert_eq!(back, record);
        assert_eq!(back.latest("et-error").map(Release::tag).as_deref(), Some("et-error-v0.2.0"));
        assert!(back.latest("blob-format").is_none());
        assert_eq!(Record::load(&dir.path().join("missing")).expect("empty").releases, vec![]);
    }
}
