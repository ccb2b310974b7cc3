//! The end-to-end publish test: a scratch copy of this workspace publishes every crate to a loopback registry,
//! resumes without publishing anything twice, and a consumer crate builds against what it published.
//!
//! `cargo publish` runs with `--no-verify` here (packaging still runs: the manifests are normalised, the files
//! listed and the lockfile resolved; only the verification build of each package is skipped, which would
//! rebuild the whole workspace from the packaged sources). Third-party dependencies come from crates.io through
//! the user's cargo cache; nothing is ever uploaded anywhere but the loopback registry.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::publish::{self, Options, Outcome};
use super::record::Record;
use super::registry::TestRegistry;
use super::workspace::Workspace;

/// The registry's name in the scratch workspace.
const REGISTRY: &str = "kv-loopback";

#[test]
fn the_workspace_publishes_in_order_resumes_and_serves_a_consumer() {
    let started = std::time::Instant::now();
    let registry = TestRegistry::start().expect("the loopback registry starts");
    let temp = tempfile::tempdir().expect("tempdir");
    let scratch = temp.path().join("workspace");
    scratch_copy(&crate::util::project_root(), &scratch);
    let env = registry_env(&registry, &temp.path().join("target"));
    let _caches = LoopbackCaches::new();

    let options =
        Options { registry: REGISTRY.into(), no_verify: true, env: env.clone(), ..Options::default() };
    let workspace = Workspace::load_with_env(&scratch, &env).expect("cargo metadata");
    let order: Vec<String> =
        workspace.publish_order().expect("an order").iter().map(|c| c.name.clone()).collect();

    // Plan and apply first, as a maintainer does: a workspace that never released proposes every publishable
    // crate as a first release at its Cargo.toml version, in publish order; applying finalises the changelogs.
    let (planned_ws, plan) = super::command::compute_with_env(&scratch, true, &env).expect("the plan");
    let planned: Vec<String> = plan.releases().map(|(c, _)| c.name.clone()).collect();
    assert_eq!(planned, order, "the plan releases every publishable crate, in publish order");
    assert!(plan.crates.iter().all(|c| c.first_release && c.proposed == Some(c.current.clone())));
    // This workspace's changelogs already carry 0.1.0 (its first release was cut from them), so applying
    // leaves them as they are: finalising is idempotent.
    let changed = super::plan::apply(&planned_ws, &plan, "2026-12-01").expect("applying the plan");
    let changelog =
        std::fs::read_to_string(scratch.join("crates/blob-format/CHANGELOG.md")).expect("changelog");
    assert_eq!(changelog.matches("## [0.1.0] - ").count(), 1, "{changelog}");
    assert!(changelog.contains("## [Unreleased]"), "{changelog}");
    if !changed.is_empty() {
        git(&scratch, &["commit", "-qam", "chore: release the first versions"]);
    }

    // The first run stops where the registry refuses a crate; what came before is published and recorded.
    let stop = order.iter().position(|c| c == "kv-example").expect("kv-example is published");
    registry.refuse(Some("kv-example"));
    let err = publish::run(&scratch, &options).expect_err("the registry refuses kv-example");
    assert!(format!("{err:#}").contains("kv-example"), "{err:#}");
    assert_eq!(
        registry.published(),
        order[..stop],
        "uploads follow the publish order and stop at the failure"
    );
    let partial = Record::load(&scratch).expect("releases.toml");
    assert_eq!(partial.releases.iter().map(|r| r.krate.as_str()).collect::<Vec<_>>(), order[..stop]);

    // The next run resumes: nothing is uploaded twice, the rest in order.
    registry.refuse(None);
    let steps = publish::run(&scratch, &options).expect("the resumed run publishes the rest");
    assert_eq!(registry.published(), order, "uploads follow the publish order, each crate once");
    let outcomes: Vec<Outcome> = steps.iter().map(|s| s.outcome).collect();
    assert!(outcomes[..stop].iter().all(|o| *o == Outcome::AlreadyInRegistry), "{steps:?}");
    assert!(outcomes[stop..].iter().all(|o| *o == Outcome::Published), "{steps:?}");

    // The index: every crate, each internal dependency resolved in this registry, third-party ones on crates.io.
    for krate in workspace.publish_order().expect("an order") {
        let entries = registry.index_entries(&krate.name);
        assert_eq!(entries.len(), 1, "{}: one version", krate.name);
        let entry = &entries[0];
        assert_eq!(entry["vers"], krate.version.to_string().as_str());
        let deps = entry["deps"].as_array().expect("deps");
        for dep in &krate.deps {
            let line = deps
                .iter()
                .find(|d| d["name"] == dep.as_str() && d["kind"] != "dev")
                .unwrap_or_else(|| panic!("{}'s index entry lacks its dependency {dep}", krate.name));
            assert!(
                line["registry"].is_null(),
                "{} -> {dep}: this registry, got {}",
                krate.name,
                line["registry"]
            );
            // Each requirement is the dependency's version (the workspace requires what it releases).
            let want = format!("^{}", workspace.crates[dep.as_str()].version);
            assert_eq!(line["req"], want.as_str(), "{} -> {dep}", krate.name);
        }
        for line in deps.iter().filter(|d| !workspace.crates.contains_key(d["name"].as_str().unwrap_or(""))) {
            assert!(
                line["registry"].as_str().is_some_and(|r| r.contains("crates.io-index")),
                "{}'s third-party dependency {line} comes from crates.io",
                krate.name
            );
        }
    }

    // The record and the tags.
    let record = Record::load(&scratch).expect("releases.toml");
    let head = git(&scratch, &["rev-parse", "HEAD"]);
    let recorded: Vec<&str> = record.releases.iter().map(|r| r.krate.as_str()).collect();
    assert_eq!(recorded, order, "releases.toml lists every crate, in publish order");
    for release in &record.releases {
        assert_eq!(release.commit, head);
        assert_eq!(git(&scratch, &["rev-parse", &format!("{}^{{commit}}", release.tag())]), head);
    }

    // A second run resumes: everything is in the registry, nothing is uploaded or recorded twice.
    let again = publish::run(&scratch, &options).expect("the second run");
    assert!(again.iter().all(|s| s.outcome == Outcome::AlreadyInRegistry), "{again:?}");
    assert_eq!(registry.published().len(), order.len());
    assert_eq!(Record::load(&scratch).expect("releases.toml"), record);

    // A run that died between the upload and the record: the next one records and tags what it finds.
    let last = record.releases.last().expect("a release");
    let mut truncated = record.clone();
    truncated.releases.pop();
    truncated.save(&scratch).expect("save");
    git(&scratch, &["tag", "-d", &last.tag()]);
    publish::run(&scratch, &options).expect("the run that catches up");
    let caught_up = Record::load(&scratch).expect("releases.toml");
    assert_eq!(caught_up.releases.len(), record.releases.len());
    assert_eq!(
        caught_up.releases.last().map(|r| (&r.krate, &r.version, &r.commit)),
        Some((&last.krate, &last.version, &head))
    );
    assert_eq!(git(&scratch, &["rev-parse", &format!("{}^{{commit}}", last.tag())]), head);

    // A tag pointing elsewhere is an error, not silently moved.
    let first = &record.releases[0];
    git(&scratch, &["commit", "--allow-empty", "-q", "-m", "later"]);
    git(&scratch, &["tag", "-f", &first.tag(), "HEAD"]);
    let err = publish::run(&scratch, &options).expect_err("a moved tag");
    assert!(err.to_string().contains(&first.tag()), "{err}");

    consumer_builds(temp.path(), &scratch, &env);
    eprintln!("end-to-end publish: {:.1?}", started.elapsed());
}

