//! The native blob format: a fixed little-endian prefix, a FlatBuffers header, and a 256-byte-aligned
//! engine payload. The byte layout is documented at the [crate root](crate#native-layout).
//!
//! Reading dispatches on the prefix's major version: each major has its own reader module that produces the
//! current in-memory [`Header`] (so a future 2.0 adds a `v2` reader and the upgrade of its header into the
//! model, while `v1` keeps reading every 1.x blob ever written). A newer minor of a known major reads, its
//! unknown header fields ignored; a newer major is refused with [`Error::NewerMajor`].

mod streamed;
mod v1;

use std::io;

use xxhash_rust::xxh3::xxh3_64;

use crate::model::{Format, Header};
use crate::{Blob, Error, WriteError};

pub use streamed::write_streamed;

/// The 8-byte magic that starts every native blob: `\x89DLB\r\n\x1a\n`.
///
/// Like PNG's, the non-ASCII first byte and the CR LF / Ctrl-Z / LF tail make transfer corruption (text-mode
/// line-ending conversion, 7-bit stripping) detectable, and it cannot collide with upstream's `TRxx` magics.
pub const MAGIC: [u8; 8] = *b"\x89DLB\r\n\x1a\n";

/// The native format version this build writes, `(major, minor)`; it reads every `CURRENT.0.x`.
pub const CURRENT: (u16, u16) = (1, 0);

/// Length of the fixed prefix in bytes; the header starts at or after it.
pub const PREFIX_LEN: usize = 32;

/// The engine payload's offset (from the start of the blob) is a multiple of this.
pub const PAYLOAD_ALIGN: u64 = 256;

/// The decoded fixed prefix of a native blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Prefix {
    pub(crate) major: u16,
    pub(crate) minor: u16,
    pub(crate) header_offset: u32,
    pub(crate) header_len: u32,
    pub(crate) header_xxh3: u64,
}

impl Prefix {
    /// Decodes the prefix; `bytes` must start with [`MAGIC`] (checked).
    pub(crate) fn read(bytes: &[u8]) -> Result<Prefix, Error> {
        let prefix: &[u8; PREFIX_LEN] =
            bytes.get(..PREFIX_LEN).and_then(|p| p.try_into().ok()).ok_or(Error::Truncated {
                what: "native prefix",
                need: PREFIX_LEN as u64,
                len: bytes.len() as u64,
            })?;
        if prefix[..8] != MAGIC {
            return Err(crate::unknown_magic(bytes));
        }
        let u16_at = |at: usize| u16::from_le_bytes([prefix[at], prefix[at + 1]]);
        let u32_at =
            |at: usize| u32::from_le_bytes([prefix[at], prefix[at + 1], prefix[at + 2], prefix[at + 3]]);
        let mut xxh3 = [0u8; 8];
        xxh3.copy_from_slice(&prefix[24..32]);
        Ok(Prefix {
            major: u16_at(8),
            minor: u16_at(10),
            header_offset: u32_at(12),
            header_len: u32_at(16),
            header_xxh3: u64::from_le_bytes(xxh3),
        })
    }

    fn encode(&self) -> [u8; PREFIX_LEN] {
        let mut out = [0u8; PREFIX_LEN];
        out[..8].copy_from_slice(&MAGIC);
        out[8..10].copy_from_slice(&self.major.to_le_bytes());
        out[10..12].copy_from_slice(&self.minor.to_le_bytes());
        out[12..16].copy_from_slice(&self.header_offset.to_le_bytes());
        out[16..20].copy_from_slice(&self.header_len.to_le_bytes());
        // 20..24 reserved: written zero, ignored by readers.
        out[24..32].copy_from_slice(&self.header_xxh3.to_le_bytes());
        out
    }
}

/// Where the payload lies and what it hashes to, as recorded in the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PayloadLocation {
    pub(crate) offset: u64,
    pub(crate) size: u64,
    pub(crate) xxh3: u64,
}

/// Parses a native blob (any version this build reads) without touching the engine bytes.
///
/// [`Blob::parse`] calls this when the blob starts with [`MAGIC`]; call it directly to refuse every other
/// format.
///
/// # Errors
/// [`Error::NewerMajor`] for a major version newer than [`CURRENT`], and the malformed-blob errors
/// ([`Error::Truncated`], [`Error::HeaderChecksum`], [`Error::InvalidHeader`], [`Error::OutOfBounds`], ...).
pub fn parse(bytes: &[u8]) -> Result<Blob<'_>, Error> {
    let prefix = Prefix::read(bytes)?;
    match prefix.major {
        0 => Err(Error::UnknownVersion { major: prefix.major, minor: prefix.minor }),
        // Every 1.x: 1.0 is the only minor written so far; newer minors only append header fields.
        1 => v1::read(bytes, &prefix),
        // A future major adds an arm `2 => v2::read(...)` whose reader upgrades its header to the model.
        major => Err(Error::NewerMajor { major, minor: prefix.minor }),
    }
}

/// [`parse`] of the header only: `head` is the blob's first bytes (at least the prefix and the header,
/// [`crate::header_extent`]), `blob_len` its whole length; the payload's extent is checked, never read.
pub(crate) fn parse_header(head: &[u8], blob_len: u64) -> Result<crate::HeaderOnly, Error> {
    let prefix = Prefix::read(head)?;
    let (header, location) = match prefix.major {
        0 => return Err(Error::UnknownVersion { major: prefix.major, minor: prefix.minor }),
        1 => v1::read_header(head, blob_len, &prefix)?,
        major => return Err(Error::NewerMajor { major, minor: prefix.minor }),
    };
    Ok(crate::HeaderOnly {
        format: format_of(prefix.major, prefix.minor),
        header,
        engine_offset: location.offset,
        engine_size: location.size,
    })
}

