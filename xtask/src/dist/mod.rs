//! `cargo xtask dist`: reproducible bundles of what users get, the plugin libraries and the `delegate-host` CLI.
//!
//! 1. [`build`]: `cargo build --release --locked` of the plugin cdylibs and `delegate-host` in their own target
//!    directory (`<target>/dist`), with every build-machine path remapped (`--remap-path-prefix` for rustc,
//!    `-ffile-prefix-map` for C and assembly built by `cc`): the workspace root becomes `/kv-delegate`, cargo's
//!    home `/cargo`, rustup's home `/rustup`, the target directory `/target`.
//! 2. [`assemble`]: per plugin `<crate>-<version>-<target>.tar.gz` holding the library, its manifest (written
//!    by the host just built from the library itself, as discovery reads it, `rustc` included), a generated
//!    README and `SHA256SUMS`; the host bundle holds the binary, a README, the docs a third-party plugin author
//!    needs (generated from the crate docs) and `SHA256SUMS`. Archives are written by [`archive`]: sorted,
//!    owned by 0:0, fixed modes, every mtime the bundle's [`Epoch`]. `dist-manifest.json` lists every artifact
//!    with its SHA-256, version and what it is.
//!
//! The same commit built on another machine or checkout gives the same bytes: [`foreign_paths`] checks that
//! no build-machine path is left in a binary, and `cargo xtask test` assembles twice and compares (see
//! `check_reproducible`).

pub mod archive;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};
use host_runtime::plugin_manifest::PluginManifest;
use serde::{Deserialize, Serialize};

use crate::release::record::Record;
use crate::release::workspace::Workspace;
use crate::trt_setup::TrtEnv;
use crate::util::{cargo, dylib_name, run_cmd, target_dir, write_plugin_manifests};
use archive::Entry;

/// The host crate and binary.
pub const HOST: &str = "delegate-host";

/// A plugin library users get.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PluginCrate {
    /// The cdylib crate (the bundle is named after it and versioned by it).
    pub krate: &'static str,
    /// The library crate that implements the delegate (its CHANGELOG may carry the ABI notes too).
    pub library: &'static str,
    /// The library file's stem (`libreference_delegate_dylib.so`).
    pub stem: &'static str,
    /// Needs the TensorRT set-up (libclang for `trtx-sys`) to build.
    pub tensorrt: bool,
}

/// Every plugin library a release ships.
pub const PLUGINS: [PluginCrate; 3] = [
    PluginCrate {
        krate: "reference-delegate-dylib",
        library: "reference-delegate",
        stem: "reference_delegate_dylib",
        tensorrt: false,
    },
    PluginCrate {
        krate: "cuda-delegate-dylib",
        library: "cuda-delegate",
        stem: "cuda_delegate_dylib",
        tensorrt: false,
    },
    PluginCrate {
        krate: "tensorrt-delegate-dylib",
        library: "tensorrt-delegate",
        stem: "tensorrt_delegate_dylib",
        tensorrt: true,
    },
];

/// `dist-manifest.json`'s format version.
pub const DIST_MANIFEST_VERSION: u32 = 1;
/// The file listing a dist's artifacts.
pub const DIST_MANIFEST: &str = "dist-manifest.json";

/// What to build.
#[derive(Clone, Debug)]
pub struct Options {
    /// Where the bundles and `dist-manifest.json` go.
    pub out: PathBuf,
    /// Build and bundle the TensorRT plugin (needs the TensorRT set-up: libclang, the TensorRT-RTX wheel).
    pub tensorrt: bool,
}

/// `cargo xtask dist`: builds, then assembles the bundles into `options.out`.
pub fn run(root: &Path, options: &Options) -> anyhow::Result<DistManifest> {
    let started = std::time::Instant::now();
    let built = build(root, options.tensorrt)?;
    let leaks = foreign_paths(&built)?;
    if !leaks.is_empty() {
        bail!("build-machine paths left in the release binaries:\n  {}", leaks.join("\n  "));
    }
    let manifest = assemble(root, &built, &options.out)?;
    eprintln!(
        "xtask dist: {} artifacts in {} ({:.0?})",
        manifest.artifacts.len(),
        options.out.display(),
        started.elapsed()
    );
    for artifact in &manifest.artifacts {
        eprintln!("  {}  {}", artifact.sha256, artifact.name);
    }
    Ok(manifest)
}