#[test]
fn a_dirty_tree_is_refused() {
    let registry = TestRegistry::start().expect("the loopback registry starts");
    let temp = tempfile::tempdir().expect("tempdir");
    let root = temp.path().join("ws");
    std::fs::create_dir_all(&root).expect("mkdir");
    git(&root, &["init", "-q"]);
    std::fs::write(root.join("untracked.txt"), "x").expect("write");
    let env = registry_env(&registry, &temp.path().join("target"));
    let options = Options { registry: REGISTRY.into(), env, ..Options::default() };
    let err = publish::run(&root, &options).expect_err("dirty");
    assert!(err.to_string().contains("uncommitted changes"), "{err}");
    assert!(registry.published().is_empty());
}

/// The environment that points cargo at `registry` under [`REGISTRY`], with a token and its own target dir.
fn registry_env(registry: &TestRegistry, target: &Path) -> std::collections::BTreeMap<String, String> {
    let key = super::index::env_key(REGISTRY);
    [
        (format!("CARGO_REGISTRIES_{key}_INDEX"), registry.index_url()),
        (format!("CARGO_REGISTRIES_{key}_TOKEN"), "loopback-token".to_owned()),
        ("CARGO_TARGET_DIR".to_owned(), target.display().to_string()),
    ]
    .into_iter()
    .collect()
}

