//! [`LoadError`]: why a library is not a usable plugin, mapped from abi_stable's errors to one line each.

use std::path::{Path, PathBuf};

use abi_stable::library::LibraryError;
use abi_stable::StableAbi;

use crate::abi::{AbiRange, DelegateRootRef, ROOT_INTERFACE_VERSION};
use crate::delegate::ErrorCode;

/// Why a plugin could not be loaded. The message never repeats the path (callers list it beside it);
/// [`LoadError::path`] gives it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The dynamic loader could not open the file (not a shared library, wrong architecture, missing
    /// dependency).
    #[error("not a loadable library: {reason}")]
    NotALibrary {
        /// The file.
        path: PathBuf,
        /// The loader's words.
        reason: String,
    },
    /// The library loads but exports no delegate entry symbol: it is not a delegate plugin.
    #[error("not a delegate plugin: no `{symbol}` entry symbol")]
    NoEntrySymbol {
        /// The file.
        path: PathBuf,
        /// The missing symbol.
        symbol: String,
    },
    /// The plugin was built with an incompatible abi_stable (its header or C ABI self-test differs).
    #[error("plugin was built with an incompatible abi_stable: {detail}")]
    IncompatibleAbiStable {
        /// The file.
        path: PathBuf,
        /// One line.
        detail: String,
    },
    /// The permanent root interface version differs (this never happens between releases of this crate).
    #[error("plugin root interface is {found}, host expects {expected}")]
    RootVersion {
        /// The file.
        path: PathBuf,
        /// Host's.
        expected: String,
        /// Plugin's.
        found: String,
    },
    /// abi_stable's layout check of the root module failed.
    #[error(
        "plugin root module layout is incompatible: plugin built with {found}, host with {expected} ({detail})"
    )]
    LayoutMismatch {
        /// The file.
        path: PathBuf,
        /// `delegate-abi <version>` of the host.
        expected: String,
        /// `<crate> <version>` that defined the plugin's root module.
        found: String,
        /// First line of abi_stable's report.
        detail: String,
    },
    /// The plugin's entry failed or panicked while building its root module.
    #[error("plugin entry failed: {detail}")]
    EntryFailed {
        /// The file, `None` for an embedded plugin.
        path: Option<PathBuf>,
        /// What happened.
        detail: String,
    },
    /// No ABI version in common.
    #[error("plugin speaks ABI {plugin}, host {host}")]
    AbiVersionDisjoint {
        /// The file, `None` for an embedded plugin.
        path: Option<PathBuf>,
        /// What the plugin speaks.
        plugin: AbiRange,
        /// What the host offered.
        host: AbiRange,
    },
    /// The plugin refused the handshake for another reason (e.g. its metadata panicked).
    #[error("plugin refused the handshake: {message}")]
    Refused {
        /// The file, `None` for an embedded plugin.
        path: Option<PathBuf>,
        /// What the plugin speaks.
        plugin: AbiRange,
        /// The plugin's words.
        message: String,
    },
    /// The plugin answered a version outside the host's offer (a plugin bug).
    #[error("plugin chose ABI {chosen}, outside the host's offer {host} (plugin speaks {plugin})")]
    BadAnswer {
        /// The file, `None` for an embedded plugin.
        path: Option<PathBuf>,
        /// What it chose.
        chosen: u32,
        /// What the host offered.
        host: AbiRange,
        /// What the plugin speaks.
        plugin: AbiRange,
    },
    /// The plugin's metadata is unusable (e.g. no backend id).
    #[error("plugin metadata is invalid: {reason}")]
    InvalidInfo {
        /// The file, `None` for an embedded plugin.
        path: Option<PathBuf>,
        /// What is wrong.
        reason: String,
    },
}

