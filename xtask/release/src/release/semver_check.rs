//! Semver checks: cargo-semver-checks between the rustdoc JSON of a crate's last release and of the working
//! tree.
//!
//! - The tool is installed on first use, at a pinned version ([`VERSION`], which reads rustdoc JSON format 57,
//!   what rustc 1.95 writes), into `<root>/.cache/cargo-semver-checks/<VERSION>/` with
//!   `cargo install --locked --root` (nothing outside the cache). Later runs use it as it is.
//! - Baselines: the released commit's tree (`git archive`, so a fresh clone without tags works from
//!   `releases.toml`'s commit alone) is documented once with `cargo rustdoc --output-format json` and kept as
//!   `<root>/.cache/semver-baselines/<crate>/<version>/<rustc version>/<lib>-<commit>.json`: built once per
//!   released version and toolchain, never again (the commit in the name guards against an edited record). The current crate is documented on every run (incrementally).
//! - Both are built with default features, into `<target dir>/semver-checks` (deps shared between them).
//! - The check runs with `--release-type patch`, so every change cargo-semver-checks classifies as needing a
//!   major or minor release reports, and its summary (`semver requires new major version`) says which. Exit 0
//!   is "compatible"; exit 100 with that summary is a finding; anything else is an error, never "compatible".

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context};
use serde::Serialize;

use super::record::Release;
use super::workspace::Workspace;
use super::Bump;

/// The pinned cargo-semver-checks version.
pub const VERSION: &str = "0.51.0";

/// What the semver check says about one crate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "result", rename_all = "kebab-case")]
pub enum Outcome {
    /// No change needs more than a patch release.
    Compatible,
    /// Changes that need a minor release (cargo-semver-checks' minor-level lints).
    Minor {
        /// The tool's summary line.
        summary: String,
    },
    /// Breaking changes.
    Major {
        /// The tool's summary line.
        summary: String,
        /// The failed lints' ids.
        lints: Vec<String>,
    },
    /// Never released: nothing to compare with.
    NoBaseline,
    /// A library crate without a Rust API to compare (only a `cdylib`).
    NoRustApi,
    /// `--no-semver`: not checked (and so never "compatible").
    Skipped,
    /// No commit touched the crate since its release: not checked (a dependency's breaking release reaches it
    /// through propagation).
    Unchanged,
}

impl Outcome {
    /// The bump the check asks for. `Minor` on a 0.x crate still means a patch release ([`Bump::apply`]).
    pub fn bump(&self) -> Bump {
        match self {
            Outcome::Major { .. } => Bump::Major,
            Outcome::Minor { .. } => Bump::Minor,
            _ => Bump::None,
        }
    }

    /// One line for the plan table.
    pub fn describe(&self) -> String {
        match self {
            Outcome::Compatible => "compatible".into(),
            Outcome::Minor { summary } => summary.clone(),
            Outcome::Major { summary, lints } if lints.is_empty() => summary.clone(),
            Outcome::Major { summary, lints } => format!("{summary} ({})", lints.join(", ")),
            Outcome::NoBaseline => "no baseline: first release".into(),
            Outcome::NoRustApi => "no Rust API (cdylib only)".into(),
            Outcome::Skipped => "skipped (--no-semver)".into(),
            Outcome::Unchanged => "not run: no commit since the release".into(),
        }
    }
}

/// Reads cargo-semver-checks' exit code and output. Exit 0: compatible; exit 100 with a "semver requires new
/// ... version" summary: a finding; anything else (a crash, a rustdoc format it cannot read): an error.
pub fn interpret(code: Option<i32>, output: &str) -> anyhow::Result<Outcome> {
    let summary = output
        .lines()
        .map(str::trim)
        .find_map(|l| l.strip_prefix("Summary").map(str::trim).map(str::to_owned))
        .unwrap_or_default();
    match code {
        Some(0) if summary.contains("no semver update required") || summary.is_empty() => {
            Ok(Outcome::Compatible)
        }
        Some(100) if summary.contains("requires new major version") => {
            let lints = output
                .lines()
                .filter_map(|l| l.trim().strip_prefix("--- failure "))
                .filter_map(|l| l.split(':').next())
                .map(str::to_owned)
                .collect::<std::collections::BTreeSet<String>>()
                .into_iter()
                .collect();
            Ok(Outcome::Major { summary, lints })
        }
        Some(100) if summary.contains("requires new minor version") => Ok(Outcome::Minor { summary }),
        _ => {
            let tail: Vec<&str> = output.lines().rev().take(15).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            bail!("cargo-semver-checks did not complete (exit {code:?}):\n{}", tail.join("\n"))
        }
    }
}