/// The reproducibility check of `cargo xtask test`: builds once, checks that no build-machine path is left
/// in the binaries, assembles the bundles twice into two directories and compares every byte. Returns the
/// first directory (the bundles `compat` then checks).
///
/// Why not build twice from scratch here: a cold release build of the host and the plugins takes minutes on a
/// small machine, and cargo would reuse the first build anyway. What a second build could change is a path of
/// the build machine (checkout, target directory, cargo home), which [`foreign_paths`] finds directly; the
/// slow check that builds in a second target directory and compares the binaries is
/// `cargo xtask dist --rebuild-check` ([`check_rebuild`]).
pub fn check_reproducible(root: &Path, tensorrt: bool) -> anyhow::Result<PathBuf> {
    let started = std::time::Instant::now();
    let built = build(root, tensorrt)?;
    let leaks = foreign_paths(&built)?;
    if !leaks.is_empty() {
        bail!("build-machine paths left in the release binaries:\n  {}", leaks.join("\n  "));
    }
    let base = dist_target_dir(root)?.join("repro");
    let (a, b) = (base.join("a"), base.join("b"));
    for dir in [&a, &b] {
        if dir.exists() {
            std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
        }
    }
    let first = assemble(root, &built, &a)?;
    let second = assemble(root, &built, &b)?;
    anyhow::ensure!(first == second, "two assemblies of one build wrote different dist-manifest.json");
    let mut names: Vec<&str> = first.artifacts.iter().map(|x| x.name.as_str()).collect();
    names.push(DIST_MANIFEST);
    for name in names {
        let (x, y) = (std::fs::read(a.join(name))?, std::fs::read(b.join(name))?);
        anyhow::ensure!(
            x == y,
            "{name} differs between two assemblies of one build ({} and {})",
            a.display(),
            b.display()
        );
    }
    eprintln!(
        "xtask dist: {} artifacts identical across two assemblies, no build-machine path in the binaries ({:.0?})",
        first.artifacts.len(),
        started.elapsed()
    );
    Ok(a)
}

/// `cargo xtask dist --rebuild-check`: builds a second time in another target directory (`<target>/dist-rebuild`:
/// another path, its own build scripts and codegen units) and compares every binary byte for byte with the
/// first build. Slow (a full release build); not part of `cargo xtask test`.
pub fn check_rebuild(root: &Path, tensorrt: bool) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let first = build(root, tensorrt)?;
    let second = build_in(root, &target_dir(root)?.join("dist-rebuild"), tensorrt)?;
    let mut files = vec![format!("{HOST}{}", std::env::consts::EXE_SUFFIX)];
    files.extend(first.plugins.iter().map(|p| dylib_name(p.stem)));
    let mut differ = Vec::new();
    for file in &files {
        let (x, y) =
            (std::fs::read(first.release_dir.join(file))?, std::fs::read(second.release_dir.join(file))?);
        if x != y {
            differ.push(file.as_str());
        }
    }
    anyhow::ensure!(
        differ.is_empty(),
        "built twice in two target directories, these differ: {} ({} and {})",
        differ.join(", "),
        first.release_dir.display(),
        second.release_dir.display()
    );
    eprintln!(
        "xtask dist: {} binaries identical across two target directories ({:.0?})",
        files.len(),
        started.elapsed()
    );
    Ok(())
}

/// What [`build`] produced.
#[derive(Clone, Debug)]
pub struct Built {
    /// `<target>/dist/release`: the binaries.
    pub release_dir: PathBuf,
    /// The plugins built.
    pub plugins: Vec<PluginCrate>,
    /// The TensorRT environment, when the TensorRT plugin was built (its manifest is written with it).
    pub trt: Option<TrtEnv>,
    /// The path prefixes that were remapped (build-machine paths that must not appear in a binary).
    pub remapped: Vec<PathBuf>,
}

impl Built {
    /// The host binary.
    pub fn host(&self) -> PathBuf {
        self.release_dir.join(format!("{HOST}{}", std::env::consts::EXE_SUFFIX))
    }
}

/// The dedicated target directory of dist builds: `<target>/dist`.
pub fn dist_target_dir(root: &Path) -> anyhow::Result<PathBuf> {
    Ok(target_dir(root)?.join("dist"))
}

/// Release-builds the host and the plugins into [`dist_target_dir`] with build-machine paths remapped.
pub fn build(root: &Path, tensorrt: bool) -> anyhow::Result<Built> {
    let target = dist_target_dir(root)?;
    build_in(root, &target, tensorrt)
}