/// The bytes from the blob's start to its header's end, from its prefix.
pub(crate) fn header_extent(first: &[u8]) -> Result<u64, Error> {
    let prefix = Prefix::read(first)?;
    Ok(u64::from(prefix.header_offset) + u64::from(prefix.header_len))
}

/// The largest native header this crate writes: 16 MiB of FlatBuffers, room for about a hundred thousand
/// bindings. [`check_header`] refuses a larger one before anything is built, so a header read from an
/// untrusted upstream blob (whose metadata is itself bounded) can never reach FlatBuffers' 2 GiB panic.
pub const MAX_HEADER_BYTES: u64 = 16 << 20;

/// Checks that `header` encodes within [`MAX_HEADER_BYTES`], by [`header_size_bound`].
///
/// # Errors
/// [`WriteError::HeaderTooLarge`] with the bound and the limit.
pub fn check_header(header: &Header) -> Result<(), WriteError> {
    let estimate = header_size_bound(header);
    if estimate > MAX_HEADER_BYTES {
        return Err(WriteError::HeaderTooLarge { estimate, limit: MAX_HEADER_BYTES });
    }
    Ok(())
}

/// An upper bound of the FlatBuffers header [`write()`] builds for `header`, computed without building
/// anything (O(fields), no allocation).
pub fn header_size_bound(header: &Header) -> u64 {
    // Every table costs at most its vtable and fields (64 bytes here), every string its bytes plus a length,
    // a terminator and alignment (8), every vector element its offset and its table; dims are 16-byte structs.
    let string = |s: &str| s.len() as u64 + 8;
    let optional = |s: &Option<String>| s.as_deref().map_or(0, string);
    let producer = header.producer.as_ref().map_or(0, |p| 64 + string(&p.name) + string(&p.version));
    let bindings: u64 = header
        .bindings
        .iter()
        .map(|b| 64 + 4 + string(&b.name) + b.shape.as_ref().map_or(0, |dims| 8 + 24 * dims.len() as u64))
        .sum();
    let aliases: u64 = header
        .aliases
        .iter()
        .map(|a| 64 + 4 + string(&a.output) + string(&a.input) + string(a.kind.as_str()))
        .sum();
    256 + producer
        + string(&header.backend_id)
        + string(header.payload_kind.as_str())
        + bindings
        + aliases
        + optional(&header.hardware_target)
        + optional(&header.engine_library_version)
        + optional(&header.engine_metadata)
}

/// Writes a native blob of version [`CURRENT`]: prefix, header, zero padding, then `engine` at a
/// [`PAYLOAD_ALIGN`]-aligned offset.
///
/// The header's payload checksum is computed here (one pass over `engine`), and `engine` is written once,
/// straight from the slice.
///
/// # Errors
/// Only what `out` returns.
///
/// # Panics
/// If the encoded header exceeds FlatBuffers' 2 GiB buffer limit (millions of bindings). A header from
/// anywhere untrusted goes through [`check_header`] first, which refuses it long before.
pub fn write(header: &Header, engine: &[u8], out: &mut impl io::Write) -> io::Result<()> {
    let head = encode_head(CURRENT, engine, |location| v1::encode_header(header, location));
    out.write_all(&head)?;
    out.write_all(engine)
}

/// [`write()`] into a new vector.
///
/// # Panics
/// As [`write()`].
pub fn to_vec(header: &Header, engine: &[u8]) -> Vec<u8> {
    let mut head = encode_head(CURRENT, engine, |location| v1::encode_header(header, location));
    head.reserve_exact(engine.len());
    head.extend_from_slice(engine);
    head
}

/// Everything before the payload: prefix, the FlatBuffers header `encode` builds, zero padding.
pub(crate) fn encode_head(
    version: (u16, u16),
    engine: &[u8],
    encode: impl Fn(PayloadLocation) -> Vec<u8>,
) -> Vec<u8> {
    encode_head_for(version, engine.len() as u64, xxh3_64(engine), encode)
}

/// [`encode_head`] for an engine of `size` bytes whose XXH3-64 is `xxh3`.
///
/// The header records the payload offset, which depends on the header's own length; `encode` is re-run until
/// the two agree. Fields are fixed-width and a non-zero offset is always stored, so the second run agrees.
pub(crate) fn encode_head_for(
    version: (u16, u16),
    size: u64,
    xxh3: u64,
    encode: impl Fn(PayloadLocation) -> Vec<u8>,
) -> Vec<u8> {
    let mut location = PayloadLocation { offset: PAYLOAD_ALIGN, size, xxh3 };
    for _ in 0..4 {
        let header = encode(location);
        let header_end = (PREFIX_LEN + header.len()) as u64;
        let offset = header_end.div_ceil(PAYLOAD_ALIGN) * PAYLOAD_ALIGN;
        if offset != location.offset {
            location.offset = offset;
            continue;
        }
        let prefix = Prefix {
            major: version.0,
            minor: version.1,
            header_offset: PREFIX_LEN as u32,
            header_len: u32::try_from(header.len()).expect("FlatBuffers caps a buffer at 2 GiB"),
            header_xxh3: xxh3_64(&header),
        };
        let mut head = Vec::with_capacity(offset as usize);
        head.extend_from_slice(&prefix.encode());
        head.extend_from_slice(&header);
        head.resize(offset as usize, 0);
        return head;
    }
    unreachable!("the payload offset is stable after one re-encode: every header field has a fixed width")
}

/// The [`Format`] of a native blob at `prefix`'s version.
pub(crate) fn format_of(major: u16, minor: u16) -> Format {
    Format::Native { major, minor }
}

#[cfg(test)]
mod tests;
