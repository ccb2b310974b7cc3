//! The cache file's bytes (see the parent module's docs for the format): the header a save writes, the
//! tensors it streams after it, the largest file and header a program's cache file can be, and the checks a
//! restore makes before it writes anything.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Write};
use std::path::Path;

use blob_format::model::DType;
use program_manifest::TensorDecl;
use safetensors::tensor::{Metadata, TensorInfo};
use safetensors::Dtype;

use super::{cache_file_error, sequence_axis, CacheFileProblem, SavedCache, CACHE_FORMAT_VERSION};
use crate::program::{Error, Program};

/// The `format` value of a cache file's metadata.
const FORMAT: &str = "kv-delegate-cache";

/// The safetensors header length: a little-endian `u64` before the JSON header.
const LENGTH_BYTES: u64 = 8;

/// The tokens a cache file records at most for a program whose caches state no positions
/// (`[generate].max_positions`): what bounds its header then.
pub(super) const TOKENS_WITHOUT_POSITIONS: u64 = 1 << 20;

/// The longest token in a header's `tokens` array: `-9223372036854775808` and a comma.
const TOKEN_BYTES: u64 = 21;

/// Room in a header's bound for metadata keys a later host adds within format version 1 (older hosts ignore
/// them; see STABILITY.md).
const LATER_METADATA_BYTES: u64 = 64 * 1024;

/// One buffer as the file describes it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(super) struct BufferMeta {
    pub(super) dtype: String,
    pub(super) shape: Vec<u64>,
    pub(super) sequence_axis: Option<usize>,
}

/// A buffer's rows along its sequence axis: `outer` blocks of `rows` rows of `row_bytes` bytes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rows {
    outer: usize,
    rows: usize,
    row_bytes: usize,
}

impl Rows {
    pub(super) fn of(decl: &TensorDecl, axis: usize) -> Rows {
        let dims: Vec<usize> = decl.shape.iter().map(|&d| d as usize).collect();
        let outer = dims[..axis].iter().product();
        let row_bytes = dims[axis + 1..].iter().product::<usize>() * decl.dtype.size_bytes();
        Rows { outer, rows: dims[axis], row_bytes }
    }

    /// Writes the first `position` rows of each block of `full` to `out`, block after block: what a saved
    /// tensor holds, streamed without a copy.
    pub(super) fn write_prefix(self, out: &mut impl Write, full: &[u8], position: usize) -> io::Result<()> {
        let block = self.rows * self.row_bytes;
        let take = position * self.row_bytes;
        (0..self.outer).try_for_each(|o| out.write_all(&full[o * block..o * block + take]))
    }

    /// Writes `prefix` (as [`Rows::write_prefix`] wrote it) over the first `position` rows of each block of
    /// `full`.
    pub(super) fn place(self, full: &mut [u8], prefix: &[u8], position: usize) {
        let block = self.rows * self.row_bytes;
        let take = position * self.row_bytes;
        for o in 0..self.outer {
            full[o * block..o * block + take].copy_from_slice(&prefix[o * take..(o + 1) * take]);
        }
    }
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

/// The start of a cache file as a save writes it: the header length and the header, and the order in which
/// the buffers' tensors follow (safetensors' own: by descending dtype, then by name).
pub(super) struct Header {
    pub(super) bytes: Vec<u8>,
    pub(super) order: Vec<usize>,
}

/// The most bytes a cache file of a program can hold, known before a byte of it is read.
#[derive(Debug, Clone, Copy)]
pub(super) struct Bounds {
    /// The JSON header's most bytes.
    pub(super) header: u64,
    /// The whole file's: the header length, the header and every buffer's full size.
    pub(super) file: u64,
}

impl Program {
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

    /// Each buffer's sequence axis, in the program's buffer order.
    pub(super) fn sequence_axes(&self) -> Vec<Option<usize>> {
        let max = self.max_positions();
        self.buffers.iter().map(|b| sequence_axis(&b.decl, max)).collect()
    }

    /// The shape buffer `b` is saved with at `position`: its own, `position` along its sequence axis.
    fn saved_shape(&self, b: usize, axis: Option<usize>, position: u64) -> Vec<usize> {
        let mut shape: Vec<usize> = self.buffers[b].decl.shape.iter().map(|&d| d as usize).collect();
        if let Some(axis) = axis {
            shape[axis] = position as usize;
        }
        shape
    }

    /// The most tokens a cache file of the program records: its caches' positions, or
    /// [`TOKENS_WITHOUT_POSITIONS`] when they state none.
    pub(super) fn max_tokens(&self) -> u64 {
        self.max_positions().unwrap_or(TOKENS_WITHOUT_POSITIONS)
    }

