//! A restore whose buffer writes fail part-way (a CUDA copy that fails, injected here at the write):
//! issue 44, item 4.

use std::path::Path;

use delegate_abi::host::HostConfig;

use crate::cuda;
use crate::generate::generate;
use crate::plugins::{Discovery, Registry};
use crate::program::{Error, Mode, Program};

/// The tiny example with heads of 8 (its caches have a sequence axis) and two layers (four caches), run for
/// 4 decode steps.
fn program(dir: &Path) -> Program {
    let config = kv_example::Config { head_dim: 8, layers: 2, ..kv_example::Config::tiny() };
    kv_example::export::reference(&config, dir).expect("export");
    let registry = Registry::discover(Discovery::new())
        .with_embedded(reference_delegate::delegate_root(), &HostConfig::default());
    let manifest = program_manifest::Manifest::load(&dir.join("program.toml")).expect("manifest");
    let mut program = Program::load(manifest, &registry, Mode::ZeroCopy).expect("loads");
    generate(&mut program, 4, |_, _| Ok(())).expect("generates");
    program
}

#[test]
fn a_restore_failing_part_way_tears_what_it_wrote_and_the_next_restore_mends_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut program = program(dir.path());
    let file = dir.path().join("cache.safetensors");
    program.save_cache(&file, 4, &[]).expect("saves");
    let position = program.position();
    let names: Vec<String> = program.buffers.iter().map(|b| b.decl.name.clone()).collect();
    assert!(names.len() > 2, "{names:?}");

    // The second buffer's write fails: the first holds the file's rows, the second may hold anything.
    let mut writes = 0;
    let err = program
        .restore_cache_with(&file, |storage, bytes| {
            writes += 1;
            match writes {
                2 => Err(cuda::Error::SizeMismatch { call: "write", dst: 0, src: 0 }),
                _ => storage.write(bytes),
            }
        })
        .expect_err("the second write fails");
    assert!(
        matches!(&err, Error::BufferAccess { buffer, action: "writing", .. } if *buffer == names[1]),
        "{err}"
    );
    assert_eq!(program.torn_buffers(), names[..2], "the buffers written, and the one that failed, are torn");
    assert_eq!(program.position(), position, "the position is the one before the restore");
    let decode = program.manifest().generate.as_ref().expect("[generate]").decode.clone();
    let refused = program.execute(&decode).expect_err("torn caches are not decoded");
    let message = refused.to_string();
    let restore = format!("which the restore of cache file {} may have left half-written", file.display());
    assert!(matches!(refused, Error::TornBuffers { .. }) && message.contains(&restore), "{message}");

    assert_eq!(program.restore_cache(&file).expect("restores").position, 4);
    assert!(program.torn_buffers().is_empty(), "a whole restore clears the mark");
}
