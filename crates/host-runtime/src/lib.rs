//! The host runtime: loads delegate plugins, owns caller buffers and runs a program's methods through them,
//! threading caller-owned KV caches as delegate arguments so that every step sees the cache the previous step
//! wrote. It is the library an application embeds; the `delegate-host` command line is its own crate
//! (`crates/delegate-host`) on top of it.
//!
//! The caller drives the caches' life through [`program::Program`]: `reset`, `rewind`, `save_cache` /
//! `restore_cache`, and `fork` a second sequence from a prefix ([`program::Caches`], run through the same
//! delegate instances with `swap_caches`; [`generate::continue_from`] decodes either branch).
//!
//! ## Embedding
//!
//! This crate links no plugin: it depends on the plugin ABI (`delegate-abi`), never on a plugin crate, so an
//! application carries only the plugins it chooses. Plugin libraries are found by
//! [`plugins::Registry::discover`], given a [`plugins::Discovery`] (directories, `DELEGATE_PLUGIN_PATH`,
//! probing, isolation); a plugin linked into the application is registered with
//! [`plugins::Registry::with_embedded`] from its library crate's `delegate_root()`. `delegate-host` and
//! `et-run` embed the reference and CUDA delegates this way; `examples/embed.rs` is an application with the
//! reference delegate alone (`cargo run -p host-runtime --example embed`).
//!
//! ## Examples
//!
//! ```no_run
//! use delegate_abi::host::HostConfig;
//! use host_runtime::{manifest::Manifest, plugins::{Discovery, Registry}, program::{Mode, Program}};
//!
//! // Manifests only: no library's code runs until a program needs its backend and its bytes match its
//! // manifest (`Discovery::probe` loads every library instead). The reference delegate is linked into this
//! // application and registered as an embedded plugin.
//! let registry = Registry::discover(Discovery::new().use_env(true))
//!     .with_embedded(reference_delegate::delegate_root(), &HostConfig::default());
//! let manifest = Manifest::load("example/program.toml".as_ref())?;
//! let mut program = Program::load(manifest, &registry, Mode::ZeroCopy)?;
//! let generation = host_runtime::generate::generate(&mut program, 15, |_, _| Ok(()))?;
//! println!("{:?}", generation.tokens);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ExecuTorch programs (`.pte`) load onto the same machinery ([`pte::load`]): their delegate calls, buffers
//! and write-backs become a [`program::Program`]'s calls, buffers and argument plans.
//!
//! ## CUDA
//!
//! Buffers and method inputs and outputs declared `device`, `managed` or `pinned` get real CUDA memory of
//! that kind ([`cuda`], through `cuda-rt`, the workspace's one CUDA layer). libcuda is loaded at run time, only
//! when a program declares such memory: a machine without a driver runs host-memory programs and refuses the
//! others with a clear `NotSupported` error. Such a program owns one CUDA stream that GPU delegates get with
//! every call ([`program`]'s docs: the stream invariant), and [`generate`] keeps a whole generation on the GPU
//! when the program's decode inputs and next-token output live there (optionally as a replayed CUDA graph).
//!
//! ## Feature Flags
//!
//! None.
#![deny(missing_docs)]
#![deny(unsafe_code)]

pub mod blob_file;
pub mod buffer;
pub mod cuda;
pub mod generate;
/// Isolated plugins (Linux): `plugins`' isolation floor, at its 0.2.0 path.
#[cfg(target_os = "linux")]
pub use plugins::isolate;
mod lend;
/// The plugin manifest: `plugins`' library floor, at its 0.2.0 path.
pub use plugins::library::manifest as plugin_manifest;
pub mod plugins;
pub mod program;
pub mod pte;

/// The program manifest ([`program_manifest`]): [`program::Program::load`] takes its checked [`manifest::Manifest`].
pub use program_manifest as manifest;