/// Runs the checks of one plan: installs the tool and builds what is missing on first use.
pub struct Checker<'a> {
    root: &'a Path,
    ws: &'a Workspace,
    tool: Option<PathBuf>,
    rustc: String,
    target: PathBuf,
    libs: BTreeMap<String, Option<String>>,
    trt: Option<crate::trt_setup::TrtEnv>,
    executorch: Option<crate::executorch_setup::ExecutorchEnv>,
}

impl<'a> Checker<'a> {
    /// A checker for the workspace at `root` (asks rustc and cargo metadata; installs nothing yet).
    pub fn new(root: &'a Path, ws: &'a Workspace) -> anyhow::Result<Checker<'a>> {
        let rustc = rustc_version()?;
        let target = crate::util::target_dir(root)?.join("semver-checks");
        let meta = cargo_metadata::MetadataCommand::new()
            .manifest_path(root.join("Cargo.toml"))
            .no_deps()
            .exec()
            .context("cargo metadata")?;
        let mut libs = BTreeMap::new();
        for pkg in meta.workspace_packages() {
            // The library target with a Rust API (lib/rlib/dylib); a cdylib-only crate has none to compare.
            let lib = pkg.targets.iter().find(|t| {
                t.kind.iter().any(|k| {
                    matches!(
                        k,
                        cargo_metadata::TargetKind::Lib
                            | cargo_metadata::TargetKind::RLib
                            | cargo_metadata::TargetKind::DyLib
                    )
                })
            });
            libs.insert(pkg.name.to_string(), lib.map(|t| t.name.replace('-', "_")));
        }
        Ok(Checker { root, ws, tool: None, rustc, target, libs, trt: None, executorch: None })
    }

    /// Checks `name` against its `last` release.
    pub fn check(&mut self, name: &str, last: &Release) -> anyhow::Result<Outcome> {
        let Some(lib) =
            self.libs.get(name).cloned().with_context(|| format!("{name} is not a workspace crate"))?
        else {
            return Ok(Outcome::NoRustApi);
        };
        let tool = self.tool()?;
        let baseline = self.baseline(name, &lib, last)?;
        let root = self.root;
        let current = self.rustdoc(root, name, &lib)?;
        let current_copy = self.target.join("current").join(format!("{lib}.json"));
        copy(&current, &current_copy)?;
        let started = Instant::now();
        let outcome = compare(&tool, &baseline, &current_copy);
        eprintln!("xtask: semver-checked {name} against {} in {:.1?}", last.version, started.elapsed());
        outcome.with_context(|| format!("the semver check of {name}"))
    }

    fn tool(&mut self) -> anyhow::Result<PathBuf> {
        if let Some(tool) = &self.tool {
            return Ok(tool.clone());
        }
        let tool = ensure_tool(self.root)?;
        self.tool = Some(tool.clone());
        Ok(tool)
    }

    /// The cached baseline of `last`, built from its commit's tree when missing.
    fn baseline(&mut self, name: &str, lib: &str, last: &Release) -> anyhow::Result<PathBuf> {
        let cached = self
            .root
            .join(".cache/semver-baselines")
            .join(name)
            .join(last.version.to_string())
            .join(&self.rustc)
            .join(format!("{lib}-{}.json", last.commit.get(..12).unwrap_or(&last.commit)));
        if cached.is_file() {
            return Ok(cached);
        }
        let started = Instant::now();
        let parent = cached.parent().context("a baseline path without a directory")?;
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        let src = tempfile::tempdir_in(parent).context("a scratch directory for the baseline's sources")?;
        extract(self.root, &last.commit, src.path())?;
        let built = self.rustdoc(src.path(), name, lib)?;
        copy(&built, &cached)?;
        eprintln!("xtask: built the semver baseline of {} in {:.1?}", last.tag(), started.elapsed());
        Ok(cached)
    }

    /// `cargo rustdoc -p name --lib` with JSON output in the workspace at `dir`; returns the JSON's path.
    fn rustdoc(&mut self, dir: &Path, name: &str, lib: &str) -> anyhow::Result<PathBuf> {
        let mut cmd = crate::util::cargo();
        cmd.args(["rustdoc", "--lib", "-p", name, "--manifest-path"])
            .arg(dir.join("Cargo.toml"))
            .args(["--", "-Zunstable-options", "--output-format", "json"])
            .env("RUSTC_BOOTSTRAP", "1")
            .env("CARGO_TARGET_DIR", &self.target);
        if self.needs(name, "trt-exec") || self.needs(name, "trt-build") {
            if self.trt.is_none() {
                self.trt = Some(crate::trt_setup::ensure(self.root)?);
            }
            if let Some(trt) = &self.trt {
                trt.apply(&mut cmd);
            }
        }
        if self.needs(name, "executorch-bridge") {
            if self.executorch.is_none() {
                self.executorch = Some(crate::executorch_setup::ensure(self.root)?);
            }
            if let Some(env) = &self.executorch {
                env.apply(&mut cmd);
            }
        }
        crate::util::run_cmd(dir, &mut cmd)
            .with_context(|| format!("building the rustdoc JSON of {name}"))?;
        let json = self.target.join("doc").join(format!("{lib}.json"));
        anyhow::ensure!(json.is_file(), "cargo rustdoc wrote no {}", json.display());
        Ok(json)
    }

    /// Whether `name` is `needle` or builds with it (directly or not).
    fn needs(&self, name: &str, needle: &str) -> bool {
        let mut seen = BTreeSet::new();
        let mut todo = vec![name.to_owned()];
        while let Some(next) = todo.pop() {
            if next == needle {
                return true;
            }
            if seen.insert(next.clone()) {
                if let Some(krate) = self.ws.crates.get(&next) {
                    todo.extend(krate.deps.iter().cloned());
                }
            }
        }
        false
    }
}

