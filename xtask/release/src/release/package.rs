//! `cargo xtask package-check`: what `cargo publish` would upload, checked before anything is published.
//!
//! For every publishable crate, in publish order:
//! - metadata crates.io shows: `description`, `license`, `repository` (documentation is docs.rs's, by
//!   default);
//! - the packaged file list (`cargo package --list`): every git-tracked file under the crate's `tests/`
//!   (golden blobs, snapshots, corpora) is in it, unless `exclude`d;
//! - no packaged test, bench or example reaches outside the package (`"../"` paths that leave the crate
//!   directory, `#[path = "../.."]` modules): in the published crate those files do not exist;
//! - no dev-dependency cycle: a dev-dependency with a version (which `cargo publish` keeps) names a crate
//!   published before this one.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use anyhow::{bail, Context};

use super::workspace::{Crate, Workspace};
use crate::util;

/// One crate's problems, each a sentence.
#[derive(Debug, Default)]
pub struct Findings {
    /// `crate: problem` lines.
    pub problems: Vec<String>,
    /// How many crates were checked.
    pub crates: usize,
}

/// Checks every publishable crate of the workspace at `root`.
pub fn check(root: &Path) -> anyhow::Result<Findings> {
    let ws = Workspace::load(root)?;
    let order = ws.publish_order()?;
    let meta = cargo_metadata::MetadataCommand::new()
        .manifest_path(root.join("Cargo.toml"))
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    let tracked = git_files(root)?;
    let mut findings = Findings { crates: order.len(), ..Findings::default() };
    for (at, krate) in order.iter().enumerate() {
        let Some(pkg) = meta.workspace_packages().into_iter().find(|p| p.name.as_str() == krate.name) else {
            continue;
        };
        let mut problem = |text: String| findings.problems.push(format!("{}: {text}", krate.name));
        for (field, value) in [
            ("description", pkg.description.as_deref()),
            ("license", pkg.license.as_deref()),
            ("repository", pkg.repository.as_deref()),
        ] {
            if value.is_none_or(str::is_empty) {
                problem(format!("Cargo.toml has no `{field}`"));
            }
        }
        for dep in pkg.dependencies.iter().filter(|d| d.kind == cargo_metadata::DependencyKind::Development) {
            let versioned = dep.req != semver::VersionReq::STAR;
            let later = order.iter().position(|c| c.name == dep.name).is_none_or(|p| p >= at);
            if versioned && ws.crates.contains_key(&dep.name) && later {
                problem(format!(
                    "dev-depends on {} with a version, but {} is not published before it (make it path-only)",
                    dep.name, dep.name
                ));
            }
        }
        let listed = package_list(root, krate)?;
        let dir = root.join(&krate.dir);
        for file in tracked.iter().filter(|f| f.starts_with(krate.dir.join("tests"))) {
            let relative = file.strip_prefix(&krate.dir).unwrap_or(file);
            if !listed.contains(relative) && !excluded(pkg, relative) {
                problem(format!("{} is tracked but not packaged", relative.display()));
            }
        }
        for file in listed.iter().filter(|f| is_target_source(f)) {
            let text = std::fs::read_to_string(dir.join(file)).unwrap_or_default();
            for reach in outside_paths(&dir, file, &text) {
                problem(format!("{} reads {reach}, outside the package", file.display()));
            }
        }
    }
    Ok(findings)
}

/// `cargo xtask package-check`: prints the findings; any finding fails.
pub fn run(root: &Path) -> anyhow::Result<()> {
    let findings = check(root)?;
    if !findings.problems.is_empty() {
        bail!("{} packaging problems:\n  {}", findings.problems.len(), findings.problems.join("\n  "));
    }
    println!("package-check: {} publishable crates package cleanly", findings.crates);
    Ok(())
}