/// [`build`] into another target directory (the slow reproducibility check builds twice).
pub fn build_in(root: &Path, target: &Path, tensorrt: bool) -> anyhow::Result<Built> {
    let trt = if tensorrt { Some(crate::trt_setup::ensure(root)?) } else { None };
    let plugins: Vec<PluginCrate> = PLUGINS.iter().copied().filter(|p| tensorrt || !p.tensorrt).collect();
    let remaps = remaps(root, target);
    let mut cmd = cargo();
    cmd.args(["build", "--release", "--locked", "-p", HOST]);
    for plugin in &plugins {
        cmd.args(["-p", plugin.krate]);
    }
    cmd.env("CARGO_TARGET_DIR", target);
    // Shipped binaries carry no debug info (the workspace's release profile keeps line tables for profiling):
    // a third of the size, and nothing of the build machine's source tree.
    cmd.env("CARGO_PROFILE_RELEASE_STRIP", "debuginfo");
    apply_remaps(&mut cmd, &remaps);
    if let Some(trt) = &trt {
        trt.apply(&mut cmd);
    }
    run_cmd(root, &mut cmd)?;
    Ok(Built {
        release_dir: target.join("release"),
        plugins,
        trt,
        remapped: remaps.into_iter().map(|(from, _)| from).collect(),
    })
}

/// The build-machine prefixes and what they become, most general first (rustc applies the last matching
/// `--remap-path-prefix`, so the target directory wins over a workspace root that holds it).
pub fn remaps(root: &Path, target: &Path) -> Vec<(PathBuf, &'static str)> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let from_env = |var: &str, default: &str| {
        std::env::var_os(var).map(PathBuf::from).or_else(|| home.as_ref().map(|h| h.join(default)))
    };
    let mut out = Vec::new();
    let mut push = |path: Option<PathBuf>, to: &'static str| {
        let Some(path) = path else { return };
        // The path as given and, when a symbolic link is on the way, as resolved: the compiler sees either.
        let canonical = std::fs::canonicalize(&path).ok();
        out.push((path.clone(), to));
        if let Some(canonical) = canonical.filter(|c| *c != path) {
            out.push((canonical, to));
        }
    };
    push(from_env("CARGO_HOME", ".cargo"), "/cargo");
    push(from_env("RUSTUP_HOME", ".rustup"), "/rustup");
    push(Some(root.to_path_buf()), "/kv-delegate");
    push(Some(target.to_path_buf()), "/target");
    out
}

