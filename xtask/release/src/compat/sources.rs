//! Sources keep building: the plugin and embedder sources an out-of-tree author wrote from a release's docs,
//! built against today's crates.
//!
//! Each `xtask/compat-sources/<version>/` holds crates written from that release's guides (a delegate library, its
//! thin `cdylib`, an application embedding host-runtime), each its own package depending on this repository as the
//! guide says, through `../kv-delegate/crates/...` paths. The gate copies them into a scratch directory beside a
//! link named `kv-delegate` to this tree, gives each this tree's `Cargo.lock` (the same dependency versions), and
//! checks each (`cargo check`: the sources compile against today's public items, which is what the gate is about;
//! nothing is linked, so the gate costs no binaries on disk) into `<target>/compat-sources`, kept between runs. A
//! failure names the era and package and quotes the compiler's errors. The sources are never edited: a public change
//! that breaks them fails the gate, and is kept compatible instead (a constructor for a growing struct, a replaced
//! function kept one release as a `#[deprecated]` shim). Only a breaking release that declares the change
//! (`declared-breaks.toml` or a `!` commit) retires a directory, and its CHANGELOG says how to migrate.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

/// Where the sources are kept, relative to the workspace root.
pub const DIR: &str = "xtask/compat-sources";

/// Every `xtask/compat-sources/<version>/` directory, oldest first.
pub fn eras(root: &Path) -> anyhow::Result<Vec<(semver::Version, PathBuf)>> {
    super::versioned_dirs(&root.join(DIR), Path::is_dir)
}

/// Checks every era's sources against the tree at `root`; fails naming the first era that no longer compiles,
/// with the compiler's errors.
pub fn check(root: &Path) -> anyhow::Result<()> {
    let target = crate::util::target_dir(root)?.join("compat-sources");
    for (version, dir) in eras(root)? {
        // Outside the tree: inside it, cargo would take the copied packages for members of this workspace.
        let scratch = tempfile::Builder::new().prefix("compat-sources").tempdir()?;
        for package in lay_out(root, &dir, scratch.path())? {
            let name = dir.join(package.file_name().unwrap_or_default());
            let name = name.strip_prefix(root).unwrap_or(&name).display().to_string();
            check_package(&package, &target).with_context(|| {
                format!(
                    "compat: {name}, written from release {version}'s docs, no longer compiles against this \
                     tree: keep the public items it uses (a replaced function stays one release as a \
                     #[deprecated] shim), or declare the break"
                )
            })?;
        }
        eprintln!("compat: the sources written from release {version}'s docs compile against this tree");
    }
    Ok(())
}

/// `cargo check` of one copied package into `target`; the compiler's error lines in the error when it fails
/// (a log's tail then shows them, not only cargo's summary).
fn check_package(package: &Path, target: &Path) -> anyhow::Result<()> {
    let mut cmd = crate::util::cargo();
    cmd.args(["check", "--message-format=short", "--manifest-path"])
        .arg(package.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target)
        .current_dir(package);
    eprintln!("$ cargo check --manifest-path {}", package.join("Cargo.toml").display());
    let output = cmd.output().context("cannot start cargo")?;
    let log = String::from_utf8_lossy(&output.stderr);
    eprint!("{log}");
    if !output.status.success() {
        let errors: Vec<&str> = log.lines().filter(|l| l.contains("error")).collect();
        bail!("cargo check failed ({}):\n  {}", output.status, errors.join("\n  "));
    }
    Ok(())
}

/// Copies the era's packages into `scratch` beside a `kv-delegate` link to `root`, each with this tree's lock
/// file; returns the copied packages' directories, sorted.
fn lay_out(root: &Path, era: &Path, scratch: &Path) -> anyhow::Result<Vec<PathBuf>> {
    copy_tree(era, scratch)?;
    std::os::unix::fs::symlink(root, scratch.join("kv-delegate")).context("linking kv-delegate")?;
    let mut packages = Vec::new();
    for entry in std::fs::read_dir(scratch)? {
        let path = entry?.path();
        if path.join("Cargo.toml").is_file() && !path.ends_with("kv-delegate") {
            std::fs::copy(root.join("Cargo.lock"), path.join("Cargo.lock")).context("copying Cargo.lock")?;
            packages.push(path);
        }
    }
    packages.sort();
    Ok(packages)
}

fn copy_tree(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
    for entry in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let entry = entry?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        if entry.file_type()?.is_dir() {
            copy_tree(&src, &dst)?;
        } else {
            std::fs::copy(&src, &dst).with_context(|| format!("copying {}", src.display()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_committed_sources_are_laid_out_beside_this_tree() {
        let root = crate::util::project_root();
        let eras = eras(&root).expect("read");
        assert!(eras.iter().any(|(v, _)| *v == semver::Version::new(0, 2, 0)), "{eras:?}");
        let scratch = tempfile::tempdir().expect("tempdir");
        let packages = lay_out(&root, &eras[0].1, scratch.path()).expect("laid out");
        let names: Vec<String> = packages
            .iter()
            .map(|p| p.file_name().unwrap_or_default().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["my-delegate", "my-delegate-plugin", "my-embedder"]);
        // The guide's path dependencies resolve through the link to this tree.
        assert!(scratch.path().join("kv-delegate/crates/delegate-abi/Cargo.toml").is_file());
        assert!(packages.iter().all(|p| p.join("Cargo.lock").is_file()));
    }
}
