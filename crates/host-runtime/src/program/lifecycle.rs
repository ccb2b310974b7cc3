//! The cache lifecycle beyond [`Program::reset`]: [`Program::rewind`] to an earlier position, and
//! [`Program::save_cache`] / [`Program::restore_cache`], the caches up to a position in a safetensors file.
//!
//! ## The cache file (format version 1)
//!
//! A [safetensors](https://huggingface.co/docs/safetensors) file: an 8-byte little-endian header length, a
//! JSON header, then the tensors' bytes. One tensor per program buffer, named as the buffer, of its dtype;
//! where the buffer has a sequence axis (exactly one dimension equal to `[generate].max_positions`), only the
//! first `position` rows along it are stored (the tensor's shape has `position` there); otherwise the whole
//! buffer. The header's `__metadata__` (strings, as the format requires):
//! - `format`: `"kv-delegate-cache"`; `format_version`: `"1"`;
//! - `position`: the number of positions the caches hold (decimal);
//! - `tokens`: a JSON array of the tokens fed at positions `0..position` (empty when the caller gave none);
//! - `buffers`: a JSON object, per buffer `{"dtype": "f32", "shape": [full shape], "sequence_axis": 1 | null}`;
//! - `blobs`: a JSON object, per call `"METHOD/INDEX"` the SHA-256 (lowercase hex) of its blob's bytes: the
//!   program's identity.
//!
//! Restoring refuses, in one line naming the difference, a file of another format or version, of other
//! buffers (names, dtypes, shapes, sequence axes) or other blobs, holding a tensor that is no buffer of the
//! program, or a position past the caches.
//!
//! The program's identity is the SHA-256 of each call's blob, taken once at load from the very bytes the call
//! was initialised with, so saving and restoring read no blob, and a blob file replaced after load changes
//! nothing.
//!
//! ## Saving and restoring safely
//!
//! A save never writes into the file at its path ([`replace`]): it writes a temporary file beside it, flushes
//! it to disk and renames it over the path, so the previous file stays whole until the new one is (a save
//! that fails part-way leaves it, and no temporary file), and of two saves at once one whole file remains.
//! The path must be absent or a regular file: a symbolic link (dangling or not: its target is never created)
//! and a FIFO or other non-regular file are refused without being opened. The tensors are streamed from the
//! caches to the file: a save makes no copy of host-visible caches (a device cache is copied to the host one
//! buffer at a time).
//!
//! A restore opens the file once, non-blocking, refuses anything but a regular file ([`read`]) and refuses
//! unread a file larger than this program's cache file can be: the 8-byte length, a header of at most the
//! program's bound (its buffers' and blobs' metadata at full size, 21 bytes for each token up to
//! `[generate].max_positions`, or 2^20 tokens without it (a save records no more), 64 KiB for metadata added
//! later) and every buffer's full size. A header length past its bound is refused before the header is
//! parsed, so a hostile header costs memory in proportion to the program, not to the file. The whole file is
//! checked before any buffer is written, and memory is allocated fallibly (an allocation refused is
//! `MemoryAllocationFailed`, naming the size); a buffer write that fails part-way (a CUDA copy) marks torn
//! the buffers written so far and the one that failed (see [`Program`]'s docs), so mixed caches are never
//! decoded.

mod format;
mod read;
mod replace;
#[cfg(test)]
mod tests;

use std::io::Write;
use std::path::Path;

use program_manifest::TensorDecl;

use super::{Error, Program};
use crate::buffer::Storage;
use crate::cuda;
use replace::Replacement;

/// The version of the cache file format [`Program::save_cache`] writes and [`Program::restore_cache`] reads.
pub const CACHE_FORMAT_VERSION: u32 = 1;

/// What a restored cache file held besides the caches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedCache {
    /// The positions the caches hold: decoding continues at this position.
    pub position: u64,
    /// The tokens fed at positions `0..position`, when the file records them (empty otherwise).
    pub tokens: Vec<i64>,
}

/// Why a cache file could not be written, read or restored.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CacheFileProblem {
    /// The file cannot be written or read, or its path holds a symbolic link, a FIFO or anything else than a
    /// regular file (`AccessFailed`).
    #[error("cannot be {action}: {source}")]
    Io {
        /// `"written"` or `"read"`.
        action: &'static str,
        /// What the system said, or what is at the path.
        source: std::io::Error,
    },
    /// The file is larger than a cache file of this program can be, refused before it is read
    /// (`InvalidArgument`).
    #[error("is {bytes} bytes, more than the {most} bytes a cache file of this program can be (its buffers' full sizes and the largest header it can have)")]
    TooLarge {
        /// The file's size.
        bytes: u64,
        /// The most a cache file of this program holds.
        most: u64,
    },
    /// The file's header length is larger than a header of this program's cache file can be, refused before
    /// the header is parsed (`InvalidArgument`).
    #[error("is not a cache file of this program: its header is {bytes} bytes, more than the {most} bytes this program's header can be")]
    HeaderTooLarge {
        /// The header length the file states.
        bytes: u64,
        /// The most a header of this program's cache file holds.
        most: u64,
    },
    /// Memory for the file or a buffer's restored bytes could not be allocated (`MemoryAllocationFailed`).
    #[error("cannot allocate {bytes} bytes {what}")]
    Memory {
        /// The size asked for.
        bytes: u64,
        /// What for: `to read the file`, `to restore buffer 'k_cache_0'`.
        what: String,
    },
    /// The file is not a cache file of this format version (`InvalidArgument`).
    #[error("is not a cache file this host reads: {0}")]
    Format(String),
    /// The file was saved from another program: other buffers, other blobs or a tensor that is no buffer of
    /// the program (`InvalidArgument`).
    #[error("was saved from another program: {0}")]
    OtherProgram(String),
    /// The position does not fit the caches, or the tokens do not match it (`InvalidArgument`).
    #[error("{0}")]
    Position(String),
}

