//! `gpu-test` and `bench-gpu`: build the GPU bundle here (release binaries, the CUDA delegate's and the CUDA
//! layer's test executables, the decode benchmarks of the hand-built Hugging Face-form graph and of exported
//! graphs, the PyTorch baseline) and say the one command that runs it on a GPU machine. The exported graphs
//! the bench reads (`fixtures/bench/*.rgd`) are tracked files, which the `device` tool carries with the tree.
//!
//! The GPU machine has no Rust toolchain: everything it runs is built here and carried there (the `device`
//! tool carries ignored paths named in `carry`; 64 MiB in all with the tracked tree, so binaries are stripped
//! and the bundle travels as one xz archive, [`PACK`]).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context};

use crate::util;

/// The CUDA delegate's feature the bundle is built with: `KV_CUDA_DEFINES` sets its kernels' tunables
/// (`run.sh sweep`).
const TUNING: &str = "cuda-delegate/tuning";

/// Where the bundle goes, relative to the project root.
pub const BUNDLE: &str = "target/gpu-bundle";

/// Benchmark executables the bundle carries: (package, bench target, name in the bundle).
const BENCHES: [(&str, &str, &str); 3] = [
    ("cuda-delegate", "hf_decode", "bench_hf_decode"),
    ("cuda-delegate", "export_decode", "bench_export_decode"),
    ("cuda-delegate", "prefill", "bench_prefill"),
];

/// Test executables the bundle carries: (package, test target, name in the bundle).
const TESTS: [(&str, &str, &str); 5] = [
    ("cuda-delegate", "gpu", "test_cuda_delegate"),
    ("cuda-rt", "cuda", "test_cuda_rt"),
    ("cuda-rt", "graph", "test_cuda_rt_graph"),
    ("host-runtime", "device_loop", "test_host_device_loop"),
    ("host-runtime", "program", "test_host_program"),
];

/// Builds the bundle and prints how to run `what` (`test` or `bench`) with it.
pub fn bundle(root: &Path, what: &str) -> anyhow::Result<()> {
    let bundle = root.join(BUNDLE);
    if bundle.exists() {
        std::fs::remove_dir_all(&bundle).with_context(|| format!("clearing {}", bundle.display()))?;
    }
    std::fs::create_dir_all(&bundle)?;
    let target = util::target_dir(root)?;
    util::run_cmd(
        root,
        util::cargo().args([
            "build",
            "--release",
            "-p",
            "delegate-host",
            "-p",
            "cuda-delegate-dylib",
            "--features",
            TUNING,
        ]),
    )?;
    util::run_cmd(
        root,
        util::cargo().args(["build", "--release", "-p", "kv-example", "--example", "export"]),
    )?;
    for file in ["delegate-host", "libcuda_delegate_dylib.so"] {
        copy_stripped(&target.join("release").join(file), &bundle.join(file))?;
    }
    copy_stripped(&target.join("release/examples/export"), &bundle.join("export-example"))?;
    for (kind, targets) in [("test", &TESTS[..]), ("bench", &BENCHES[..])] {
        for &(package, target, name) in targets {
            if let Some(exe) = executable(root, kind, package, target)? {
                copy_stripped(&exe, &bundle.join(name))?;
            }
        }
    }
    for file in std::fs::read_dir(root.join("gpu"))? {
        let file = file?.path();
        if file.is_file() {
            std::fs::copy(&file, bundle.join(file.file_name().expect("a file name")))?;
        }
    }
    let size: u64 =
        std::fs::read_dir(&bundle)?.filter_map(|e| e.ok()?.metadata().ok()).map(|m| m.len()).sum();
    let packed = pack(root)?;
    println!(
        "built {BUNDLE} ({} MiB), packed into {PACK} ({} MiB). On the GPU machine (`device` tool, carry \
         [\"{PACK_DIR}\"]), in one call:",
        size >> 20,
        packed >> 20
    );
    println!("    tar -C target -xJf {PACK} && bash {BUNDLE}/run.sh {what}");
    Ok(())
}

/// Where [`pack`] writes the bundle's archive: a folder of its own, so `carry` names it alone.
pub const PACK_DIR: &str = "target/gpu-pack";
/// The archive itself.
pub const PACK: &str = "target/gpu-pack/bundle.tar.xz";

/// The most the archive may take: the `device` tool carries 64 MiB in all, and the tracked tree takes about 32
/// of them (fixtures, the committed `.pte` programs).
const PACK_LIMIT: u64 = 28 << 20;

/// Packs the bundle as one xz archive ([`PACK`]; the stripped binaries compress about sixfold, where the
/// bundle itself, 40 MiB and more, does not fit beside the tree). Returns its size.
fn pack(root: &Path) -> anyhow::Result<u64> {
    let dir = root.join(PACK_DIR);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let archive = root.join(PACK);
    let bundle = root.join(BUNDLE);
    let (Some(parent), Some(name)) = (bundle.parent(), bundle.file_name()) else {
        bail!("{BUNDLE} names no folder inside another");
    };
    let mut tar = Command::new("tar");
    tar.arg("-C").arg(parent).arg("-cJf").arg(&archive).arg(name);
    util::run_cmd(root, &mut tar)?;
    let packed = std::fs::metadata(&archive)?.len();
    if packed > PACK_LIMIT {
        bail!(
            "{PACK} is {} MiB; beside the tracked tree (about 32 MiB) the GPU machine takes 64 MiB in all",
            packed >> 20
        );
    }
    Ok(packed)
}

/// The executable of `package`'s `kind` target (`test` or `bench`) `target`, built with release settings;
/// `None` when the package has no such target.
fn executable(root: &Path, kind: &str, package: &str, target: &str) -> anyhow::Result<Option<PathBuf>> {
    // `cargo bench` builds with the bench profile (release settings) and takes no `--release`.
    let profile: &[&str] = if kind == "test" { &["--release"] } else { &[] };
    let output = util::cargo()
        .current_dir(root)
        .arg(kind)
        .args(profile)
        .args(["--no-run", "--message-format=json", "-p", package, &format!("--{kind}"), target])
        .args(if package == "cuda-delegate" { &["--features", "tuning"][..] } else { &[] })
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("building {package}'s {kind} {target}"))?;
    if !output.status.success() {
        bail!("building {package}'s {kind} {target} failed");
    }
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let is_kind = message["target"]["kind"].as_array().is_some_and(|k| k.iter().any(|k| k == kind));
        if is_kind && message["target"]["name"] == target {
            if let Some(exe) = message["executable"].as_str() {
                return Ok(Some(PathBuf::from(exe)));
            }
        }
    }
    Ok(None)
}

fn copy_stripped(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::copy(from, to).with_context(|| format!("copying {}", from.display()))?;
    // `strip` is optional: an unstripped bundle still runs, it is only bigger.
    let stripped = Command::new("strip").arg("--strip-debug").arg(to).status();
    if !matches!(stripped, Ok(s) if s.success()) {
        eprintln!("note: could not strip {}", to.display());
    }
    Ok(())
}
