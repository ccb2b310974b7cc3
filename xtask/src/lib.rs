//! What every xtask package shares: the `xtask` binary (the thin one `cargo xtask` compiles first) and the
//! task packages it runs on demand, `xtask-release` and `xtask-example`.
//!
//! - [`util`]: the project root, the target directory, running commands, plugin manifests, wheels.
//! - [`trt_setup`], [`executorch_setup`]: what the TensorRT and ExecuTorch crates need to build and test.
//! - [`on_demand`]: which tasks the other packages carry, and running them.

pub mod executorch_setup;
pub mod on_demand;
pub mod trt_setup;
pub mod util;