impl LoadError {
    /// The file that failed, `None` for an embedded plugin.
    pub fn path(&self) -> Option<&Path> {
        match self {
            LoadError::NotALibrary { path, .. }
            | LoadError::NoEntrySymbol { path, .. }
            | LoadError::IncompatibleAbiStable { path, .. }
            | LoadError::RootVersion { path, .. }
            | LoadError::LayoutMismatch { path, .. } => Some(path),
            LoadError::EntryFailed { path, .. }
            | LoadError::AbiVersionDisjoint { path, .. }
            | LoadError::Refused { path, .. }
            | LoadError::BadAnswer { path, .. }
            | LoadError::InvalidInfo { path, .. } => path.as_deref(),
        }
    }
}

impl et_error::HasErrorCode for LoadError {
    fn error_code(&self) -> ErrorCode {
        match self {
            LoadError::NotALibrary { .. } => ErrorCode::AccessFailed,
            LoadError::NoEntrySymbol { .. } | LoadError::InvalidInfo { .. } => ErrorCode::InvalidProgram,
            LoadError::EntryFailed { .. } => ErrorCode::Internal,
            LoadError::IncompatibleAbiStable { .. }
            | LoadError::RootVersion { .. }
            | LoadError::LayoutMismatch { .. }
            | LoadError::AbiVersionDisjoint { .. }
            | LoadError::Refused { .. }
            | LoadError::BadAnswer { .. } => ErrorCode::NotSupported,
        }
    }
}

/// First non-empty line of a (possibly huge, multi-line) report, trimmed to 200 characters.
fn one_line(text: &str) -> String {
    let line = text.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("no details");
    let mut out: String = line.chars().take(200).collect();
    if line.chars().count() > 200 {
        out.push('…');
    }
    out
}

/// `<crate> <version>` that defined the root module's layout. `DelegateRootRef` is abi_stable's `PrefixRef`,
/// so look through it to the prefix struct it points to (defined by `delegate-abi`).
pub(super) fn defining_crate(layout: &'static abi_stable::type_layout::TypeLayout) -> String {
    let mut layout = layout;
    if layout.package().as_str() == "abi_stable" {
        if let Some(pointee) = layout.shared_vars().type_layouts().first() {
            layout = pointee();
        }
    }
    let (package, version) = layout.package_and_version();
    format!("{} {}", package, version.version)
}

fn host_abi_crate() -> String {
    defining_crate(<DelegateRootRef as StableAbi>::LAYOUT)
}

pub(super) fn map_library_error(path: &Path, err: LibraryError, plugin_layout: Option<String>) -> LoadError {
    let path = path.to_path_buf();
    match err {
        LibraryError::OpenError { err, .. } => {
            // The loader's message usually starts with the path; callers print the path already.
            let text = err.to_string();
            let prefix = format!("{}: ", path.display());
            let reason = one_line(text.strip_prefix(&prefix).unwrap_or(&text));
            LoadError::NotALibrary { path, reason }
        }
        LibraryError::GetSymbolError { symbol, .. } => {
            let symbol = String::from_utf8_lossy(&symbol).trim_end_matches('\0').to_string();
            LoadError::NoEntrySymbol { path, symbol }
        }
        LibraryError::IncompatibleVersionNumber { expected_version, actual_version, .. } => {
            LoadError::RootVersion {
                path,
                expected: expected_version.to_string(),
                found: actual_version.to_string(),
            }
        }
        LibraryError::ParseVersionError(e) => LoadError::RootVersion {
            path,
            expected: ROOT_INTERFACE_VERSION.into(),
            found: one_line(&e.to_string()),
        },
        LibraryError::AbiInstability(report) => LoadError::LayoutMismatch {
            path,
            expected: host_abi_crate(),
            found: plugin_layout.unwrap_or_else(|| "an unknown crate version".into()),
            detail: summarize_layout_report(&report.to_string()),
        },
        LibraryError::InvalidAbiHeader(header) => LoadError::IncompatibleAbiStable {
            path,
            detail: format!(
                "plugin's abi_stable header is {header:?}, host's {:?}",
                abi_stable::library::AbiHeader::VALUE
            ),
        },
        LibraryError::InvalidCAbi { expected, found } => LoadError::IncompatibleAbiStable {
            path,
            detail: format!(
                "C ABI self-test expected {}, found {}",
                one_line(&expected.to_string()),
                one_line(&found.to_string())
            ),
        },
        LibraryError::RootModule { err, .. } => {
            LoadError::EntryFailed { path: Some(path), detail: one_line(&err.to_string()) }
        }
        LibraryError::Many(errors) => match errors.into_iter().next() {
            Some(first) => map_library_error(&path, first, plugin_layout),
            None => LoadError::EntryFailed { path: Some(path), detail: "unknown abi_stable error".into() },
        },
    }
}

