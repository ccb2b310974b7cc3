//! What a plugin library exports, read from the file (never loaded): its defined dynamic symbols, and its
//! root-module interface version (abi_stable's header, which needs loading: [`root_interface_version`]).
//!
//! The rule: exactly one plugin entry, [`ENTRY_SYMBOL`]; any other export fails, except the named
//! [`TOLERATED_PREFIXES`] (today the `cxx` runtime's helpers in the TensorRT plugin, which rustc exports from
//! every cdylib that links `cxx`).

use std::path::Path;

use anyhow::Context;
use object::{Object, ObjectSymbol};

/// The one symbol a plugin exports: abi_stable's root-module loader, which `delegate_abi::export_delegate!`
/// writes.
pub const ENTRY_SYMBOL: &str = abi_stable::library::ROOT_MODULE_LOADER_NAME;

/// The names of the symbols `bytes` (a shared library) defines and exports dynamically, sorted. Imports
/// (undefined symbols) are not exports.
///
/// # Errors
/// The bytes are not an object file this build reads (ELF).
pub fn exported_symbols(bytes: &[u8]) -> anyhow::Result<Vec<String>> {
    let file = object::File::parse(bytes).context("not an object file this build reads")?;
    let mut names: Vec<String> = file
        .dynamic_symbols()
        .filter(|s| s.is_definition() && s.is_global())
        .filter_map(|s| s.name().ok().filter(|n| !n.is_empty()).map(str::to_owned))
        .collect();
    names.sort();
    names.dedup();
    Ok(names)
}

/// Exports a plugin may have besides [`ENTRY_SYMBOL`], by name prefix, each with the reason; nothing else.
///
/// - `cxxbridge1$`: the `cxx` runtime (linked by `trtx-sys` into the TensorRT plugin) defines its C++-facing
///   functions with `#[export_name]`, and rustc exports every such symbol from a cdylib; a linker version
///   script cannot take them back (rustc's own script lists them as global). They are the C++ bridge's
///   helpers, not plugin entries: the host never looks them up.
pub const TOLERATED_PREFIXES: [&str; 1] = ["cxxbridge1$"];

/// The exported names that are neither [`ENTRY_SYMBOL`] nor [`TOLERATED_PREFIXES`], and whether the entry
/// symbol is there.
pub fn unexpected_exports(names: &[String]) -> (bool, Vec<&str>) {
    let has_entry = names.iter().any(|n| n == ENTRY_SYMBOL);
    let unexpected = names
        .iter()
        .map(String::as_str)
        .filter(|n| *n != ENTRY_SYMBOL && !TOLERATED_PREFIXES.iter().any(|p| n.starts_with(p)))
        .collect();
    (has_entry, unexpected)
}

/// Checks that `library` exports the one entry symbol [`ENTRY_SYMBOL`] and nothing else but the
/// [`TOLERATED_PREFIXES`] (reported, not failed).
///
/// # Errors
/// The file cannot be read or parsed, it lacks the entry symbol, or it exports something else (every name
/// listed).
pub fn check_entry_symbol(library: &Path) -> anyhow::Result<()> {
    let bytes = std::fs::read(library).with_context(|| format!("reading {}", library.display()))?;
    let names = exported_symbols(&bytes).with_context(|| format!("{}", library.display()))?;
    let (has_entry, unexpected) = unexpected_exports(&names);
    anyhow::ensure!(
        has_entry && unexpected.is_empty(),
        "{} must export exactly the entry symbol {ENTRY_SYMBOL}; it exports [{}]",
        library.display(),
        names.join(", ")
    );
    let tolerated = names.len() - 1;
    if tolerated > 0 {
        eprintln!(
            "compat: {} also exports {tolerated} cxx bridge symbols (`cxxbridge1$*`, tolerated: see \
             TOLERATED_PREFIXES)",
            library.display()
        );
    }
    Ok(())
}

/// The root-module interface version a plugin library's abi_stable header records (`1.0.0`). The library is
/// opened (its header read; no plugin code beyond the loader's constructors runs) and never closed.
///
/// # Errors
/// The library cannot be opened or has no abi_stable header.
pub fn root_interface_version(library: &Path) -> anyhow::Result<String> {
    let header = abi_stable::library::lib_header_from_path(library)
        .map_err(|err| anyhow::anyhow!("{}: {err}", library.display()))?;
    Ok(header.version_strings().version.as_str().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_entry_symbol_and_the_tolerated_bridge_helpers_pass() {
        let names = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(unexpected_exports(&names(&[ENTRY_SYMBOL])), (true, vec![]));
        let with_bridge = names(&[ENTRY_SYMBOL, "cxxbridge1$string$new"]);
        assert_eq!(unexpected_exports(&with_bridge), (true, vec![]));
        let extra = names(&[ENTRY_SYMBOL, "my_helper", "cxxbridge1$str$len"]);
        assert_eq!(unexpected_exports(&extra), (true, vec!["my_helper"]));
        assert_eq!(unexpected_exports(&names(&["cxxbridge1$str$len"])), (false, vec![]));
    }

    #[test]
    fn the_entry_symbol_is_the_one_delegate_abi_writes() {
        assert_eq!(ENTRY_SYMBOL, delegate_abi::__private::ROOT_SYMBOL);
    }

    /// A plugin the tests built (`DELEGATE_TEST_PLUGIN_DIR`, as `cargo xtask test` sets it) exports exactly the
    /// entry symbol and records the root interface version this build of delegate-abi has; a library that is
    /// not a plugin (this test binary's neighbour, the host) fails the check.
    #[test]
    fn built_plugins_export_exactly_the_entry_symbol() {
        // `cargo xtask test` names the directory; a plain `cargo test` reads the workspace's debug build.
        let dir =
            std::env::var_os("DELEGATE_TEST_PLUGIN_DIR").map(std::path::PathBuf::from).unwrap_or_else(|| {
                let root = crate::util::project_root();
                crate::util::target_dir(&root).expect("the target dir").join("debug")
            });
        let reference = dir.join(crate::util::dylib_name("reference_delegate_dylib"));
        assert!(
            reference.is_file(),
            "{} is missing: build it (`cargo build -p reference-delegate-dylib -p delegate-host`) or run `cargo \
             xtask test`",
            reference.display()
        );
        for stem in ["reference_delegate_dylib", "abi_test"] {
            let library = dir.join(crate::util::dylib_name(stem));
            if stem == "abi_test" && !library.is_file() {
                continue; // A dist build directory has the shipped plugins only.
            }
            check_entry_symbol(&library).expect("exactly the entry symbol");
            assert_eq!(
                root_interface_version(&library).expect("header"),
                delegate_abi::abi::ROOT_INTERFACE_VERSION
            );
        }
        // The host binary exports no entry symbol: the check can fail.
        let host = dir.join(format!("delegate-host{}", std::env::consts::EXE_SUFFIX));
        let err = check_entry_symbol(&host).expect_err("the host is no plugin");
        assert!(err.to_string().contains("must export exactly the entry symbol"), "{err}");
    }
}
