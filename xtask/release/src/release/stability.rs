//! Each crate's promise, read from the table in `STABILITY.md` (never repeated here).
//!
//! A row's first cell names crates in backticks (`` `et-error` ``); the word `plugins` stands for every crate
//! under `plugins/`. Names that are not crates (`*.plugin.json`) are ignored.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;

/// The file, at the workspace root.
pub const FILE: &str = "STABILITY.md";

/// A crate's tier as the table states it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tier {
    /// The tier cell verbatim (`stable wire format, evolving API`, `internal`).
    pub name: String,
}

impl Tier {
    /// `internal`: no promise beyond the ABI the plugins export.
    pub fn is_internal(&self) -> bool {
        self.name.trim().eq_ignore_ascii_case("internal")
    }

    /// `stable ABI`: the crate's version is part of the plugins' binary ABI (abi_stable writes
    /// `<crate>;<version>` into every type layout and refuses another 0.x minor, or another major), so it never
    /// takes a breaking version bump while the ABI lasts.
    pub fn is_binary_abi(&self) -> bool {
        self.name.trim().eq_ignore_ascii_case("stable ABI")
    }

    /// The tier of a crate the table does not list: treated as promising semver (never as internal).
    pub fn unlisted() -> Tier {
        Tier { name: "unlisted".into() }
    }
}

/// The tiers by crate name, and the tier of `plugins/` crates.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tiers {
    by_name: BTreeMap<String, Tier>,
    plugins: Option<Tier>,
}

impl Tiers {
    /// Reads `STABILITY.md` at `root`.
    pub fn load(root: &Path) -> anyhow::Result<Tiers> {
        let path = root.join(FILE);
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        Ok(Tiers::parse(&text))
    }

    /// Parses the table rows (`| names | tier | promise |`) of a `STABILITY.md` text.
    pub fn parse(text: &str) -> Tiers {
        let mut tiers = Tiers::default();
        for line in text.lines().map(str::trim).filter(|l| l.starts_with('|')) {
            let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
            let [names, tier, ..] = cells[..] else { continue };
            if names.eq_ignore_ascii_case("crate") || names.starts_with("---") || tier.starts_with("---") {
                continue;
            }
            let tier = Tier { name: tier.to_owned() };
            for (i, part) in names.split('`').enumerate() {
                if i % 2 == 1 {
                    tiers.by_name.insert(part.to_owned(), tier.clone());
                } else if part.split([',', ' ']).any(|word| word == "plugins") {
                    tiers.plugins = Some(tier.clone());
                }
            }
        }
        tiers
    }

    /// The tier of crate `name` living in `dir` (relative to the workspace root).
    pub fn of(&self, name: &str, dir: &Path) -> Tier {
        if let Some(tier) = self.by_name.get(name) {
            return tier.clone();
        }
        match &self.plugins {
            Some(tier) if dir.starts_with("plugins") => tier.clone(),
            _ => Tier::unlisted(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::Tiers;

    #[test]
    fn the_table_names_tiers() {
        let text = "# Stability\n\n| crate | tier | promise |\n|---|---|---|\n\
                    | `et-error` | stable | codes. |\n\
                    | `blob-format` | stable wire format, evolving API | bytes. |\n\
                    | plugin manifests (`*.plugin.json`) | stable format | keys. |\n\
                    | `cuda-rt`, `trt-exec`, plugins | internal | none. |\n";
        let tiers = Tiers::parse(text);
        assert_eq!(tiers.of("et-error", Path::new("crates/et-error")).name, "stable");
        assert_eq!(
            tiers.of("blob-format", Path::new("crates/blob-format")).name,
            "stable wire format, evolving API"
        );
        assert!(tiers.of("trt-exec", Path::new("crates/trt-exec")).is_internal());
        assert!(tiers.of("cuda-delegate", Path::new("plugins/cuda")).is_internal());
        let unlisted = tiers.of("new-crate", Path::new("crates/new-crate"));
        assert_eq!(unlisted.name, "unlisted");
        assert!(!unlisted.is_internal());
    }

    #[test]
    fn the_real_table_names_the_core_crates() {
        let tiers = Tiers::load(&crate::util::project_root()).expect("STABILITY.md");
        assert_eq!(tiers.of("et-error", Path::new("crates/et-error")).name, "stable");
        assert_eq!(tiers.of("delegate-abi", Path::new("crates/delegate-abi")).name, "stable ABI");
        assert!(tiers.of("reference-delegate", Path::new("plugins/reference")).is_internal());
        assert!(tiers.of("trt-build", Path::new("crates/trt-build")).is_internal());
        assert!(!tiers.of("host-runtime", Path::new("crates/host-runtime")).is_internal());
    }
}
