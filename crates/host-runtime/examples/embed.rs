//! `embed [PROGRAM.toml] [STEPS]`: an application embedding host-runtime with the one plugin it chooses to
//! link, the reference delegate, and running a program through it. host-runtime itself links no plugin: the
//! application registers the plugins it ships with `Registry::with_embedded`, beside any plugin library
//! `DELEGATE_PLUGIN_PATH` lists. Without a program, it writes the tiny example decoder into a temporary
//! directory and runs that (`cargo run -p host-runtime --example embed`). `tests/embedding.rs` runs it.

use std::path::{Path, PathBuf};

use delegate_abi::host::HostConfig;
use host_runtime::generate::{generate, Generation};
use host_runtime::manifest::Manifest;
use host_runtime::plugins::{Discovery, Registry};
use host_runtime::program::{Mode, Program};

/// The application's registry: the plugin libraries `discovery` finds, then the reference delegate linked
/// into this binary.
pub fn registry(discovery: Discovery) -> Registry {
    Registry::discover(discovery).with_embedded(reference_delegate::delegate_root(), &HostConfig::default())
}

/// Loads the program at `manifest` with the plugins of [`registry`] and generates `steps` tokens.
pub fn run(
    discovery: Discovery,
    manifest: &Path,
    steps: usize,
) -> Result<Generation, Box<dyn std::error::Error>> {
    let registry = registry(discovery);
    let mut program = Program::load(Manifest::load(manifest)?, &registry, Mode::ZeroCopy)?;
    Ok(generate(&mut program, steps, |_, _| Ok(()))?)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let program = args.next().map(PathBuf::from);
    let steps: usize = args.next().map_or(Ok(8), |s| s.parse())?;
    let scratch = tempfile::tempdir()?;
    let manifest = match program {
        Some(path) => path,
        None => kv_example::export::reference(&kv_example::Config::tiny(), scratch.path())?.manifest_path,
    };
    let generation = run(Discovery::new().use_env(true), &manifest, steps)?;
    println!("tokens: {:?}", generation.tokens);
    Ok(())
}