impl CacheFileProblem {
    pub(super) fn error_code(&self) -> et_error::ErrorCode {
        match self {
            CacheFileProblem::Io { .. } => et_error::ErrorCode::AccessFailed,
            CacheFileProblem::Memory { .. } => et_error::ErrorCode::MemoryAllocationFailed,
            _ => et_error::ErrorCode::InvalidArgument,
        }
    }
}

/// The error of the cache file at `path`.
fn cache_file_error(path: &Path, problem: CacheFileProblem) -> Error {
    Error::CacheFile { path: path.into(), problem: Box::new(problem) }
}

/// The one axis of `decl` as long as the caches' positions, or `None` when there is none or several (the
/// whole buffer is saved then).
pub(super) fn sequence_axis(decl: &TensorDecl, max_positions: Option<u64>) -> Option<usize> {
    let max = max_positions?;
    let mut axes = decl.shape.iter().enumerate().filter(|&(_, &d)| d == max).map(|(axis, _)| axis);
    let axis = axes.next()?;
    axes.next().is_none().then_some(axis)
}

impl Program {
    /// The positions the caches hold, when the program's `[generate]` says.
    pub(super) fn max_positions(&self) -> Option<u64> {
        self.manifest.generate.as_ref().and_then(|g| g.max_positions)
    }

    /// Refuses `position` past the caches.
    fn check_position(&self, position: u64) -> Result<(), String> {
        match self.max_positions() {
            Some(max) if position > max => {
                Err(format!("position {position} is past the caches, which hold {max} positions"))
            }
            _ => Ok(()),
        }
    }

    /// Continues from `position`: the caches keep positions `0..position` and the next token is decoded at
    /// `position` (for a token generator, its decode method's position input is set to it). Waits for queued
    /// work first. A torn program stays torn: a failed run may have written any row, so only
    /// [`Program::reset`] (start over from position 0) or [`Program::restore_cache`] (rows from a file) end
    /// it.
    ///
    /// Nothing is copied and nothing need be: as for [`Program::reset`], a causal decoder writes each cache
    /// row before it reads it and masks the rows past the position, so whatever later steps left there is never read. The caller's part: `position` is at most the
    /// position the caches were filled to (a failed run does not advance it), and the next token fed is the
    /// one at `position` ([`crate::generate::continue_from`] feeds it).
    ///
    /// # Errors
    /// [`Error::Usage`] for a position past the caches; [`Error::Stream`] when waiting or writing the
    /// position input fails.
    pub fn rewind(&mut self, position: u64) -> Result<(), Error> {
        self.check_sequence_reuse(super::fork::Reuse::Rewind(position))?;
        self.check_position(position).map_err(Error::Usage)?;
        self.synchronize()?;
        if let Some(g) = self.manifest.generate.clone() {
            let position =
                i64::try_from(position).map_err(|_| Error::Usage(format!("position {position}")))?;
            self.write_input(&g.decode, &g.position_input, &position.to_le_bytes())?;
        }
        self.position = Some(position);
        Ok(())
    }

    /// Saves the caches' first `position` positions (whole buffers where no sequence axis is known) to
    /// `path`, with `tokens` (the tokens fed at positions `0..position`, or none) and the program's identity
    /// (see the module docs for the format). Waits for queued work (the host reads the caches), copying
    /// device memory to the host.
    ///
    /// The file at `path` is replaced whole, never written in place: a save that fails leaves the previous
    /// file as it was. `path` must be absent or a regular file; a symbolic link, a FIFO or anything else is
    /// refused, never followed or opened (see the module docs).
    ///
    /// # Errors
    /// [`Error::NotRewindable`] when a call's instance keeps sequence state of its own (the file could not
    /// hold it); [`Error::CacheFile`] when the position does not fit, the tokens do not match it, something
    /// other than a regular file is at `path`, or the file cannot be written; [`Error::BufferAccess`] when
    /// reading a cache fails.
    pub fn save_cache(&self, path: &Path, position: u64, tokens: &[i64]) -> Result<(), Error> {
        self.check_sequence_reuse(super::fork::Reuse::Save(path))?;
        let fail = |problem| cache_file_error(path, problem);
        let io = |source| fail(CacheFileProblem::Io { action: "written", source });
        self.check_position(position).map_err(|why| fail(CacheFileProblem::Position(why)))?;
        self.check_tokens(position, tokens).map_err(fail)?;
        let header = self.cache_header(position, tokens).map_err(fail)?;
        let mut file = Replacement::begin(path).map_err(io)?;
        self.synchronize()?;
        file.writer().write_all(&header.bytes).map_err(io)?;
        self.write_tensors(file.writer(), &header.order, position, path)?;
        file.commit().map_err(io)
    }

