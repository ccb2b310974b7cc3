//! The program the cache file tests save and restore: the tiny example with heads of 8 (its caches
//! `[2, 16, 8]`, one axis as long as the positions: the sequence axis, so a saved cache holds the prefix only;
//! the tiny example's `[2, 16, 16]` is saved whole), exported, loaded and run.

#![allow(dead_code)] // each test file uses what it needs

use std::path::{Path, PathBuf};

use delegate_abi::host::HostConfig;
use host_runtime::generate::generate;
use host_runtime::manifest::Manifest;
use host_runtime::plugins::{Discovery, Registry};
use host_runtime::program::{Mode, Program};

/// The tiny example with heads of 8.
pub fn config() -> kv_example::Config {
    kv_example::Config { head_dim: 8, ..kv_example::Config::tiny() }
}

/// Exports `config` into `dir`; its manifest.
pub fn export(dir: &Path, config: &kv_example::Config) -> PathBuf {
    kv_example::export::reference(config, dir).expect("export");
    dir.join("program.toml")
}

/// Loads the manifest at `path` with the reference delegate embedded.
pub fn load(path: &Path) -> Program {
    let registry = Registry::discover(Discovery::new())
        .with_embedded(reference_delegate::delegate_root(), &HostConfig::default());
    Program::load(Manifest::load(path).expect("manifest"), &registry, Mode::ZeroCopy).expect("loads")
}

/// The tiny example's prompt (4 tokens) and a fresh run of 8 decode steps: the tokens fed at positions
/// 0..12 and the 9 tokens generated.
pub fn fresh_run(program: &mut Program) -> (Vec<i64>, Vec<i64>) {
    let generation = generate(program, 8, |_, _| Ok(())).expect("generates");
    let prompt = kv_example::Config::tiny().prompt;
    let fed = prompt.iter().chain(&generation.tokens[..8]).copied().collect();
    (fed, generation.tokens)
}
