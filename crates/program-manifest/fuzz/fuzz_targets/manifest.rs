//! Fuzzes `program_manifest::Manifest::parse` (and `ProgramSpec::parse`) on arbitrary text: never a panic;
//! every refusal is one line naming a location inside the text; an accepted manifest writes back to text that
//! parses to the same program.
#![no_main]

use std::path::Path;

use program_manifest::{Manifest, ProgramSpec};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let path = Path::new("fuzz/program.toml");
    match Manifest::parse(path, text) {
        Ok(manifest) => {
            // What was accepted is also accepted as written, and its blobs stay inside the program's directory.
            let spec = ProgramSpec::parse(path, text).expect("a checked manifest parses as written");
            let again = Manifest::parse(path, &spec.to_toml().expect("writes back")).expect("re-reads");
            assert_eq!(again.methods.len(), manifest.methods.len());
            assert_eq!(again.buffers, manifest.buffers);
            for call in manifest.methods.values().flat_map(|m| &m.calls) {
                assert!(call.blob.starts_with("fuzz"), "{}", call.blob.display());
                // Opened beneath the program's directory, links resolved (issue 17, item 13).
                assert_eq!(call.blob_root.as_deref(), Some(Path::new("fuzz")));
            }
            // Every accepted tensor's size passed the one checked product (issue 17, item 12).
            let methods = manifest.methods.values();
            let io = methods.flat_map(|m| m.inputs.iter().chain(&m.outputs));
            for decl in manifest.buffers.values().chain(io) {
                assert!(program_manifest::checked_nbytes(decl.dtype, &decl.shape).is_some(), "{decl:?}");
            }
        }
        Err(err) => {
            let message = err.to_string();
            assert!(!message.contains('\n'), "one line: {message}");
        }
    }
});