    /// The header a save at `position` with `tokens` writes (both checked by the caller).
    pub(super) fn cache_header(&self, position: u64, tokens: &[i64]) -> Result<Header, CacheFileProblem> {
        let format = |why: String| CacheFileProblem::Format(why);
        let metadata = HashMap::from([
            ("format".to_owned(), FORMAT.to_owned()),
            ("format_version".to_owned(), CACHE_FORMAT_VERSION.to_string()),
            ("position".to_owned(), position.to_string()),
            ("tokens".to_owned(), serde_json::to_string(tokens).map_err(|e| format(e.to_string()))?),
            (
                "buffers".to_owned(),
                serde_json::to_string(&self.buffer_metas()).map_err(|e| format(e.to_string()))?,
            ),
            (
                "blobs".to_owned(),
                serde_json::to_string(self.blob_identity()).map_err(|e| format(e.to_string()))?,
            ),
        ]);
        let dtypes = self.buffers.iter().map(|b| buffer_dtype(&b.decl)).collect::<Result<Vec<_>, _>>()?;
        let name = |b: usize| &self.buffers[b].decl.name;
        let mut order: Vec<usize> = (0..self.buffers.len()).collect();
        order.sort_by(|&a, &b| dtypes[b].cmp(&dtypes[a]).then(name(a).cmp(name(b))));
        let axes = self.sequence_axes();
        let mut offset = 0;
        let infos = order.iter().map(|&b| {
            let shape = self.saved_shape(b, axes[b], position);
            let bytes = shape.iter().product::<usize>() * self.buffers[b].decl.dtype.size_bytes();
            offset += bytes;
            (name(b).clone(), TensorInfo { dtype: dtypes[b], shape, data_offsets: (offset - bytes, offset) })
        });
        let header = Metadata::new(Some(metadata), infos.collect()).map_err(|e| format(e.to_string()))?;
        let mut json = serde_json::to_vec(&header).map_err(|e| format(e.to_string()))?;
        // Padded to 8 bytes with spaces, as safetensors writes it.
        json.resize(json.len().next_multiple_of(LENGTH_BYTES as usize), b' ');
        let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(&json);
        Ok(Header { bytes, order })
    }

    /// Writes the tensors of a save at `position` to `out` (the file at `path`), in `order`
    /// ([`Header::order`]), each buffer's bytes streamed from its storage (device memory copied to the host
    /// one buffer at a time).
    pub(super) fn write_tensors(
        &self,
        out: &mut impl Write,
        order: &[usize],
        position: u64,
        path: &Path,
    ) -> Result<(), Error> {
        let axes = self.sequence_axes();
        for &b in order {
            let buffer = &self.buffers[b];
            let full = buffer.storage.read().map_err(|source| Error::BufferAccess {
                buffer: buffer.decl.name.clone(),
                action: "reading",
                source,
            })?;
            match axes[b] {
                Some(axis) => Rows::of(&buffer.decl, axis).write_prefix(out, &full, position as usize),
                None => out.write_all(&full),
            }
            .map_err(|source| cache_file_error(path, CacheFileProblem::Io { action: "written", source }))?;
        }
        Ok(())
    }

    /// The most bytes a cache file of this program can hold: its largest header (every tensor at its full
    /// shape, the largest position, [`TOKEN_BYTES`] for each of [`Program::max_tokens`] tokens, and
    /// [`LATER_METADATA_BYTES`]) and its buffers' full sizes. Generous, but finite, and known before the file
    /// is opened.
    pub(super) fn cache_file_bounds(&self) -> Result<Bounds, CacheFileProblem> {
        let full = self.cache_header(self.max_positions().unwrap_or(0), &[])?;
        let header = (full.bytes.len() as u64 - LENGTH_BYTES)
            .saturating_add(u64::MAX.to_string().len() as u64)
            .saturating_add(TOKEN_BYTES.saturating_mul(self.max_tokens()))
            .saturating_add(LATER_METADATA_BYTES + LENGTH_BYTES);
        let buffers = self.buffers.iter().fold(0u64, |sum, b| sum.saturating_add(b.storage.len() as u64));
        Ok(Bounds { header, file: LENGTH_BYTES.saturating_add(header).saturating_add(buffers) })
    }