/// Runs the tool on two rustdoc JSON files (see the module docs for how its answer is read).
pub fn compare(tool: &Path, baseline: &Path, current: &Path) -> anyhow::Result<Outcome> {
    let out = Command::new(tool)
        .args(["semver-checks", "--color", "never", "--release-type", "patch", "--baseline-rustdoc"])
        .arg(baseline)
        .arg("--current-rustdoc")
        .arg(current)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {}", tool.display()))?;
    let text = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    interpret(out.status.code(), &text)
}

/// The pinned tool, installed into `.cache/cargo-semver-checks/<VERSION>/` when missing.
pub fn ensure_tool(root: &Path) -> anyhow::Result<PathBuf> {
    let prefix = root.join(".cache").join("cargo-semver-checks").join(VERSION);
    let tool = prefix.join("bin").join(format!("cargo-semver-checks{}", std::env::consts::EXE_SUFFIX));
    if tool.is_file() {
        return Ok(tool);
    }
    eprintln!(
        "xtask: installing cargo-semver-checks {VERSION} into {} (first use; minutes)",
        prefix.display()
    );
    let started = Instant::now();
    let mut cmd = crate::util::cargo();
    cmd.args(["install", "--locked", "--version", VERSION, "cargo-semver-checks", "--root"])
        .arg(&prefix)
        .env("CARGO_TARGET_DIR", prefix.join("build"));
    crate::util::run_cmd(root, &mut cmd)?;
    anyhow::ensure!(tool.is_file(), "cargo install succeeded but wrote no {}", tool.display());
    // The build directory is only needed while installing.
    let _ = std::fs::remove_dir_all(prefix.join("build"));
    eprintln!("xtask: installed cargo-semver-checks {VERSION} in {:.0?}", started.elapsed());
    Ok(tool)
}

/// `1.95.0-59807616e`: the toolchain part of a baseline's cache key (rustdoc JSON changes with it).
fn rustc_version() -> anyhow::Result<String> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let out = Command::new(rustc).arg("-vV").output().context("running rustc -vV")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |key: &str| text.lines().find_map(|l| l.strip_prefix(key)).map(str::trim).map(str::to_owned);
    let release = field("release:").context("rustc -vV printed no release")?;
    let hash = field("commit-hash:").unwrap_or_default();
    Ok(match hash.get(..9) {
        Some(short) => format!("{release}-{short}"),
        None => release,
    })
}

