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
//! buffers (names, dtypes, shapes, sequence axes) or other blobs, or a position past the caches.
//!
//! The program's identity is the SHA-256 of each call's blob, taken once at load from the very bytes the call
//! was initialised with, so saving and restoring read no blob, and a blob file replaced after load changes
//! nothing.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use blob_format::model::DType;
use program_manifest::TensorDecl;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

use super::{Error, Program};

/// The version of the cache file format [`Program::save_cache`] writes and [`Program::restore_cache`] reads.
pub const CACHE_FORMAT_VERSION: u32 = 1;

/// The `format` value of a cache file's metadata.
const FORMAT: &str = "kv-delegate-cache";

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
    /// The file cannot be written or read (`AccessFailed`).
    #[error("cannot be {action}: {source}")]
    Io {
        /// `"written"` or `"read"`.
        action: &'static str,
        /// What the system said.
        source: std::io::Error,
    },
    /// The file is not a cache file of this format version (`InvalidArgument`).
    #[error("is not a cache file this host reads: {0}")]
    Format(String),
    /// The file was saved from another program: other buffers or other blobs (`InvalidArgument`).
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
            _ => et_error::ErrorCode::InvalidArgument,
        }
    }
}

/// One buffer as the file describes it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct BufferMeta {
    dtype: String,
    shape: Vec<u64>,
    sequence_axis: Option<usize>,
}

/// A buffer's rows along its sequence axis: `outer` blocks of `rows` rows of `row_bytes` bytes.
#[derive(Debug, Clone, Copy)]
struct Rows {
    outer: usize,
    rows: usize,
    row_bytes: usize,
}

impl Rows {
    fn of(decl: &TensorDecl, axis: usize) -> Rows {
        let dims: Vec<usize> = decl.shape.iter().map(|&d| d as usize).collect();
        let outer = dims[..axis].iter().product();
        let row_bytes = dims[axis + 1..].iter().product::<usize>() * decl.dtype.size_bytes();
        Rows { outer, rows: dims[axis], row_bytes }
    }

    /// The first `position` rows of each block of `full`.
    fn prefix(self, full: &[u8], position: usize) -> Vec<u8> {
        let block = self.rows * self.row_bytes;
        let take = position * self.row_bytes;
        (0..self.outer).flat_map(|o| &full[o * block..o * block + take]).copied().collect()
    }

    /// Writes `prefix` (as [`Rows::prefix`] made it) over the first `position` rows of each block of `full`.
    fn place(self, full: &mut [u8], prefix: &[u8], position: usize) {
        let block = self.rows * self.row_bytes;
        let take = position * self.row_bytes;
        for o in 0..self.outer {
            full[o * block..o * block + take].copy_from_slice(&prefix[o * take..(o + 1) * take]);
        }
    }
}

/// The one axis of `decl` as long as the caches' positions, or `None` when there is none or several (the
/// whole buffer is saved then).
pub(super) fn sequence_axis(decl: &TensorDecl, max_positions: Option<u64>) -> Option<usize> {
    let max = max_positions?;
    let mut axes = decl.shape.iter().enumerate().filter(|&(_, &d)| d == max).map(|(axis, _)| axis);
    let axis = axes.next()?;
    axes.next().is_none().then_some(axis)
}

/// A dtype's safetensors name; `None` for one a later blob-format adds that safetensors has no name for.
fn safetensors_dtype(dtype: DType) -> Option<Dtype> {
    Some(match dtype {
        DType::F32 => Dtype::F32,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::F64 => Dtype::F64,
        DType::I8 => Dtype::I8,
        DType::U8 => Dtype::U8,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
        DType::Bool => Dtype::BOOL,
        _ => return None,
    })
}

/// A buffer's safetensors dtype, or the problem naming it.
fn buffer_dtype(decl: &TensorDecl) -> Result<Dtype, CacheFileProblem> {
    safetensors_dtype(decl.dtype).ok_or_else(|| {
        CacheFileProblem::Format(format!(
            "buffer '{}' is {}, which safetensors has no name for",
            decl.name, decl.dtype
        ))
    })
}