fn excluded(pkg: &cargo_metadata::Package, relative: &Path) -> bool {
    // `cargo metadata` does not report `exclude`; read it from the manifest.
    let text = std::fs::read_to_string(pkg.manifest_path.as_std_path()).unwrap_or_default();
    let Ok(manifest) = text.parse::<toml::Table>() else { return false };
    let patterns = manifest
        .get("package")
        .and_then(|p| p.get("exclude"))
        .and_then(|e| e.as_array())
        .cloned()
        .unwrap_or_default();
    let path = relative.to_string_lossy();
    patterns.iter().filter_map(|p| p.as_str()).any(|p| path == p || path.starts_with(&format!("{p}/")))
}

fn is_target_source(file: &Path) -> bool {
    let top = file.components().next().map(|c| c.as_os_str().to_string_lossy().into_owned());
    file.extension().is_some_and(|e| e == "rs")
        && matches!(top.as_deref(), Some("tests" | "benches" | "examples"))
}

/// String literals and `#[path]`s in `text` that start with `../` and leave `crate_dir`: resolved against the
/// file's own directory when that names an existing path inside the crate, else against the crate directory.
fn outside_paths(crate_dir: &Path, file: &Path, text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (index, _) in text.match_indices("\"../") {
        let rest = &text[index + 1..];
        let literal = &rest[..rest.find('"').unwrap_or(rest.len())];
        let from_file = crate_dir.join(file.parent().unwrap_or(Path::new(""))).join(literal);
        let from_crate = crate_dir.join(literal);
        // Relative to the file when that names something inside the crate (`include_bytes!`, `#[path]`),
        // otherwise relative to the crate (`CARGO_MANIFEST_DIR` joins).
        let file_relative = inside(crate_dir, &from_file) && from_file.exists();
        if !file_relative && !inside(crate_dir, &from_crate) {
            out.insert(literal.to_owned());
        }
    }
    out
}

/// Whether `path` (lexically normalised) stays under `dir`.
fn inside(dir: &Path, path: &Path) -> bool {
    let mut normal = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir => {
                normal.pop();
            }
            Component::CurDir => {}
            other => normal.push(other),
        }
    }
    normal.starts_with(dir)
}

fn package_list(root: &Path, krate: &Crate) -> anyhow::Result<BTreeSet<PathBuf>> {
    let out = util::cargo()
        .current_dir(root)
        .args(["package", "--list", "--allow-dirty", "-p", &krate.name])
        .output()
        .with_context(|| format!("cargo package --list -p {}", krate.name))?;
    if !out.status.success() {
        bail!("cargo package --list -p {} failed: {}", krate.name, String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).lines().map(PathBuf::from).collect())
}

fn git_files(root: &Path) -> anyhow::Result<BTreeSet<PathBuf>> {
    let listed = super::commits::git(root, &["ls-files", "-z"])?;
    Ok(listed.split('\0').filter(|f| !f.is_empty()).map(PathBuf::from).collect())
}

#[cfg(test)]
mod tests {
    use super::{inside, outside_paths};
    use std::path::Path;

    #[test]
    fn paths_that_leave_the_crate_are_found_and_paths_inside_are_not() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
        let text = r#"let x = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/x.pte");
            let y = "../src";
            #[path = "../../b/tests/support/kv.rs"] mod kv;"#;
        let found = outside_paths(dir, Path::new("src/t.rs"), text);
        assert_eq!(
            found.into_iter().collect::<Vec<_>>(),
            ["../../b/tests/support/kv.rs", "../../fixtures/x.pte"],
            "../src names the crate's own src/ from src/"
        );
        assert!(inside(Path::new("/ws/a"), Path::new("/ws/a/tests/../src/lib.rs")));
        assert!(!inside(Path::new("/ws/a"), Path::new("/ws/a/../b")));
    }

    #[test]
    fn the_workspace_packages_cleanly() {
        let findings = super::check(&crate::util::project_root()).expect("the check runs");
        assert!(findings.crates > 10, "publishable crates found: {}", findings.crates);
        assert!(findings.problems.is_empty(), "{}", findings.problems.join("\n"));
    }
}