/// Writes `commit`'s tree into `dir` with `git archive | tar -x`.
fn extract(root: &Path, commit: &str, dir: &Path) -> anyhow::Result<()> {
    let mut archive = Command::new("git")
        .args(["archive", "--format=tar", commit])
        .current_dir(root)
        .stdout(Stdio::piped())
        .spawn()
        .context("running git archive")?;
    let stdout = archive.stdout.take().context("git archive's output")?;
    let mut tar = Command::new("tar");
    tar.arg("-x").arg("-C").arg(dir).stdin(stdout);
    let tar = crate::util::stdout_to_stderr(&mut tar).status().context("running tar -x")?;
    let git = archive.wait().context("waiting for git archive")?;
    anyhow::ensure!(git.success() && tar.success(), "extracting {commit} failed (git {git}, tar {tar})");
    Ok(())
}

fn copy(from: &Path, to: &Path) -> anyhow::Result<()> {
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    std::fs::copy(from, to).with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{interpret, Outcome};
    use crate::release::Bump;

    /// The pinned tool, on two versions of a one-file crate: the flags, exit codes and summaries this module
    /// relies on. Ignored by default: the first run installs the tool (minutes).
    #[test]
    #[ignore = "installs cargo-semver-checks on first use (about 10 minutes on 2 cores); run with --ignored"]
    fn the_pinned_tool_finds_a_removed_function() {
        let tool = super::ensure_tool(&crate::util::project_root()).expect("the tool");
        let dir = tempfile::tempdir().expect("tempdir");
        let rustdoc = |version: &str, lib: &str| {
            let src = dir.path().join(version);
            std::fs::create_dir_all(src.join("src")).expect("mkdir");
            std::fs::write(
                src.join("Cargo.toml"),
                "[package]\nname = \"probe\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[workspace]\n",
            )
            .expect("manifest");
            std::fs::write(src.join("src/lib.rs"), lib).expect("lib");
            let status = crate::util::cargo()
                .args(["rustdoc", "--quiet", "--lib", "--manifest-path"])
                .arg(src.join("Cargo.toml"))
                .args(["--", "-Zunstable-options", "--output-format", "json"])
                .env("RUSTC_BOOTSTRAP", "1")
                .env("CARGO_TARGET_DIR", src.join("target"))
                .status()
                .expect("cargo rustdoc");
            assert!(status.success());
            src.join("target/doc/probe.json")
        };
        let old =
            rustdoc("old", "//! Probe.\n/// Kept.\npub fn kept() {}\n/// Removed.\npub fn removed() {}\n");
        let new = rustdoc("new", "//! Probe.\n/// Kept.\npub fn kept() {}\n/// Added.\npub fn added() {}\n");
        match super::compare(&tool, &old, &new).expect("runs") {
            Outcome::Major { lints, .. } => assert_eq!(lints, ["function_missing"]),
            other => panic!("a removed function is breaking, got {other:?}"),
        }
        assert_eq!(super::compare(&tool, &old, &old).expect("runs"), Outcome::Compatible);
        let garbage = dir.path().join("garbage.json");
        std::fs::write(&garbage, "{}").expect("write");
        assert!(super::compare(&tool, &garbage, &new).is_err(), "a check that cannot run is an error");
    }

    #[test]
    fn the_tool_output_is_read_strictly() {
        let ok =
            "     Checked [   0.012s] 180 checks: 180 pass, 0 skip\n     Summary no semver update required\n";
        assert_eq!(interpret(Some(0), ok).expect("ok"), Outcome::Compatible);
        let major = "--- failure function_missing: pub fn removed or renamed ---\n\nDescription:\n...\n\
                     --- failure enum_variant_added: enum variant added on exhaustive enum ---\n\
                     \n     Summary semver requires new major version: 2 major and 0 minor checks failed\n";
        let outcome = interpret(Some(100), major).expect("major");
        assert_eq!(outcome.bump(), Bump::Major);
        assert_eq!(
            outcome,
            Outcome::Major {
                summary: "semver requires new major version: 2 major and 0 minor checks failed".into(),
                lints: vec!["enum_variant_added".into(), "function_missing".into()],
            }
        );
        let minor = "     Summary semver requires new minor version: 0 major and 1 minor checks failed\n";
        assert_eq!(interpret(Some(100), minor).expect("minor").bump(), Bump::Minor);
        // A check that did not run is an error, never compatible.
        assert!(interpret(Some(101), "error: unsupported rustdoc format v99").is_err());
        assert!(interpret(None, "").is_err());
        assert!(interpret(Some(100), "no summary at all").is_err());
        assert!(interpret(Some(0), "     Summary something unexpected").is_err());
        assert_eq!(Outcome::Skipped.bump(), Bump::None);
        assert_eq!(Outcome::Skipped.describe(), "skipped (--no-semver)");
    }
}
