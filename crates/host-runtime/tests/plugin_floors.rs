//! host-runtime's plugin code is layered in floors (`src/plugins/`): the library floor (manifest, verify,
//! load) knows nothing above it, and the isolation floor loads a worker's plugin through the library floor,
//! never calling up into the registry that decides which plugin serves (no module cycle).

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, recursively.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap_or_else(|err| panic!("{}: {err}", dir.display())) {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            out.extend(sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}

/// The files of floor `floor` (its root file and its directory) that name any of `above`.
fn reaching_up(floor: &str, above: &[&str]) -> Vec<String> {
    let plugins = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/plugins");
    let mut files = sources(&plugins.join(floor));
    files.push(plugins.join(format!("{floor}.rs")));
    files
        .iter()
        .filter(|path| path.is_file())
        .flat_map(|path| {
            let text = std::fs::read_to_string(path).expect("readable");
            let hits: Vec<String> = above
                .iter()
                .filter(|name| text.lines().any(|l| !l.trim_start().starts_with("//") && l.contains(*name)))
                .map(|name| format!("{} names {name}", path.display()))
                .collect();
            hits
        })
        .collect()
}

#[test]
fn the_library_floor_knows_nothing_above_it() {
    assert!(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/plugins/library").is_dir(), "the floor exists");
    let up = reaching_up("library", &["::isolate", "registry", "Registry", "Served", "Candidate"]);
    assert_eq!(up, Vec::<String>::new());
}

#[test]
fn the_isolation_floor_loads_through_the_library_floor_not_the_registry() {
    assert!(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/plugins/isolate").is_dir(), "the floor exists");
    let up =
        reaching_up("isolate", &["registry", "plugins::load_checked", "Registry", "Served", "Candidate"]);
    assert_eq!(up, Vec::<String>::new());
}
