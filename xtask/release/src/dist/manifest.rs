//! `dist-manifest.json`: every artifact of one dist with its SHA-256, version, files and what it is; each
//! bundle's [`Epoch`] (the mtime of its entries) and the provenance a dist records (commit, rustc).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context};
use host_runtime::plugin_manifest::PluginManifest;
use serde::{Deserialize, Serialize};

use crate::release::record::Record;

/// `dist-manifest.json`'s format version.
pub const DIST_MANIFEST_VERSION: u32 = 1;
/// The file listing a dist's artifacts.
pub const DIST_MANIFEST: &str = "dist-manifest.json";

/// `dist-manifest.json`: every artifact of one dist (in the spirit of cargo-dist's).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DistManifest {
    /// [`DIST_MANIFEST_VERSION`].
    pub dist_version: u32,
    /// The commit built.
    pub commit: String,
    /// The target triple built for.
    pub target: String,
    /// `rustc -V` of the toolchain that built it.
    pub rustc: String,
    /// The archives, by name.
    pub artifacts: Vec<Artifact>,
}

/// One archive of a dist.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Artifact {
    /// The archive's file name.
    pub name: String,
    /// `plugin` or `host`.
    pub kind: String,
    /// The crate it was built from.
    #[serde(rename = "crate")]
    pub krate: String,
    /// That crate's version.
    pub version: String,
    /// SHA-256 of the archive.
    pub sha256: String,
    /// Every entry's mtime.
    pub epoch: Epoch,
    /// The files inside (below the archive's top directory) and their SHA-256.
    pub files: BTreeMap<String, String>,
    /// The plugin's manifest (plugins only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin: Option<PluginManifest>,
    /// The ABI range and root interface version the host speaks (host only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<HostAbi>,
}

/// What a host bundle speaks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostAbi {
    /// Oldest ABI version.
    pub abi_min: u32,
    /// Newest ABI version.
    pub abi_max: u32,
    /// abi_stable's root-module interface version (permanent).
    pub root_interface_version: String,
}

impl DistManifest {
    /// Reads `dist-manifest.json` in `dir`.
    pub fn load(dir: &Path) -> anyhow::Result<DistManifest> {
        let path = dir.join(DIST_MANIFEST);
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("{}", path.display()))
    }
}

/// Where a bundle's mtime comes from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EpochSource {
    /// The crate's version is recorded in `releases.toml`: its date, 00:00 UTC.
    Release,
    /// `SOURCE_DATE_EPOCH`.
    SourceDateEpoch,
    /// The HEAD commit's committer time.
    HeadCommit,
}

/// The modification time of every entry of a bundle, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Epoch {
    /// Seconds since the Unix epoch.
    pub seconds: u64,
    /// Where it came from.
    pub source: EpochSource,
}

/// The epoch of `krate` at `version`: its release date from `record`, else `SOURCE_DATE_EPOCH`, else the
/// HEAD commit's time (`head`).
pub fn epoch_for(
    record: &Record,
    krate: &str,
    version: &semver::Version,
    source_date_epoch: Option<&str>,
    head: u64,
) -> anyhow::Result<Epoch> {
    if let Some(release) = record.releases.iter().find(|r| r.krate == krate && r.version == *version) {
        let seconds = date_to_epoch(&release.date)
            .with_context(|| format!("releases.toml: {} {} has date {:?}", krate, version, release.date))?;
        return Ok(Epoch { seconds, source: EpochSource::Release });
    }
    if let Some(value) = source_date_epoch.filter(|v| !v.is_empty()) {
        let seconds =
            value.trim().parse().with_context(|| format!("SOURCE_DATE_EPOCH={value:?} is not a number"))?;
        return Ok(Epoch { seconds, source: EpochSource::SourceDateEpoch });
    }
    Ok(Epoch { seconds: head, source: EpochSource::HeadCommit })
}

/// `YYYY-MM-DD` as seconds since the Unix epoch at 00:00 UTC (proleptic Gregorian calendar).
pub fn date_to_epoch(date: &str) -> anyhow::Result<u64> {
    let day: jiff::civil::Date =
        date.parse().with_context(|| format!("{date:?} is not a YYYY-MM-DD date"))?;
    let seconds = day.to_zoned(jiff::tz::TimeZone::UTC)?.timestamp().as_second();
    u64::try_from(seconds).map_err(|_| anyhow::anyhow!("{date:?} is not a date from 1970 on"))
}

/// The HEAD commit's hash (with `+dirty` when tracked files differ from it: such a build is not the commit's)
/// and its committer time.
pub fn head_commit(root: &Path) -> anyhow::Result<(String, u64)> {
    let out = Command::new("git")
        .args(["log", "-1", "--format=%H %ct", "HEAD"])
        .current_dir(root)
        .output()
        .context("running git log")?;
    if !out.status.success() {
        bail!("git log failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    let text = String::from_utf8(out.stdout)?;
    let (hash, time) = text.trim().split_once(' ').context("git log printed no hash and time")?;
    let clean = Command::new("git")
        .args(["diff", "--quiet", "HEAD", "--"])
        .current_dir(root)
        .status()
        .context("running git diff")?
        .success();
    let hash = if clean { hash.to_owned() } else { format!("{hash}+dirty") };
    Ok((hash, time.parse()?))
}

/// The host triple and version of the rustc that cargo runs (`rustc -vV`).
pub fn rustc_info() -> anyhow::Result<(String, String)> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let out = Command::new(rustc).arg("-vV").output().context("running rustc -vV")?;
    let text = String::from_utf8(out.stdout)?;
    let version = text.lines().next().unwrap_or_default().to_owned();
    let host = text
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .context("rustc -vV printed no host line")?
        .to_owned();
    Ok((host, version))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::release::record::Release;

    #[test]
    fn dates_become_utc_midnight_epochs() {
        assert_eq!(date_to_epoch("1970-01-01").expect("date"), 0);
        assert_eq!(date_to_epoch("2000-03-01").expect("date"), 951_868_800);
        assert_eq!(date_to_epoch("2024-02-29").expect("date"), 1_709_164_800);
        assert_eq!(date_to_epoch("2026-12-01").expect("date"), 1_796_083_200);
        for bad in ["2026-13-01", "2025-02-29", "2026-12", "1969-12-31", "x-1-1"] {
            assert!(date_to_epoch(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_epoch_is_the_release_date_then_source_date_epoch_then_head() {
        let v = semver::Version::new(0, 1, 0);
        let record = Record {
            releases: vec![Release {
                krate: "delegate-host".into(),
                version: v.clone(),
                commit: "0".repeat(40),
                date: "2026-12-01".into(),
            }],
        };
        let epoch = |krate: &str, sde: Option<&str>| epoch_for(&record, krate, &v, sde, 42).expect("epoch");
        assert_eq!(
            epoch("delegate-host", Some("7")),
            Epoch { seconds: 1_796_083_200, source: EpochSource::Release }
        );
        assert_eq!(epoch("other", Some("7")), Epoch { seconds: 7, source: EpochSource::SourceDateEpoch });
        assert_eq!(epoch("other", None), Epoch { seconds: 42, source: EpochSource::HeadCommit });
        // Another version of a released crate is not released yet.
        let next = semver::Version::new(0, 2, 0);
        assert_eq!(epoch_for(&record, "delegate-host", &next, None, 42).expect("epoch").seconds, 42);
        assert!(epoch_for(&record, "other", &v, Some("soon"), 42).is_err());
    }
}
