//! `cargo xtask dist`: reproducible bundles of what users get, the plugin libraries and the `delegate-host` CLI.
//!
//! 1. [`build`]: `cargo build --release --locked` of the plugin cdylibs and `delegate-host` in their own target
//!    directory (`<target>/dist`), with every build-machine path remapped (`--remap-path-prefix` for rustc,
//!    `-ffile-prefix-map` for C and assembly built by `cc`): the workspace root becomes `/kv-delegate`, cargo's
//!    home `/cargo`, rustup's home `/rustup`, the target directory `/target`.
//! 2. [`bundle`]: per plugin `<crate>-<version>-<target>.tar.gz` holding the library, its manifest (written
//!    by the host just built from the library itself, as discovery reads it, `rustc` included), a generated
//!    README and `SHA256SUMS`; the host bundle holds the binary, a README, the docs a third-party plugin author
//!    needs ([`docs`], generated from the crate docs) and `SHA256SUMS`. Archives are written by [`archive`]:
//!    sorted, owned by 0:0, fixed modes, every mtime the bundle's [`manifest::Epoch`].
//! 3. [`manifest`]: `dist-manifest.json` lists every artifact with its SHA-256, version and what it is.
//!
//! The same commit built on another machine or checkout gives the same bytes: [`build::foreign_paths`] checks that
//! no build-machine path is left in a binary, and `cargo xtask test` assembles twice and compares (see
//! [`check_reproducible`]).

pub mod archive;
pub mod build;
pub mod bundle;
pub mod docs;
pub mod manifest;

use std::path::{Path, PathBuf};

use anyhow::Context;

pub use build::dist_target_dir;
pub use manifest::{DistManifest, DIST_MANIFEST};

use build::{build, build_in};
use bundle::assemble;

use crate::util::{dylib_name, target_dir};

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
    build::ensure_no_foreign_paths(&built)?;
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
/// the build machine (checkout, target directory, cargo home), which [`build::foreign_paths`] finds directly; the
/// slow check that builds in a second target directory and compares the binaries is
/// `cargo xtask dist --rebuild-check` ([`check_rebuild`]).
pub fn check_reproducible(root: &Path, tensorrt: bool) -> anyhow::Result<PathBuf> {
    let started = std::time::Instant::now();
    let built = build(root, tensorrt)?;
    build::ensure_no_foreign_paths(&built)?;
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
