//! `cargo xtask test` setup for the CUDA kernels: NVRTC, CUDA's run-time compiler, from PyPI's
//! `nvidia-cuda-nvrtc==13.0.88` wheel (the CUDA 13.0 of the GPU machine), unpacked into
//! `<root>/.cache/nvrtc/` with nothing installed. NVRTC needs no driver and no GPU, so CI compiles every
//! kernel the project ships (the CUDA delegate's, the host's feedback kernel) on a CPU-only machine:
//! [`NvrtcEnv::apply`] puts the library on the loader path and sets `KV_REQUIRE_NVRTC=1`, which turns the
//! kernel tests' "needs NVRTC" into a failure.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The PyPI wheel with `libnvrtc.so.13`.
pub const WHEEL_REQUIREMENT: &str = "nvidia-cuda-nvrtc==13.0.88";

/// Where NVRTC is, once [`ensure`] has run.
#[derive(Debug, Clone)]
pub struct NvrtcEnv {
    /// Directory holding `libnvrtc.so.13`.
    pub lib_dir: PathBuf,
}

impl NvrtcEnv {
    /// Prepends the library directory to the command's `LD_LIBRARY_PATH` (as already set on the command,
    /// else inherited) and sets `KV_REQUIRE_NVRTC=1`.
    pub fn apply(&self, cmd: &mut Command) {
        let current = cmd
            .get_envs()
            .find(|(key, _)| *key == "LD_LIBRARY_PATH")
            .and_then(|(_, value)| value.map(|v| v.to_string_lossy().into_owned()))
            .or_else(|| std::env::var("LD_LIBRARY_PATH").ok())
            .filter(|v| !v.is_empty());
        let dir = self.lib_dir.display();
        cmd.env("LD_LIBRARY_PATH", current.map_or_else(|| dir.to_string(), |old| format!("{dir}:{old}")));
        cmd.env("KV_REQUIRE_NVRTC", "1");
    }
}

/// Downloads and unpacks the wheel unless the library is already there.
pub fn ensure(root: &Path) -> anyhow::Result<NvrtcEnv> {
    let cache = root.join(".cache").join("nvrtc");
    let unpacked = cache.join("nvidia-cuda-nvrtc-13.0.88");
    let lib_dir = unpacked.join("nvidia").join("cu13").join("lib");
    crate::util::pip_wheel(
        &cache,
        WHEEL_REQUIREMENT,
        "nvidia_cuda_nvrtc-13.0.88",
        &unpacked,
        &lib_dir.join("libnvrtc.so.13"),
    )?;
    Ok(NvrtcEnv { lib_dir })
}
