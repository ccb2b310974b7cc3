//! An application embedding the host runtime, as host-runtime 0.2.0's crate docs write one ("Embedding").

use delegate_abi::host::HostConfig;
use host_runtime::{
    manifest::Manifest,
    plugins::{Discovery, Registry},
    program::{Mode, Program},
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let program = std::env::args().nth(1).unwrap_or_else(|| "example/program.toml".to_owned());
    let registry = Registry::discover(Discovery::new().use_env(true))
        .with_embedded(my_delegate::delegate_root(), &HostConfig::default());
    let manifest = Manifest::load(program.as_ref())?;
    let mut program = Program::load(manifest, &registry, Mode::ZeroCopy)?;
    let generation = host_runtime::generate::generate(&mut program, 15, |_, _| Ok(()))?;
    println!("{:?}", generation.tokens);
    Ok(())
}