impl Program {
    /// The positions the caches hold, when the program's `[generate]` says.
    pub(super) fn max_positions(&self) -> Option<u64> {
        self.manifest.generate.as_ref().and_then(|g| g.max_positions)
    }

    /// The program's identity: per call (`"METHOD/INDEX"`), the SHA-256 of its blob's bytes.
    fn blob_identity(&self) -> &BTreeMap<String, String> {
        &self.blob_identity
    }

    /// Each buffer as a cache file describes it.
    fn buffer_metas(&self) -> BTreeMap<String, BufferMeta> {
        let max = self.max_positions();
        self.buffers
            .iter()
            .map(|b| {
                let meta = BufferMeta {
                    dtype: b.decl.dtype.name().to_owned(),
                    shape: b.decl.shape.clone(),
                    sequence_axis: sequence_axis(&b.decl, max),
                };
                (b.decl.name.clone(), meta)
            })
            .collect()
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
    /// # Errors
    /// [`Error::CacheFile`] when the position does not fit, the tokens do not match it, or the file cannot be
    /// written; [`Error::BufferAccess`] when reading a cache fails.
    pub fn save_cache(&self, path: &Path, position: u64, tokens: &[i64]) -> Result<(), Error> {
        let fail = |problem| Error::CacheFile { path: path.into(), problem: Box::new(problem) };
        self.check_position(position).map_err(|why| fail(CacheFileProblem::Position(why)))?;
        if !tokens.is_empty() && tokens.len() as u64 != position {
            let why = format!("{} tokens were given for position {position}", tokens.len());
            return Err(fail(CacheFileProblem::Position(why)));
        }
        let metas = self.buffer_metas();
        let metadata = HashMap::from([
            ("format".to_owned(), FORMAT.to_owned()),
            ("format_version".to_owned(), CACHE_FORMAT_VERSION.to_string()),
            ("position".to_owned(), position.to_string()),
            ("tokens".to_owned(), serde_json::to_string(tokens).expect("integers serialise")),
            ("buffers".to_owned(), serde_json::to_string(&metas).expect("plain data serialises")),
            ("blobs".to_owned(), serde_json::to_string(self.blob_identity()).expect("strings serialise")),
        ]);
        self.synchronize()?;
        let mut data = Vec::with_capacity(self.buffers.len());
        for buffer in &self.buffers {
            let full = buffer.storage.read().map_err(|source| Error::BufferAccess {
                buffer: buffer.decl.name.clone(),
                action: "reading",
                source,
            })?;
            let mut shape: Vec<usize> = buffer.decl.shape.iter().map(|&d| d as usize).collect();
            let bytes = match metas[&buffer.decl.name].sequence_axis {
                Some(axis) => {
                    shape[axis] = position as usize;
                    Cow::Owned(Rows::of(&buffer.decl, axis).prefix(&full, position as usize))
                }
                None => full,
            };
            let dtype = buffer_dtype(&buffer.decl).map_err(fail)?;
            data.push((buffer.decl.name.clone(), dtype, shape, bytes));
        }
        let views = data.iter().map(|(name, dtype, shape, bytes)| {
            let view = TensorView::new(*dtype, shape.clone(), bytes).expect("the shape is the bytes' own");
            (name.as_str(), view)
        });
        let file = safetensors::serialize(views, Some(metadata))
            .map_err(|err| fail(CacheFileProblem::Format(err.to_string())))?;
        std::fs::write(path, file).map_err(|source| fail(CacheFileProblem::Io { action: "written", source }))
    }

    /// Restores caches [`Program::save_cache`] saved from this program (the same buffers and blobs): their
    /// saved positions are written, the rest of each buffer zeroed; clears the torn mark. Returns the
    /// position and tokens the file holds: decoding continues at that position. Waits for queued work first;
    /// device caches are written by a synchronous host-to-device copy (the restore's one host
    /// synchronisation per device cache; the file is read on the host anyway).
    ///
    /// # Errors
    /// [`Error::CacheFile`] naming what differs when the file is not a cache file of this format, was saved
    /// from another program (other buffers, dtypes, shapes or blobs) or holds a position past the caches, or
    /// cannot be read; [`Error::BufferAccess`] when writing a cache fails.
    pub fn restore_cache(&mut self, path: &Path) -> Result<SavedCache, Error> {
        let fail = |problem| Error::CacheFile { path: path.into(), problem: Box::new(problem) };
        let bytes =
            std::fs::read(path).map_err(|source| fail(CacheFileProblem::Io { action: "read", source }))?;
        let (saved, tensors) = self.check_cache_file(&bytes).map_err(fail)?;
        self.synchronize()?;
        for (buffer, prefix) in self.buffers.iter_mut().zip(tensors) {
            let mut full = vec![0u8; buffer.storage.len()];
            match sequence_axis(&buffer.decl, self.manifest.generate.as_ref().and_then(|g| g.max_positions)) {
                Some(axis) => Rows::of(&buffer.decl, axis).place(&mut full, prefix, saved.position as usize),
                None => full.copy_from_slice(prefix),
            }
            buffer.storage.write(&full).map_err(|source| Error::BufferAccess {
                buffer: buffer.decl.name.clone(),
                action: "writing",
                source,
            })?;
        }
        self.torn = None;
        self.position = Some(saved.position);
        Ok(saved)
    }

    /// Checks a cache file against this program; returns what it holds and each buffer's saved bytes, in the
    /// program's buffer order.
    fn check_cache_file<'b>(&self, bytes: &'b [u8]) -> Result<(SavedCache, Vec<&'b [u8]>), CacheFileProblem> {
        let format = |why: String| CacheFileProblem::Format(why);
        let tensors = SafeTensors::deserialize(bytes).map_err(|err| format(err.to_string()))?;
        let (_, header) = SafeTensors::read_metadata(bytes).map_err(|err| format(err.to_string()))?;
        let meta = header.metadata().clone().unwrap_or_default();
        let field = |key: &str| meta.get(key).ok_or_else(|| format(format!("its metadata has no '{key}'")));
        if field("format")? != FORMAT || field("format_version")? != &CACHE_FORMAT_VERSION.to_string() {
            return Err(format(format!(
                "format '{}' version {}, where this host reads '{FORMAT}' version {CACHE_FORMAT_VERSION}",
                field("format")?,
                field("format_version")?
            )));
        }
        let position: u64 =
            field("position")?.parse().map_err(|_| format("its position is no integer".into()))?;
        let tokens: Vec<i64> =
            serde_json::from_str(field("tokens")?).map_err(|e| format(format!("tokens: {e}")))?;
        let buffers: BTreeMap<String, BufferMeta> =
            serde_json::from_str(field("buffers")?).map_err(|e| format(format!("buffers: {e}")))?;
        let blobs: BTreeMap<String, String> =
            serde_json::from_str(field("blobs")?).map_err(|e| format(format!("blobs: {e}")))?;
        compare_buffers(&buffers, &self.buffer_metas()).map_err(CacheFileProblem::OtherProgram)?;
        compare_blobs(&blobs, self.blob_identity()).map_err(CacheFileProblem::OtherProgram)?;
        self.check_position(position).map_err(CacheFileProblem::Position)?;
        if !tokens.is_empty() && tokens.len() as u64 != position {
            return Err(CacheFileProblem::Position(format!(
                "{} tokens for position {position}",
                tokens.len()
            )));
        }
        let mut saved = Vec::with_capacity(self.buffers.len());
        for buffer in &self.buffers {
            let name = &buffer.decl.name;
            let view = tensors.tensor(name).map_err(|e| format(format!("buffer '{name}': {e}")))?;
            let mut shape: Vec<usize> = buffer.decl.shape.iter().map(|&d| d as usize).collect();
            if let Some(axis) = buffers[name].sequence_axis {
                shape[axis] = position as usize;
            }
            let dtype = buffer_dtype(&buffer.decl)?;
            if view.dtype() != dtype || view.shape() != shape.as_slice() {
                return Err(format(format!(
                    "tensor '{name}' is {:?} {:?}, where position {position} needs {dtype:?} {shape:?}",
                    view.dtype(),
                    view.shape(),
                )));
            }
            saved.push(view.data());
        }
        Ok((SavedCache { position, tokens }, saved))
    }
}