/// Sets the remapping flags on a cargo command: rustc's through `CARGO_ENCODED_RUSTFLAGS` (which wins over
/// `RUSTFLAGS`, so an ambient `RUSTFLAGS` cannot make two builds differ), C's and assembly's through
/// `CFLAGS`/`CXXFLAGS` (read by the `cc` crate) appended to what the environment has.
fn apply_remaps(cmd: &mut Command, remaps: &[(PathBuf, &'static str)]) {
    let rustc: Vec<String> =
        remaps.iter().map(|(from, to)| format!("--remap-path-prefix={}={to}", from.display())).collect();
    let c: Vec<String> =
        remaps.iter().map(|(from, to)| format!("-ffile-prefix-map={}={to}", from.display())).collect();
    cmd.env("CARGO_ENCODED_RUSTFLAGS", rustc.join("\x1f"));
    cmd.env_remove("RUSTFLAGS");
    for var in ["CFLAGS", "CXXFLAGS"] {
        let mut value: OsString = std::env::var_os(var).unwrap_or_default();
        for flag in &c {
            if !value.is_empty() {
                value.push(" ");
            }
            value.push(flag);
        }
        cmd.env(var, value);
    }
}

/// Every remapped build-machine path (and the home directory) still found in a built binary, as
/// `file: path`; empty when the binaries are clean.
pub fn foreign_paths(built: &Built) -> anyhow::Result<Vec<String>> {
    let mut needles: Vec<String> = built.remapped.iter().map(|p| p.display().to_string()).collect();
    if let Some(home) = std::env::var_os("HOME") {
        let home = PathBuf::from(home);
        // A bare `/root` or `/home/x` prefix would also match `src/roots.rs`: look for `<home>/`.
        if home.components().count() > 1 {
            needles.push(format!("{}/", home.display()));
        }
    }
    needles.sort();
    needles.dedup();
    let mut found = Vec::new();
    let mut files = vec![built.host()];
    files.extend(built.plugins.iter().map(|p| built.release_dir.join(dylib_name(p.stem))));
    for file in files {
        let bytes = std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
        for needle in &needles {
            if contains(&bytes, needle.as_bytes()) {
                found.push(format!("{}: {needle}", file.display()));
            }
        }
    }
    Ok(found)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && memchr::memmem::find(haystack, needle).is_some()
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

/// Writes the bundles of `built` and `dist-manifest.json` into `out` (replacing what an earlier dist left
/// there). The plugin manifests are written by the host just built, from copies of the libraries in a
/// staging directory under `out`, which is removed afterwards.
pub fn assemble(root: &Path, built: &Built, out: &Path) -> anyhow::Result<DistManifest> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let workspace = Workspace::load(root)?;
    let record = Record::load(root)?;
    let (commit, head_time) = head_commit(root)?;
    let (target, rustc) = rustc_info()?;
    let sde = std::env::var("SOURCE_DATE_EPOCH").ok();
    let version_of = |krate: &str| -> anyhow::Result<semver::Version> {
        Ok(workspace
            .crates
            .get(krate)
            .with_context(|| format!("no crate {krate} in the workspace"))?
            .version
            .clone())
    };
    let description_of = |krate: &str| -> String {
        let Some(c) = workspace.crates.get(krate) else { return String::new() };
        let text = std::fs::read_to_string(root.join(&c.dir).join("Cargo.toml")).unwrap_or_default();
        let value: toml::Value = toml::from_str(&text).unwrap_or(toml::Value::Table(Default::default()));
        value
            .get("package")
            .and_then(|p| p.get("description"))
            .and_then(|d| d.as_str())
            .unwrap_or("")
            .to_owned()
    };

    let staging = tempfile::Builder::new().prefix(".staging").tempdir_in(out)?;
    let mut artifacts = Vec::new();
    for plugin in &built.plugins {
        let version = version_of(plugin.krate)?;
        let epoch = epoch_for(&record, plugin.krate, &version, sde.as_deref(), head_time)?;
        let library = dylib_name(plugin.stem);
        let dir = staging.path().join(plugin.stem);
        std::fs::create_dir_all(&dir)?;
        std::fs::copy(built.release_dir.join(&library), dir.join(&library))
            .with_context(|| format!("copying {library}"))?;
        write_plugin_manifests(&dir, &built.host(), &[plugin.stem], |cmd| {
            if let Some(trt) = &built.trt {
                trt.apply(cmd);
            }
        })?;
        let manifest_path = PluginManifest::path_for(&dir.join(&library));
        let manifest = PluginManifest::read(&manifest_path).map_err(anyhow::Error::from)?;
        let manifest_name =
            manifest_path.file_name().context("manifest name")?.to_string_lossy().into_owned();
        let readme =
            plugin_readme(plugin, &version, &target, &manifest, &description_of(plugin.krate), &commit);
        let entries = vec![
            Entry::executable(library.clone(), std::fs::read(dir.join(&library))?),
            Entry::file(manifest_name, std::fs::read(&manifest_path)?),
            Entry::file("README.md", readme),
        ];
        let top = format!("{}-{version}-{target}", plugin.krate);
        artifacts.push(write_bundle(
            out,
            &top,
            entries,
            epoch,
            "plugin",
            plugin.krate,
            &version,
            Some(manifest),
            None,
        )?);
    }

    let version = version_of(HOST)?;
    let epoch = epoch_for(&record, HOST, &version, sde.as_deref(), head_time)?;
    let host_abi = HostAbi {
        abi_min: delegate_abi::abi::ABI_VERSION_MIN,
        abi_max: delegate_abi::abi::ABI_VERSION_MAX,
        root_interface_version: delegate_abi::abi::ROOT_INTERFACE_VERSION.to_owned(),
    };
    let mut entries = vec![
        Entry::executable(format!("{HOST}{}", std::env::consts::EXE_SUFFIX), std::fs::read(built.host())?),
        Entry::file("README.md", host_readme(&version, &target, &host_abi, &commit)),
    ];
    entries.extend(host_docs(root)?);
    let top = format!("{HOST}-{version}-{target}");
    artifacts.push(write_bundle(out, &top, entries, epoch, "host", HOST, &version, None, Some(host_abi))?);
    drop(staging);

    let manifest = DistManifest { dist_version: DIST_MANIFEST_VERSION, commit, target, rustc, artifacts };
    let mut json = serde_json::to_string_pretty(&manifest)?;
    json.push('\n');
    std::fs::write(out.join(DIST_MANIFEST), json)?;
    Ok(manifest)
}

#[allow(clippy::too_many_arguments)] // One bundle's every property; a struct would only rename them.
fn write_bundle(
    out: &Path,
    top: &str,
    mut entries: Vec<Entry>,
    epoch: Epoch,
    kind: &str,
    krate: &str,
    version: &semver::Version,
    plugin: Option<PluginManifest>,
    host: Option<HostAbi>,
) -> anyhow::Result<Artifact> {
    let sums = archive::sha256sums(&entries);
    entries.push(Entry::file("SHA256SUMS", sums));
    let files = entries.iter().map(|e| (e.path.clone(), archive::sha256_hex(&e.bytes))).collect();
    let bytes = archive::tar_gz(top, &entries, epoch.seconds)?;
    let name = format!("{top}.tar.gz");
    std::fs::write(out.join(&name), &bytes).with_context(|| format!("writing {name}"))?;
    Ok(Artifact {
        name,
        kind: kind.to_owned(),
        krate: krate.to_owned(),
        version: version.to_string(),
        sha256: archive::sha256_hex(&bytes),
        epoch,
        files,
        plugin,
        host,
    })
}

fn plugin_readme(
    plugin: &PluginCrate,
    version: &semver::Version,
    target: &str,
    manifest: &PluginManifest,
    description: &str,
    commit: &str,
) -> String {
    let library = &manifest.library;
    let json = PluginManifest::path_for(Path::new(library)).display().to_string();
    let formats: Vec<String> =
        manifest.wire_formats.iter().map(|w| format!("{} {}", w.format, w.versions)).collect();
    format!(
        "# {name} {mversion} ({krate} {version}, {target})\n\n{description}\n\n\
         - Backends: {backends}\n- ABI versions: {min}..={max} (a host negotiates one it also speaks)\n\
         - Wire formats: {formats}\n- Memory kinds: {memory}\n- Built by: {rustc}\n\n\
         ## Install\n\n\
         Put both files, `{library}` and its manifest `{json}`, in one directory (a plugin directory), then\n\n\
         ```sh\ndelegate-host plugins --plugin-dir DIR\n```\n\n\
         lists the plugin (`listed`: read from the manifest, the library is not opened). A program whose delegate\n\
         calls name one of its backends loads the library and checks it against the manifest (SHA-256 and what\n\
         the plugin says about itself). Add `--probe` to load it now, or put DIR in `DELEGATE_PLUGIN_PATH`.\n\n\
         Check the files with `sha256sum -c SHA256SUMS`. Built reproducibly by `cargo xtask dist` from commit\n\
         {commit}: the same commit and toolchain give the same bytes.\n",
        name = manifest.name,
        mversion = manifest.version,
        krate = plugin.krate,
        backends = manifest.backends.join(", "),
        min = manifest.abi.min,
        max = manifest.abi.max,
        formats = formats.join("; "),
        memory = manifest.memory_kinds.join(", "),
        rustc = manifest.rustc.as_deref().unwrap_or("(not recorded)"),
    )
}

fn host_readme(version: &semver::Version, target: &str, abi: &HostAbi, commit: &str) -> String {
    format!(
        "# {HOST} {version} ({target})\n\n\
         The `{HOST}` command line: inspect, validate and convert delegate blobs, inspect ExecuTorch programs,\n\
         list plugins, run and benchmark programs. It speaks plugin ABI versions {min}..={max} (root interface\n\
         {root}); the reference delegate is embedded.\n\n\
         ## Install\n\n\
         Put `{HOST}` on your `PATH`. Plugins come as their own bundles: put a plugin's library and its\n\
         `.plugin.json` manifest in a directory and pass it with `--plugin-dir DIR` (or list it in\n\
         `DELEGATE_PLUGIN_PATH`); `{HOST} plugins --plugin-dir DIR` shows what is found and why anything was\n\
         rejected.\n\n\
         ## Writing a plugin\n\n\
         - `docs/delegate-abi.md`: the `delegate-abi` crate's guide (the `Delegate` trait, `export_delegate!`,\n\
           the two-crate layout) and the ABI's shape and evolution rules.\n\
         - `docs/plugin-manifest.md`: the `libfoo.plugin.json` format discovery reads.\n\
         - `docs/STABILITY.md`: what each part promises; `docs/delegate-abi-CHANGELOG.md`: ABI changes.\n\n\
         Check the files with `sha256sum -c SHA256SUMS`. Built reproducibly by `cargo xtask dist` from commit\n\
         {commit}.\n",
        min = abi.abi_min,
        max = abi.abi_max,
        root = abi.root_interface_version,
    )
}

/// The docs a third-party plugin author needs, generated from the sources they document.
fn host_docs(root: &Path) -> anyhow::Result<Vec<Entry>> {
    let read = |rel: &str| std::fs::read_to_string(root.join(rel)).with_context(|| format!("reading {rel}"));
    let abi_guide = format!(
        "{}\n\n# The wire level (`delegate_abi::abi`)\n\n{}",
        module_docs(&read("crates/delegate-abi/src/lib.rs")?),
        module_docs(&read("crates/delegate-abi/src/abi.rs")?)
    );
    Ok(vec![
        Entry::file("docs/delegate-abi.md", format!("# delegate-abi\n\n{abi_guide}")),
        Entry::file(
            "docs/plugin-manifest.md",
            format!(
                "# Plugin manifests\n\n{}",
                module_docs(&read("crates/host-runtime/src/plugin_manifest.rs")?)
            ),
        ),
        Entry::file("docs/STABILITY.md", read("STABILITY.md")?),
        Entry::file("docs/delegate-abi-CHANGELOG.md", read("crates/delegate-abi/CHANGELOG.md")?),
    ])
}

/// A source file's inner doc comment (`//!` lines) as Markdown.
pub fn module_docs(source: &str) -> String {
    let mut out = String::new();
    for line in source.lines() {
        let Some(rest) = line.trim_start().strip_prefix("//!") else {
            if line.trim().is_empty() || line.trim_start().starts_with("#![") {
                continue;
            }
            break;
        };
        out.push_str(rest.strip_prefix(' ').unwrap_or(rest));
        out.push('\n');
    }
    out.trim_end().to_owned() + "\n"
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

    #[test]
    fn remaps_put_the_target_directory_last_and_map_every_build_path() {
        let remaps = remaps(Path::new("/ws"), Path::new("/ws/target/dist"));
        let targets: Vec<&str> = remaps.iter().map(|(_, to)| *to).collect();
        assert_eq!(targets.last(), Some(&"/target"));
        assert!(
            targets.contains(&"/kv-delegate") && targets.contains(&"/cargo") && targets.contains(&"/rustup")
        );
        let mut cmd = Command::new("true");
        apply_remaps(&mut cmd, &remaps);
        let env: BTreeMap<String, String> = cmd
            .get_envs()
            .filter_map(|(k, v)| Some((k.to_string_lossy().into_owned(), v?.to_string_lossy().into_owned())))
            .collect();
        let flags = &env["CARGO_ENCODED_RUSTFLAGS"];
        assert!(flags.split('\x1f').any(|f| f == "--remap-path-prefix=/ws=/kv-delegate"), "{flags}");
        assert!(flags.ends_with("--remap-path-prefix=/ws/target/dist=/target"), "{flags}");
        assert!(env["CFLAGS"].contains("-ffile-prefix-map=/ws=/kv-delegate"));
    }

    #[test]
    fn module_docs_are_the_inner_doc_comment() {
        let source = "//! Title.\n//!\n//! - item\n#![forbid(unsafe_code)]\n\nuse x;\n//! not docs\n";
        assert_eq!(module_docs(source), "Title.\n\n- item\n");
    }

    #[test]
    fn build_machine_paths_left_in_a_binary_are_found() {
        let release = tempfile::tempdir().expect("tempdir");
        let built = Built {
            release_dir: release.path().to_path_buf(),
            plugins: vec![PLUGINS[0]],
            trt: None,
            remapped: vec![PathBuf::from("/work/checkout"), PathBuf::from("/home/me/.cargo")],
        };
        let host = built.host();
        let plugin = release.path().join(dylib_name(PLUGINS[0].stem));
        std::fs::write(&host, b"\0/kv-delegate/src/main.rs\0/cargo/registry/src/x.rs\0").expect("write");
        std::fs::write(&plugin, b"\0/work/checkout/plugins/reference/src/lib.rs\0").expect("write");
        let found = foreign_paths(&built).expect("scan");
        assert_eq!(found, [format!("{}: /work/checkout", plugin.display())]);
        std::fs::write(&plugin, b"remapped only: /kv-delegate/plugins").expect("write");
        assert!(foreign_paths(&built).expect("scan").is_empty());
    }
}
