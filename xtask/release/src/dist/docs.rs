//! The texts a bundle carries besides its binaries: the READMEs, and the plugin author's docs generated from
//! the crate docs they repeat (so they cannot drift from them).

use std::path::Path;

use anyhow::Context;
use host_runtime::plugin_manifest::PluginManifest;

use super::archive::Entry;
use super::manifest::HostAbi;
use super::{PluginCrate, HOST};

/// A plugin bundle's README: what the plugin is, what it speaks, how to install and check it.
pub fn plugin_readme(
    plugin: &PluginCrate,
    version: &semver::Version,
    target: &str,
    manifest: &PluginManifest,
    description: &str,
    commit: &str,
) -> String {
    let library = &manifest.library;
    let json = PluginManifest::path_for(Path::new(library)).display().to_string();
    let formats: Vec<String> =
        manifest.wire_formats.iter().map(|w| format!("{} {}", w.format, w.versions)).collect();
    format!(
        "# {name} {mversion} ({krate} {version}, {target})\n\n{description}\n\n\
         - Backends: {backends}\n- ABI versions: {min}..={max} (a host negotiates one it also speaks)\n\
         - Wire formats: {formats}\n- Memory kinds: {memory}\n- Built by: {rustc}\n\n\
         ## Install\n\n\
         Put both files, `{library}` and its manifest `{json}`, in one directory (a plugin directory), then\n\n\
         ```sh\ndelegate-host plugins --plugin-dir DIR\n```\n\n\
         lists the plugin (`listed`: read from the manifest, the library is not opened). A program whose delegate\n\
         calls name one of its backends loads the library and checks it against the manifest (SHA-256 and what\n\
         the plugin says about itself). Add `--probe` to load it now, or put DIR in `DELEGATE_PLUGIN_PATH`.\n\n\
         Check the files with `sha256sum -c SHA256SUMS`. Built reproducibly by `cargo xtask dist` from commit\n\
         {commit}: the same commit and toolchain give the same bytes.\n",
        name = manifest.name,
        mversion = manifest.version,
        krate = plugin.krate,
        backends = manifest.backends.join(", "),
        min = manifest.abi.min,
        max = manifest.abi.max,
        formats = formats.join("; "),
        memory = manifest.memory_kinds.join(", "),
        rustc = manifest.rustc.as_deref().unwrap_or("(not recorded)"),
    )
}

/// The host bundle's README: what the binary does, how to install it and add plugins, where the docs are.
pub fn host_readme(version: &semver::Version, target: &str, abi: &HostAbi, commit: &str) -> String {
    format!(
        "# {HOST} {version} ({target})\n\n\
         The `{HOST}` command line: inspect, validate and convert delegate blobs, inspect ExecuTorch programs,\n\
         list plugins, run and benchmark programs. It speaks plugin ABI versions {min}..={max} (root interface\n\
         {root}); the reference delegate is embedded.\n\n\
         ## Install\n\n\
         Put `{HOST}` on your `PATH`. Plugins come as their own bundles: put a plugin's library and its\n\
         `.plugin.json` manifest in a directory and pass it with `--plugin-dir DIR` (or list it in\n\
         `DELEGATE_PLUGIN_PATH`); `{HOST} plugins --plugin-dir DIR` shows what is found and why anything was\n\
         rejected.\n\n\
         ## Writing a plugin\n\n\
         - `docs/delegate-abi.md`: the `delegate-abi` crate's guide (the `Delegate` trait, `export_delegate!`,\n\
           the two-crate layout) and the ABI's shape and evolution rules.\n\
         - `docs/plugin-manifest.md`: the `libfoo.plugin.json` format discovery reads.\n\
         - `docs/STABILITY.md`: what each part promises; `docs/delegate-abi-CHANGELOG.md`: ABI changes.\n\n\
         Check the files with `sha256sum -c SHA256SUMS`. Built reproducibly by `cargo xtask dist` from commit\n\
         {commit}.\n",
        min = abi.abi_min,
        max = abi.abi_max,
        root = abi.root_interface_version,
    )
}

/// The docs a third-party plugin author needs, generated from the sources they document.
pub fn host_docs(root: &Path) -> anyhow::Result<Vec<Entry>> {
    let read = |rel: &str| std::fs::read_to_string(root.join(rel)).with_context(|| format!("reading {rel}"));
    let abi_guide = format!(
        "{}\n\n# The wire level (`delegate_abi::abi`)\n\n{}",
        module_docs(&read("crates/delegate-abi/src/lib.rs")?),
        module_docs(&read("crates/delegate-abi/src/abi.rs")?)
    );
    Ok(vec![
        Entry::file("docs/delegate-abi.md", format!("# delegate-abi\n\n{abi_guide}")),
        Entry::file(
            "docs/plugin-manifest.md",
            format!(
                "# Plugin manifests\n\n{}",
                module_docs(&read("crates/host-runtime/src/plugins/library/manifest.rs")?)
            ),
        ),
        Entry::file("docs/STABILITY.md", read("STABILITY.md")?),
        Entry::file("docs/delegate-abi-CHANGELOG.md", read("crates/delegate-abi/CHANGELOG.md")?),
    ])
}

/// A source file's inner doc comment (`//!` lines) as Markdown.
pub fn module_docs(source: &str) -> String {
    let mut out = String::new();
    for line in source.lines() {
        let Some(rest) = line.trim_start().strip_prefix("//!") else {
            if line.trim().is_empty() || line.trim_start().starts_with("#![") {
                continue;
            }
            break;
        };
        out.push_str(rest.strip_prefix(' ').unwrap_or(rest));
        out.push('\n');
    }
    out.trim_end().to_owned() + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_docs_are_the_inner_doc_comment() {
        let source = "//! Title.\n//!\n//! - item\n#![forbid(unsafe_code)]\n\nuse x;\n//! not docs\n";
        assert_eq!(module_docs(source), "Title.\n\n- item\n");
    }
}
