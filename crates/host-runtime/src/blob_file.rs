//! Blob files mapped into memory, so a multi-GiB engine is neither read nor copied to be parsed.
#![allow(unsafe_code)]

use std::fs::File;
use std::path::Path;

use memmap2::Mmap;

/// A blob file's bytes, mapped read-only.
pub struct BlobFile {
    map: Option<Mmap>,
}

impl BlobFile {
    /// Maps `path`. An empty file maps to no bytes.
    pub fn open(path: &Path) -> std::io::Result<BlobFile> {
        let file = File::open(path)?;
        if file.metadata()?.len() == 0 {
            return Ok(BlobFile { map: None });
        }
        // SAFETY: the mapping is read-only and private to this process; memmap2's contract is that the file
        // must not be modified while mapped. Blob files are build artefacts that nothing writes while the host
        // runs; a concurrent writer would at worst make the parsers see garbage, which they reject (they are
        // fuzzed against arbitrary bytes), not memory outside the mapping.
        let map = unsafe { Mmap::map(&file)? };
        Ok(BlobFile { map: Some(map) })
    }

    /// The mapped bytes.
    pub fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
}
