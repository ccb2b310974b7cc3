//! The changelog rule: a plugin whose ABI range or wire-format ranges differ from the previous release's says
//! so in its changelog.
//!
//! The rule, exactly: compare the plugin's manifest in this dist with its manifest in the previous release's
//! bundle.
//! - `abi` (min or max) differs: some section of the plugin's CHANGELOG.md newer than the previous release
//!   (`## [Unreleased]`, and any `## [X.Y.Z]` above that release's version) has a line containing the word
//!   `ABI` (upper case, as a word).
//! - `wire_formats` differ (a format added, removed, or its version range changed): such a line contains
//!   `wire format` or `wire-format` (any case).
//!
//! "The plugin's CHANGELOG" is the cdylib crate's or the delegate library crate's (`reference-delegate-dylib`
//! or `reference-delegate`): either may carry the entry. Other changes (backends, memory kinds) need no
//! entry from this gate.

use host_runtime::plugin_manifest::PluginManifest;

/// The sections of a Keep a Changelog text newer than `since`: `[Unreleased]` and every `## [version]`
/// whose version is greater, concatenated (headings included).
pub fn sections_since(changelog: &str, since: &semver::Version) -> String {
    let mut out = String::new();
    let mut keep = false;
    for line in changelog.lines() {
        if let Some(rest) = line.strip_prefix("## [") {
            let label = rest.split(']').next().unwrap_or_default();
            keep = label.eq_ignore_ascii_case("unreleased")
                || semver::Version::parse(label).is_ok_and(|version| version > *since);
        }
        if keep {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Whether `text` has a line naming the ABI (the word `ABI`).
pub fn mentions_abi(text: &str) -> bool {
    text.lines().any(|line| line.split(|c: char| !c.is_ascii_alphanumeric()).any(|word| word == "ABI"))
}

/// Whether `text` has a line naming the wire format (`wire format` / `wire-format`, any case).
pub fn mentions_wire_format(text: &str) -> bool {
    text.lines().any(|line| {
        let line = line.to_ascii_lowercase();
        line.contains("wire format") || line.contains("wire-format")
    })
}

/// What the rule finds wrong with `new` against `old` (the previous release's manifest of the same plugin,
/// released as `since`), given the changelogs that may carry the entry (`(file name, text)`); empty when
/// nothing is missing.
pub fn missing_entries(
    old: &PluginManifest,
    new: &PluginManifest,
    since: &semver::Version,
    changelogs: &[(String, String)],
) -> Vec<String> {
    let unreleased: String = changelogs.iter().map(|(_, text)| sections_since(text, since)).collect();
    let files: Vec<&str> = changelogs.iter().map(|(name, _)| name.as_str()).collect();
    let mut problems = Vec::new();
    if old.abi != new.abi && !mentions_abi(&unreleased) {
        problems.push(format!(
            "{}: ABI range {}..={} (release {since}) -> {}..={}, but no changelog entry since {since} mentions \
             \"ABI\" (looked in {})",
            new.name,
            old.abi.min,
            old.abi.max,
            new.abi.min,
            new.abi.max,
            files.join(", ")
        ));
    }
    let formats = |m: &PluginManifest| {
        let mut v: Vec<String> =
            m.wire_formats.iter().map(|w| format!("{} {}", w.format, w.versions)).collect();
        v.sort();
        v
    };
    if formats(old) != formats(new) && !mentions_wire_format(&unreleased) {
        problems.push(format!(
            "{}: wire formats [{}] (release {since}) -> [{}], but no changelog entry since {since} mentions \
             \"wire format\" (looked in {})",
            new.name,
            formats(old).join("; "),
            formats(new).join("; "),
            files.join(", ")
        ));
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHANGELOG: &str = "# Changelog\n\n## [Unreleased]\n\n### Changed\n- Faster kernels.\n\n\
                             ## [0.2.0] - 2026-12-02\n\n- Speaks ABI 2 as well.\n\n\
                             ## [0.1.0] - 2026-12-01\n\n- First release: ABI 1, wire format native 1.x.\n";

    /// Built from JSON (not a struct literal): the manifest gains optional keys over time.
    fn manifest(abi: (u32, u32), formats: &[(&str, &str)]) -> PluginManifest {
        let formats: Vec<serde_json::Value> =
            formats.iter().map(|(f, v)| serde_json::json!({"format": f, "versions": v})).collect();
        serde_json::from_value(serde_json::json!({
            "manifest_version": 1,
            "library": "libx.so",
            "sha256": "",
            "name": "x-delegate",
            "version": "0.1.0",
            "abi": {"min": abi.0, "max": abi.1},
            "backends": ["X"],
            "wire_formats": formats,
            "memory_kinds": ["host"],
            "binds_aliases_in_place": false,
            "target": "x86_64-linux",
        }))
        .expect("a manifest")
    }

    #[test]
    fn only_sections_after_the_previous_release_count() {
        let v = |s: &str| semver::Version::parse(s).expect("version");
        let since_01 = sections_since(CHANGELOG, &v("0.1.0"));
        assert!(since_01.contains("Faster kernels") && since_01.contains("Speaks ABI 2"));
        assert!(!since_01.contains("First release"));
        let since_02 = sections_since(CHANGELOG, &v("0.2.0"));
        assert!(since_02.contains("Faster kernels") && !since_02.contains("Speaks ABI 2"));
        assert!(mentions_abi(&since_01) && !mentions_abi(&since_02));
        // "ABI" as a word, upper case: "stABIlity" or "abi_stable" do not count.
        assert!(!mentions_abi("- stABIlity fixes\n- bump abi_stable\n"));
        assert!(mentions_wire_format("- Reads Wire-Format 1.1\n") && !mentions_wire_format("- wires\n"));
    }

    #[test]
    fn an_abi_or_wire_format_change_needs_its_entry() {
        let v = semver::Version::new(0, 2, 0);
        let old = manifest((1, 1), &[("native", ">=1.0, <2")]);
        let log = |text: &str| vec![("plugins/x/CHANGELOG.md".to_string(), text.to_string())];
        let quiet = log("## [Unreleased]\n- Faster.\n\n## [0.2.0]\n- ABI 2, wire format 2.\n");

        // Nothing changed: nothing needed.
        assert!(missing_entries(&old, &old, &v, &quiet).is_empty());
        // The ABI range grew: needs an entry naming the ABI.
        let wider = manifest((1, 2), &[("native", ">=1.0, <2")]);
        let problems = missing_entries(&old, &wider, &v, &quiet);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("ABI range 1..=1 (release 0.2.0) -> 1..=2"), "{}", problems[0]);
        assert!(missing_entries(&old, &wider, &v, &log("## [Unreleased]\n- Speaks ABI 2.\n")).is_empty());
        // A wire-format range changed: needs an entry naming the wire format; an ABI entry is not enough.
        let reads_more = manifest((1, 1), &[("native", ">=1.0, <3")]);
        let abi_only = log("## [Unreleased]\n- Speaks ABI 2.\n");
        let problems = missing_entries(&old, &reads_more, &v, &abi_only);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("wire formats [native >=1.0, <2] (release 0.2.0) -> [native >=1.0, <3]"));
        let entry = log("## [Unreleased]\n- Reads wire format native 2.x.\n");
        assert!(missing_entries(&old, &reads_more, &v, &entry).is_empty());
        // Either crate's changelog may carry it.
        let two = vec![
            ("a/CHANGELOG.md".to_string(), "## [Unreleased]\n".to_string()),
            ("b/CHANGELOG.md".to_string(), "## [Unreleased]\n- ABI 2.\n".to_string()),
        ];
        assert!(missing_entries(&old, &wider, &v, &two).is_empty());
    }
}