    /// Checks a whole cache file against this program before anything is written: its header no longer
    /// than `bounds` allow (refused before it is parsed), its format, metadata, buffers, blobs and position,
    /// and one tensor per buffer of the expected dtype and shape, and no other. Returns what it holds and
    /// each buffer's saved bytes, in the program's buffer order.
    pub(super) fn check_cache_file<'b>(
        &self,
        bytes: &'b [u8],
        bounds: Bounds,
    ) -> Result<(SavedCache, Vec<&'b [u8]>), CacheFileProblem> {
        let format = |why: String| CacheFileProblem::Format(why);
        let Some(length) = bytes.first_chunk::<8>().map(|l| u64::from_le_bytes(*l)) else {
            return Err(format(format!("it is {} bytes, too short for a header length", bytes.len())));
        };
        if length > bounds.header {
            return Err(CacheFileProblem::HeaderTooLarge { bytes: length, most: bounds.header });
        }
        let (length, header) =
            safetensors::SafeTensors::read_metadata(bytes).map_err(|err| format(err.to_string()))?;
        let data = &bytes[LENGTH_BYTES as usize + length..];
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
        self.check_tokens(position, &tokens)?;
        let extra =
            header.offset_keys().into_iter().find(|t| !self.buffers.iter().any(|b| &b.decl.name == t));
        if let Some(extra) = extra {
            return Err(CacheFileProblem::OtherProgram(format!(
                "it holds a tensor '{extra}', which is no buffer of the program"
            )));
        }
        let axes = self.sequence_axes();
        let mut saved = Vec::with_capacity(self.buffers.len());
        for (b, buffer) in self.buffers.iter().enumerate() {
            let name = &buffer.decl.name;
            let info = header.info(name).ok_or_else(|| format(format!("it holds no tensor '{name}'")))?;
            let shape = self.saved_shape(b, axes[b], position);
            let dtype = buffer_dtype(&buffer.decl)?;
            if info.dtype != dtype || info.shape != shape {
                return Err(format(format!(
                    "tensor '{name}' is {:?} {:?}, where position {position} needs {dtype:?} {shape:?}",
                    info.dtype, info.shape,
                )));
            }
            saved.push(&data[info.data_offsets.0..info.data_offsets.1]);
        }
        Ok((SavedCache { position, tokens }, saved))
    }

    /// Refuses tokens that do not match `position` (none, or one per position), or more than a cache file
    /// records ([`Program::max_tokens`]).
    pub(super) fn check_tokens(&self, position: u64, tokens: &[i64]) -> Result<(), CacheFileProblem> {
        let most = self.max_tokens();
        if tokens.len() as u64 > most {
            return Err(CacheFileProblem::Position(format!(
                "{} tokens, where a cache file of this program records at most {most}",
                tokens.len()
            )));
        }
        if !tokens.is_empty() && tokens.len() as u64 != position {
            return Err(CacheFileProblem::Position(format!(
                "{} tokens for position {position}",
                tokens.len()
            )));
        }
        Ok(())
    }
}

/// The first difference between the file's buffers and the program's, in words: the dtype or the shape when
/// one differs, else the sequence axis.
pub(super) fn compare_buffers(
    file: &BTreeMap<String, BufferMeta>,
    program: &BTreeMap<String, BufferMeta>,
) -> Result<(), String> {
    let show = |m: &BufferMeta| format!("{} {:?}", m.dtype, m.shape);
    let axis = |m: &BufferMeta| m.sequence_axis.map_or("none".to_owned(), |a| a.to_string());
    for (name, meta) in program {
        match file.get(name) {
            None => return Err(format!("it has no buffer '{name}'")),
            Some(saved) if (&saved.dtype, &saved.shape) != (&meta.dtype, &meta.shape) => {
                return Err(format!(
                    "buffer '{name}' is {} in the file, {} in the program",
                    show(saved),
                    show(meta)
                ))
            }
            Some(saved) if saved.sequence_axis != meta.sequence_axis => {
                return Err(format!(
                    "buffer '{name}' ({}) has sequence axis {} in the file, {} in the program",
                    show(meta),
                    axis(saved),
                    axis(meta)
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
pub(super) fn compare_blobs(
    file: &BTreeMap<String, String>,
    program: &BTreeMap<String, String>,
) -> Result<(), String> {
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
        let mut prefix = Vec::new();
        rows.write_prefix(&mut prefix, &[1, 2, 3, 4, 5, 6, 7, 8], 2).expect("writes");
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

    /// Issue 44, item 5: a sequence axis that differs is named, not shown as two equal shapes.
    #[test]
    fn a_sequence_axis_that_differs_is_named() {
        let meta =
            |sequence_axis| BufferMeta { dtype: "f32".into(), shape: vec![1, 2, 64, 16], sequence_axis };
        let program = BTreeMap::from([("k".to_owned(), meta(None))]);
        let file = BTreeMap::from([("k".to_owned(), meta(Some(2)))]);
        let err = compare_buffers(&file, &program).expect_err("axes differ");
        assert_eq!(
            err,
            "buffer 'k' (f32 [1, 2, 64, 16]) has sequence axis 2 in the file, none in the program"
        );
    }
}