    /// Restores caches [`Program::save_cache`] saved from this program (the same buffers and blobs): their
    /// saved positions are written, the rest of each buffer zeroed; clears the torn mark. Returns the
    /// position and tokens the file holds: decoding continues at that position. Waits for queued work first;
    /// device caches are written by a synchronous host-to-device copy (the restore's one host
    /// synchronisation per device cache; the file is read on the host anyway).
    ///
    /// The file is opened once, non-blocking, and read only when it is a regular file no larger than this
    /// program's cache file can be; it is checked whole before any buffer is written (see the module docs).
    ///
    /// # Errors
    /// [`Error::CacheFile`] naming what differs when the file is not a cache file of this format, was saved
    /// from another program (other buffers, dtypes, shapes, sequence axes, blobs, or a tensor that is no
    /// buffer of the program), holds a position past the caches, is larger than the program allows, cannot
    /// be read or is not a regular file, or its bytes cannot be allocated; [`Error::BufferAccess`] when
    /// writing a cache fails (the buffers written so far and that one are torn then).
    pub fn restore_cache(&mut self, path: &Path) -> Result<SavedCache, Error> {
        self.check_sequence_reuse(super::fork::Reuse::Restore(path))?;
        self.restore_cache_with(path, Storage::write)
    }

    /// [`Program::restore_cache`], each buffer written with `write` ([`Storage::write`]; a test's failing
    /// writer).
    fn restore_cache_with(
        &mut self,
        path: &Path,
        write: impl FnMut(&mut Storage, &[u8]) -> Result<(), cuda::Error>,
    ) -> Result<SavedCache, Error> {
        let fail = |problem| cache_file_error(path, problem);
        let bounds = self.cache_file_bounds().map_err(fail)?;
        let bytes = read::read_at_most(path, bounds.file).map_err(fail)?;
        let (saved, tensors) = self.check_cache_file(&bytes, bounds).map_err(fail)?;
        self.synchronize()?;
        self.write_restored(path, saved.position, &tensors, write)?;
        self.torn = None;
        self.position = Some(saved.position);
        Ok(saved)
    }

    /// Writes each buffer's restored bytes (`tensors`, checked, in the program's buffer order) with `write`:
    /// the saved rows, the rest zeroed. A write that fails marks torn the buffers written so far and the one
    /// that failed, naming the restore of `path`.
    fn write_restored(
        &mut self,
        path: &Path,
        position: u64,
        tensors: &[&[u8]],
        mut write: impl FnMut(&mut Storage, &[u8]) -> Result<(), cuda::Error>,
    ) -> Result<(), Error> {
        let axes = self.sequence_axes();
        let mut staged = self.restore_staging(&axes).map_err(|problem| cache_file_error(path, problem))?;
        for (b, saved) in tensors.iter().enumerate() {
            let bytes = match axes[b] {
                Some(axis) => {
                    staged.clear();
                    staged.resize(self.buffers[b].storage.len(), 0);
                    format::Rows::of(&self.buffers[b].decl, axis).place(
                        &mut staged,
                        saved,
                        position as usize,
                    );
                    &staged[..]
                }
                None => saved,
            };
            if let Err(source) = write(&mut self.buffers[b].storage, bytes) {
                let buffer = self.buffers[b].decl.name.clone();
                self.tear_buffers(0..=b, format!("the restore of cache file {}", path.display()));
                return Err(Error::BufferAccess { buffer, action: "writing", source });
            }
        }
        Ok(())
    }

    /// Memory for the largest buffer with a sequence axis (whose saved rows are placed in zeros before it is
    /// written), allocated fallibly, before any buffer is written.
    fn restore_staging(&self, axes: &[Option<usize>]) -> Result<Vec<u8>, CacheFileProblem> {
        let largest = self
            .buffers
            .iter()
            .zip(axes)
            .filter(|(_, axis)| axis.is_some())
            .max_by_key(|(b, _)| b.storage.len());
        let mut staged = Vec::new();
        if let Some((buffer, _)) = largest {
            let bytes = buffer.storage.len();
            staged.try_reserve_exact(bytes).map_err(|_| CacheFileProblem::Memory {
                bytes: bytes as u64,
                what: format!("to restore buffer '{}'", buffer.decl.name),
            })?;
        }
        Ok(staged)
    }
}