/// The first difference between the file's buffers and the program's, in words.
fn compare_buffers(
    file: &BTreeMap<String, BufferMeta>,
    program: &BTreeMap<String, BufferMeta>,
) -> Result<(), String> {
    let show = |m: &BufferMeta| format!("{} {:?}", m.dtype, m.shape);
    for (name, meta) in program {
        match file.get(name) {
            None => return Err(format!("it has no buffer '{name}'")),
            Some(saved) if saved != meta => {
                return Err(format!(
                    "buffer '{name}' is {} in the file, {} in the program",
                    show(saved),
                    show(meta)
                ))
            }
            Some(_) => {}
        }
    }
    match file.keys().find(|name| !program.contains_key(*name)) {
        Some(extra) => Err(format!("it has a buffer '{extra}' the program does not")),
        None => Ok(()),
    }
}

/// The first difference between the file's blob hashes and the program's, in words.
fn compare_blobs(file: &BTreeMap<String, String>, program: &BTreeMap<String, String>) -> Result<(), String> {
    let call = |key: &str| match key.rsplit_once('/') {
        Some((method, index)) => format!("the blob of method '{method}', call {index}"),
        None => format!("the blob of '{key}'"),
    };
    for (key, sha) in program {
        match file.get(key) {
            None => return Err(format!("it records no {}", call(key))),
            Some(saved) if saved != sha => {
                return Err(format!(
                    "{} differs (sha256 {saved} in the file, {sha} in the program)",
                    call(key)
                ))
            }
            Some(_) => {}
        }
    }
    match file.keys().find(|key| !program.contains_key(*key)) {
        Some(extra) => Err(format!("it records {}, which the program does not have", call(extra))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_along_the_sequence_axis_round_trips_and_leaves_later_rows_alone() {
        // [2, 4, 1] u8: two blocks of four one-byte rows.
        let decl =
            TensorDecl::new("k", DType::U8, vec![2, 4, 1], program_manifest::MemoryKind::Host).expect("decl");
        assert_eq!(sequence_axis(&decl, Some(4)), Some(1));
        assert_eq!(sequence_axis(&decl, Some(3)), None, "no axis of that length");
        let square =
            TensorDecl::new("v", DType::U8, vec![4, 4], program_manifest::MemoryKind::Host).expect("decl");
        assert_eq!(sequence_axis(&square, Some(4)), None, "two axes of that length: no axis known");
        let rows = Rows::of(&decl, 1);
        let prefix = rows.prefix(&[1, 2, 3, 4, 5, 6, 7, 8], 2);
        assert_eq!(prefix, [1, 2, 5, 6]);
        let mut full = [0u8; 8];
        rows.place(&mut full, &prefix, 2);
        assert_eq!(full, [1, 2, 0, 0, 5, 6, 0, 0]);
    }

    #[test]
    fn the_first_difference_is_named() {
        let meta = |shape: Vec<u64>| BufferMeta { dtype: "f32".into(), shape, sequence_axis: Some(1) };
        let program = BTreeMap::from([("k".to_owned(), meta(vec![2, 16, 8]))]);
        let file = BTreeMap::from([("k".to_owned(), meta(vec![2, 32, 8]))]);
        let err = compare_buffers(&file, &program).expect_err("shapes differ");
        assert_eq!(err, "buffer 'k' is f32 [2, 32, 8] in the file, f32 [2, 16, 8] in the program");
        let blobs = BTreeMap::from([("decode/0".to_owned(), "aa".to_owned())]);
        let other = BTreeMap::from([("decode/0".to_owned(), "bb".to_owned())]);
        let err = compare_blobs(&other, &blobs).expect_err("blobs differ");
        assert_eq!(
            err,
            "the blob of method 'decode', call 0 differs (sha256 bb in the file, aa in the program)"
        );
    }
}