/// The git-tracked files of `root` copied to `to`, internal dependencies naming [`REGISTRY`], committed.
fn scratch_copy(root: &Path, to: &Path) {
    let files = git(root, &["ls-files", "-z"]);
    for file in files.split('\0').filter(|f| !f.is_empty()) {
        let from = root.join(file);
        if !from.is_file() {
            continue; // Deleted in the working tree, or a submodule.
        }
        let dest = to.join(file);
        std::fs::create_dir_all(dest.parent().expect("a file has a parent")).expect("mkdir");
        std::fs::copy(&from, &dest).unwrap_or_else(|err| panic!("copying {file}: {err}"));
    }
    let manifest = to.join("Cargo.toml");
    let mut doc: toml_edit::DocumentMut =
        std::fs::read_to_string(&manifest).expect("Cargo.toml").parse().expect("valid TOML");
    let deps = doc["workspace"]["dependencies"].as_table_like_mut().expect("[workspace.dependencies]");
    for (_, dep) in deps.iter_mut() {
        if let Some(dep) = dep.as_table_like_mut().filter(|d| d.contains_key("path")) {
            dep.insert("registry", toml_edit::value(REGISTRY));
        }
    }
    std::fs::write(&manifest, doc.to_string()).expect("write Cargo.toml");
    // The scratch repository has a history of its own, in which the recorded release commits do not exist:
    // it starts as a workspace that never released, so no break is declared against a release either.
    let _ = std::fs::remove_file(to.join(super::record::FILE));
    let _ = std::fs::remove_file(to.join(super::declared::FILE));
    git(to, &["init", "-q"]);
    git(to, &["add", "-A"]);
    git(to, &["commit", "-q", "-m", "scratch copy"]);
}

/// A crate outside the workspace that depends on two published crates builds against the registry.
fn consumer_builds(temp: &Path, scratch: &Path, env: &std::collections::BTreeMap<String, String>) {
    let dir = temp.join("consumer");
    std::fs::create_dir_all(dir.join("src")).expect("mkdir");
    std::fs::write(
        dir.join("Cargo.toml"),
        format!(
            "[package]\nname = \"consumer\"\nversion = \"0.0.0\"\nedition = \"2021\"\npublish = false\n\n\
             [dependencies]\net-error = {{ version = \"0.1\", registry = \"{REGISTRY}\" }}\n\
             blob-format = {{ version = \"0.1\", registry = \"{REGISTRY}\" }}\n\n[workspace]\n"
        ),
    )
    .expect("write");
    std::fs::write(
        dir.join("src/main.rs"),
        "use et_error::HasErrorCode;\n\nfn main() {\n    match blob_format::Blob::parse(b\"not a blob\") {\n        \
         Ok(_) => std::process::exit(1),\n        Err(err) => println!(\"{}\", err.error_code().name()),\n    }\n}\n",
    )
    .expect("write");
    // The workspace's lockfile pins the third-party crates to the versions already in the cargo cache.
    std::fs::copy(scratch.join("Cargo.lock"), dir.join("Cargo.lock")).expect("copy Cargo.lock");
    let out = crate::util::cargo()
        .args(["run", "-q"])
        .current_dir(&dir)
        .envs(env)
        .env("CARGO_TARGET_DIR", temp.join("consumer-target"))
        .output()
        .expect("cargo runs");
    assert!(out.status.success(), "the consumer builds: {}", String::from_utf8_lossy(&out.stderr));
    assert!(!String::from_utf8_lossy(&out.stdout).trim().is_empty(), "it names the error code");
    let lock = std::fs::read_to_string(dir.join("Cargo.lock")).expect("Cargo.lock");
    assert!(lock.contains("name = \"et-error\"") && lock.contains("sparse+http://127.0.0.1:"), "{lock}");
}

/// `git args` in `dir` (with a fixed identity), its trimmed output; panics on failure.
fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args([
            "-c",
            "user.name=xtask",
            "-c",
            "user.email=xtask@example.invalid",
            "-c",
            "commit.gpgsign=false",
        ])
        .args(args)
        .current_dir(dir)
        .output()
        .expect("git runs");
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Removes, when dropped (test failures included), the caches cargo made in the user's `CARGO_HOME` for the
/// loopback registries of this test: `registry/{index,cache,src}/127.0.0.1-<hash>`, one set per port.
struct LoopbackCaches {
    registry: PathBuf,
    before: BTreeSet<PathBuf>,
}

impl LoopbackCaches {
    fn new() -> LoopbackCaches {
        let home = std::env::var_os("CARGO_HOME").map(PathBuf::from).unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME or CARGO_HOME")).join(".cargo")
        });
        let registry = home.join("registry");
        let before = LoopbackCaches::list(&registry);
        LoopbackCaches { registry, before }
    }

    fn list(registry: &Path) -> BTreeSet<PathBuf> {
        ["index", "cache", "src"]
            .iter()
            .filter_map(|sub| std::fs::read_dir(registry.join(sub)).ok())
            .flatten()
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("127.0.0.1-")))
            .collect()
    }
}

impl Drop for LoopbackCaches {
    fn drop(&mut self) {
        for dir in LoopbackCaches::list(&self.registry).difference(&self.before) {
            // Best effort: a leftover cache only costs disk space.
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
