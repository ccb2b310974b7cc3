//! Where a program came from, decided once when its file is opened: an ExecuTorch `.pte` or a program manifest.

use std::path::Path;

/// Where a loaded [`super::Program`] came from ([`super::Program::origin`]), so that no caller sniffs the
/// file again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Origin {
    /// A program manifest (`program.toml`), or a manifest built in memory ([`super::Program::load`]).
    #[default]
    Manifest,
    /// An ExecuTorch `.pte` program ([`crate::pte::load`]): a token generator only when given a prompt.
    Pte,
}

impl Origin {
    /// What the file at `path` holds: a `.pte` when it has `ET12` at byte 4 ([`crate::pte::is_pte`]), or, when
    /// it cannot be read, when its extension is `.pte` (the loader then names the problem); a manifest
    /// otherwise. One non-blocking open, checked through its descriptor: a FIFO or device is never read.
    pub fn of_file(path: &Path) -> Origin {
        match crate::blob_file::read_prefix(path, 8) {
            Ok(head) if crate::pte::is_pte(&head) => Origin::Pte,
            _ if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("pte")) => Origin::Pte,
            _ => Origin::Manifest,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_a_pte_by_its_magic_or_unreadable_by_its_extension() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let pte = dir.path().join("model.bin");
        std::fs::write(&pte, b"\0\0\0\0ET12rest").expect("write");
        assert_eq!(Origin::of_file(&pte), Origin::Pte, "the magic, whatever the name");
        let toml = dir.path().join("program.pte.toml");
        std::fs::write(&toml, b"[methods]\n").expect("write");
        assert_eq!(Origin::of_file(&toml), Origin::Manifest);
        assert_eq!(
            Origin::of_file(&dir.path().join("missing.PTE")),
            Origin::Pte,
            "unreadable: the extension"
        );
        assert_eq!(Origin::of_file(&dir.path().join("missing.toml")), Origin::Manifest);
    }
}
