//! The release build: `cargo build --release --locked` of the host and the plugin cdylibs in their own target
//! directory, every build-machine path remapped, and the scan that finds one left in a binary.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

use super::{PluginCrate, HOST, PLUGINS};
use crate::trt_setup::TrtEnv;
use crate::util::{cargo, dylib_name, run_cmd, target_dir};

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

/// Fails when [`foreign_paths`] finds a build-machine path in a binary of `built`.
pub fn ensure_no_foreign_paths(built: &Built) -> anyhow::Result<()> {
    let leaks = foreign_paths(built)?;
    if !leaks.is_empty() {
        bail!("build-machine paths left in the release binaries:\n  {}", leaks.join("\n  "));
    }
    Ok(())
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && memchr::memmem::find(haystack, needle).is_some()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

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
