//! Releases of the workspace's independently versioned crates: the shared model.
//!
//! - [`workspace`]: which crates are published, their internal dependency edges and the order to publish in
//!   (read from `cargo metadata`, never listed by hand).
//! - [`record`]: `releases.toml`, the committed record of every release. Tags (`<crate>-v<version>`) are
//!   derived from it, so a fresh clone without tags still knows what was released, and from which commit.
//! - [`plan`]: `cargo xtask release`: the proposed version of every crate and why ([`commits`] classifies
//!   `git log`, [`semver_check`] runs cargo-semver-checks against cached baselines, [`stability`] reads the
//!   tiers, [`declared`] reads the breaking changes declared after the fact), and `--execute`'s writes ([`plan::apply`]: versions, requirements, [`changelog`]s).
//! - [`package`]: `cargo xtask package-check`: metadata, packaged files, tests that reach outside the
//!   package, dev-dependency cycles.
//! - [`command`]: the `release` subcommand: plan, print, and with `--execute`, apply and publish.
//! - [`publish`]: `release --execute --registry NAME`, the ordered, resumable publish; [`index`] reads what a
//!   sparse registry already has; `registry` (tests only) is a loopback sparse registry to publish to.

pub mod changelog;
pub mod command;
pub mod commits;
pub mod declared;
pub mod index;
pub mod package;
pub mod plan;
pub mod publish;
#[cfg(test)]
mod publish_e2e;
pub mod record;
#[cfg(test)]
pub mod registry;
pub mod semver_check;
pub mod stability;
pub mod workspace;

/// How much a crate's version must move. Ordered: the plan takes the largest of the reasons it finds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Bump {
    /// Nothing changed that needs a release.
    None,
    /// Compatible fixes.
    Patch,
    /// Compatible additions.
    Minor,
    /// Breaking changes.
    Major,
}

impl Bump {
    /// The next version after `current` for this bump, with Cargo's 0.x rule: while the major is 0, a breaking
    /// change bumps the minor and anything else bumps the patch (0.0.x: every change is breaking).
    pub fn apply(self, current: &semver::Version) -> semver::Version {
        use semver::Version;
        let (major, minor, patch) = (current.major, current.minor, current.patch);
        match (self, major, minor) {
            (Bump::None, ..) => current.clone(),
            (_, 0, 0) => Version::new(0, 0, patch + 1),
            (Bump::Major, 0, _) => Version::new(0, minor + 1, 0),
            (Bump::Minor | Bump::Patch, 0, _) => Version::new(0, minor, patch + 1),
            (Bump::Major, ..) => Version::new(major + 1, 0, 0),
            (Bump::Minor, ..) => Version::new(major, minor + 1, 0),
            (Bump::Patch, ..) => Version::new(major, minor, patch + 1),
        }
    }

    /// The lower-case name used in plans and `--json`.
    pub fn name(self) -> &'static str {
        match self {
            Bump::None => "none",
            Bump::Patch => "patch",
            Bump::Minor => "minor",
            Bump::Major => "major",
        }
    }
}

impl serde::Serialize for Bump {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::Bump;
    use semver::Version;

    #[test]
    fn zero_major_versions_bump_the_minor_for_breaking_changes() {
        let v = |s: &str| Version::parse(s).expect("version");
        assert_eq!(Bump::Major.apply(&v("0.1.3")), v("0.2.0"));
        assert_eq!(Bump::Minor.apply(&v("0.1.3")), v("0.1.4"));
        assert_eq!(Bump::Patch.apply(&v("0.1.3")), v("0.1.4"));
        assert_eq!(Bump::Minor.apply(&v("0.0.3")), v("0.0.4"));
        assert_eq!(Bump::Major.apply(&v("1.2.3")), v("2.0.0"));
        assert_eq!(Bump::Minor.apply(&v("1.2.3")), v("1.3.0"));
        assert_eq!(Bump::Patch.apply(&v("1.2.3")), v("1.2.4"));
        assert_eq!(Bump::None.apply(&v("1.2.3")), v("1.2.3"));
    }
}
