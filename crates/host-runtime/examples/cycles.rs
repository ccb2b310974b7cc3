//! `cycles PLUGIN_DIR N`: N full lifetimes of the example program through the reference delegate's plugin
//! library loaded from disk: load (every `init`), prefill and two decode steps (every `execute`), drop (every
//! `destroy`). `cargo xtask test` runs it under valgrind for a few and for 1 000 cycles and requires the
//! leak summary to be the same, so nothing leaks per cycle (issue 10).

use std::path::PathBuf;

use host_runtime::generate::generate;
use host_runtime::manifest::Manifest;
use host_runtime::plugins::{Discovery, Registry};
use host_runtime::program::{Mode, Program};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: cycles PLUGIN_DIR N";
    let plugin_dir = PathBuf::from(args.next().ok_or(usage)?);
    let cycles: usize = args.next().ok_or(usage)?.parse()?;
    let dir = tempfile::tempdir()?;
    let exported = kv_example::export::reference(&kv_example::Config::tiny(), dir.path())?;
    // Only the library from disk (a directory this example trusts: probed, no manifest needed), no plugin
    // embedded.
    let registry = Registry::discover(Discovery::new().dirs([plugin_dir]).probe(true));
    if registry.served("ReferenceBackend").is_none() {
        return Err(format!(
            "no plugin library serving ReferenceBackend was loaded: {:?}",
            registry.candidates()
        )
        .into());
    }
    for mode in [Mode::ZeroCopy, Mode::CopyBack].into_iter().cycle().take(cycles) {
        let mut program = Program::load(Manifest::load(&exported.manifest_path)?, &registry, mode)?;
        generate(&mut program, 2, |_, _| Ok(()))?;
    }
    println!("cycles: {cycles} load/execute/drop cycles");
    Ok(())
}