/// abi_stable's layout report is hundreds of lines; keep the line that names the first difference, with the
/// expected and found types when abi_stable lists them (`Error:<what>`, then `Expected:` and `Found:`, each
/// followed by a line with the type).
fn summarize_layout_report(report: &str) -> String {
    let lines: Vec<&str> = report.lines().map(str::trim).collect();
    let first = |pred: &dyn Fn(&str) -> bool| lines.iter().position(|l| pred(&l.to_ascii_lowercase()));
    let at = first(&|l| l.starts_with("error"))
        .or_else(|| first(&|l| l.contains("mismatch") || l.contains("expected") || l.contains("too many")));
    let Some(at) = at else { return one_line(report) };
    match lines.get(at + 1..at + 5) {
        Some(&["Expected:", expected, "Found:", found]) => {
            one_line(&format!("{}: expected {expected}, found {found}", lines[at]))
        }
        _ => one_line(lines[at]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use abi_stable::sabi_types::VersionNumber;
    use abi_stable::std_types::RBoxError;

    #[test]
    fn root_version_mismatch_names_both_versions_in_one_line() {
        let err = LibraryError::IncompatibleVersionNumber {
            library_name: "delegate_plugin",
            expected_version: VersionNumber { major: 1, minor: 0, patch: 0 },
            actual_version: VersionNumber { major: 2, minor: 1, patch: 0 },
        };
        let err = map_library_error(Path::new("/p/libx.so"), err, None);
        assert_eq!(err.to_string(), "plugin root interface is 2.1.0, host expects 1.0.0");
        assert_eq!(err.path(), Some(Path::new("/p/libx.so")));
    }

    #[test]
    fn a_layout_report_is_summarised_in_one_line_with_both_crate_versions() {
        let report = "\n\nSome layout error\n\n  Error:Mismatched fields\n    expected: 9 fields\n    found: 8 fields\n";
        let err = LibraryError::AbiInstability(RBoxError::from_fmt(&report));
        let err = map_library_error(Path::new("/p/libx.so"), err, Some("delegate-abi 0.2.0".into()));
        let text = err.to_string();
        assert_eq!(
            text,
            format!(
                "plugin root module layout is incompatible: plugin built with delegate-abi 0.2.0, host with \
                 delegate-abi {} (Error:Mismatched fields)",
                env!("CARGO_PKG_VERSION")
            )
        );
        assert!(!text.contains('\n'));
    }

    #[test]
    fn a_layout_report_names_the_expected_and_found_types_when_abi_stable_lists_them() {
        // The shape of abi_stable 0.11's report for a plugin built before `TensorArg`'s codes became
        // integer newtypes (abridged: the real one is 1800 lines).
        let report = "\nCompared <this>:\n    --- Type Layout ---\nLayout of expected type:\n    type:DelegateRoot\n\n\
                      1 error(s)inside:\n    <other>\n\n\nError:mismatched type\nExpected:\n    RawMemoryKind\n\
                      Found:\n    MemoryKind\n1 error(s)inside:\n";
        assert_eq!(
            summarize_layout_report(report),
            "Error:mismatched type: expected RawMemoryKind, found MemoryKind"
        );
    }

    #[test]
    fn the_host_layout_is_attributed_to_this_crate() {
        assert_eq!(host_abi_crate(), format!("delegate-abi {}", env!("CARGO_PKG_VERSION")));
    }

    #[test]
    fn one_line_keeps_the_first_non_empty_line_and_caps_its_length() {
        assert_eq!(one_line("\n  first  \nsecond"), "first");
        assert_eq!(one_line(""), "no details");
        assert_eq!(one_line(&"x".repeat(300)).chars().count(), 201);
    }
}
