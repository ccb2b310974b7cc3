//! A `.pte` read once into memory the bridge owns: the bytes the pre-flight checks read are the bytes
//! ExecuTorch loads.
//!
//! The file is opened once through the host's helper ([`host_runtime::blob_file::BlobFile`]): non-blocking, so
//! a FIFO in the program's place cannot block the open, and refused from the open descriptor unless it is a
//! regular file, so a device (`/dev/zero`) is never read; the allocation is fallible, so a file larger than
//! memory is an error naming its size. [`crate::runner::Module`] then hands ExecuTorch those bytes through its
//! `BufferDataLoader`: ExecuTorch never opens the path, so a file swapped in after the checks (or rewritten,
//! or truncated) cannot reach it, and nothing it loads was not checked.
//!
//! Why not a memory map, as ExecuTorch's own `MmapDataLoader`: a mapping of a file someone else can write shows
//! their later writes (a private mapping too, for every page not yet copied), so the bytes ExecuTorch runs
//! could differ from the bytes checked, and a truncation raises SIGBUS on the next read. The price is one read
//! of the file into memory and its bytes resident while the Module lives (delegate payloads are lent from
//! them, uncopied); no other copy of the program is made.

use std::path::Path;

use host_runtime::blob_file::BlobFile;

use crate::BridgeError;

/// A `.pte` file's bytes as they were when read, and the path they were read from (for messages only).
pub struct ProgramFile {
    path: String,
    file: BlobFile,
}

impl std::fmt::Debug for ProgramFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProgramFile").field("path", &self.path).field("len", &self.bytes().len()).finish()
    }
}

impl ProgramFile {
    /// Reads the program at `path`, opened once (see the module docs).
    ///
    /// # Errors
    /// [`BridgeError::Io`] (`AccessFailed`) naming the path: it cannot be opened, it is not a regular file
    /// (`not a regular file (it is a FIFO)`), it is larger than the memory that can be allocated, or the read
    /// failed.
    pub fn read(path: &Path) -> Result<ProgramFile, BridgeError> {
        let display = path.display().to_string();
        match BlobFile::open(path) {
            Ok(file) => Ok(ProgramFile { path: display, file }),
            Err(source) => Err(BridgeError::Io { path: display, source }),
        }
    }

    /// The path the bytes were read from, as messages show it.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The program's bytes.
    pub fn bytes(&self) -> &[u8] {
        self.file.bytes()
    }
}
