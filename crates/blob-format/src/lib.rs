//! The delegate blob wire format: reads native (versioned FlatBuffers) and upstream Torch-TensorRT
//! `TR01`/`TR02` blobs into one format-independent [`model::Header`], zero-copy, and writes both.
//!
//! [`Blob::parse`] detects the format from the first bytes, checks every offset and length with overflow-free
//! arithmetic, and borrows the engine payload from the input (an mmap works): parsing reads only the header,
//! so its cost does not grow with the engine. [`Blob::verify_payload`] is the separate O(engine) integrity
//! check. Validating the alias table against the engine is not this crate's concern (`alias-validate`):
//! unknown alias kinds are kept as [`model::AliasKind::Unknown`].
//!
//! ## Examples
//!
//! ```
//! use blob_format::model::{Alias, AliasKind, Binding, Format, Header, PayloadKind, Role};
//! use blob_format::{native, upstream, Blob};
//!
//! let header = Header {
//!     producer: None,
//!     backend_id: blob_format::model::TENSORRT_BACKEND.to_owned(),
//!     payload_kind: PayloadKind::TensorRtPlan,
//!     bindings: vec![
//!         Binding::untyped("k_cache", Role::Input),
//!         Binding::untyped("k_cache_out", Role::Output),
//!     ],
//!     aliases: vec![Alias {
//!         output: "k_cache_out".into(),
//!         input: "k_cache".into(),
//!         kind: AliasKind::KvCacheUpdate,
//!     }],
//!     device_id: 0,
//!     hardware_compatible: false,
//!     hardware_target: None,
//!     engine_library_version: None,
//!     engine_metadata: None,
//! };
//! let engine = b"serialized engine plan";
//!
//! // Native: the engine lands at a 256-byte-aligned offset and is borrowed, not copied, on parse.
//! let bytes = native::to_vec(&header, engine);
//! let blob = Blob::parse(&bytes)?;
//! assert_eq!(blob.format, Format::Native { major: 1, minor: 0 });
//! assert_eq!(blob.header, header);
//! assert_eq!(blob.engine, engine);
//! assert_eq!(blob.engine_offset() % 256, 0);
//! blob.verify_payload()?;
//!
//! // Upstream TR02, as Torch-TensorRT 2.14 writes it.
//! let tr02 = upstream::write_tr02(&header, engine)?;
//! assert_eq!(&tr02[..4], b"TR02");
//! assert_eq!(Blob::parse(&tr02)?.header, header);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Native layout
//!
//! A native blob is, with every integer little-endian:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic [`native::MAGIC`] = `89 44 4C 42 0D 0A 1A 0A` (`\x89DLB\r\n\x1a\n`) |
//! | 8 | 2 | u16 format major (1): a reader refuses a newer major |
//! | 10 | 2 | u16 format minor (0): a newer minor reads, unknown header fields ignored |
//! | 12 | 4 | u32 `header_offset` from the blob start (32 in 1.0; at least 32) |
//! | 16 | 4 | u32 `header_len` in bytes |
//! | 20 | 4 | reserved, written zero, ignored by readers |
//! | 24 | 8 | u64 XXH3-64 (seed 0) of the `header_len` header bytes |
//! | `header_offset` | `header_len` | FlatBuffers header, root table `Header`, file identifier `DLBH` (schema `schema/blob.fbs`) |
//! | ... | ... | zero padding |
//! | `payload.offset` | `payload.size` | engine payload; `payload.offset` is a multiple of 256 and at or after the header's end |
//!
//! The header records the producing tool, the backend id, the payload's kind, offset, size and XXH3-64, for
//! every delegate argument position the engine tensor it binds (name, role, dtype, shape with dynamic dims,
//! whether it is threaded), the alias table, device id, hardware compatibility and target, the engine
//! library version, and opaque engine metadata. Bytes after the payload are ignored. Schema evolution is
//! append-only; the rules are written at the top of `schema/blob.fbs`.
//!
//! The upstream layout is documented in [`upstream`].
//!
//! ## Feature Flags
//!
//! None.
#![deny(missing_docs)]
#![deny(unsafe_code)]

mod error;
mod generated;
pub mod model;
pub mod native;
pub mod upstream;

pub use error::{Error, WriteError};
use model::{Format, Header};

/// A parsed blob: its format, its header, and its engine payload borrowed from the input bytes.
///
/// `Debug` shows the engine's offset and length, not its (possibly gigabytes of) bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct Blob<'a> {
    /// The wire format and version the blob was read from.
    pub format: Format,
    /// Everything the blob records besides the engine.
    pub header: Header,
    /// The engine payload: a sub-slice of the bytes given to [`Blob::parse`], never a copy.
    pub engine: &'a [u8],
    engine_offset: u64,
    /// The payload checksum recorded by formats that have one (native).
    payload_xxh3: Option<u64>,
}

impl<'a> Blob<'a> {
    /// Detects the format from the first bytes and parses the blob; O(header), the engine bytes are not read.
    ///
    /// # Errors
    /// [`Error::UnknownMagic`], [`Error::UnsupportedUpstream`] or [`Error::NewerMajor`] (all
    /// `DelegateInvalidCompatibility`) for blobs this build does not read; otherwise an `InvalidProgram`
    /// error naming what is malformed and where.
    pub fn parse(bytes: &'a [u8]) -> Result<Blob<'a>, Error> {
        match detect(bytes)? {
            Format::Native { .. } => native::parse(bytes),
            Format::Tr01 | Format::Tr02 => upstream::parse(bytes),
        }
    }

    /// The engine's byte offset within the bytes given to [`Blob::parse`].
    pub fn engine_offset(&self) -> u64 {
        self.engine_offset
    }

    /// Checks the engine bytes against the checksum the header records: O(engine). Native blobs record an
    /// XXH3-64; upstream blobs record none, so this returns `Ok(())` for them.
    ///
    /// # Errors
    /// [`Error::PayloadChecksum`] when the engine bytes were altered.
    pub fn verify_payload(&self) -> Result<(), Error> {
        let Some(stored) = self.payload_xxh3 else { return Ok(()) };
        let computed = xxhash_rust::xxh3::xxh3_64(self.engine);
        if computed == stored {
            Ok(())
        } else {
            Err(Error::PayloadChecksum { stored, computed, size: self.engine.len() as u64 })
        }
    }
}

/// A blob's header read without its engine ([`parse_header`]): what a tool that shows a blob needs, read from
/// the blob's first bytes whatever the engine's size.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeaderOnly {
    /// The wire format and version the blob was read from.
    pub format: Format,
    /// Everything the blob records besides the engine.
    pub header: Header,
    /// The engine's byte offset in the blob.
    pub engine_offset: u64,
    /// The engine's size in bytes (checked to lie inside the blob, never read).
    pub engine_size: u64,
}

/// How many of a blob's first bytes hold everything [`parse_header`] reads (the prefix and the header or
/// metadata), from `first`, the blob's first [`HEADER_EXTENT_BYTES`] bytes (or the whole blob when it is
/// shorter). A reader reads that many bytes, at most the file's length, and parses them.
///
/// # Errors
/// As [`Blob::parse`] for a blob whose first bytes are wrong; an upstream metadata size above
/// [`upstream::MAX_METADATA_BYTES`] is refused here, before it is read.
pub fn header_extent(first: &[u8]) -> Result<u64, Error> {
    match detect(first)? {
        Format::Native { .. } => native::header_extent(first),
        Format::Tr01 | Format::Tr02 => upstream::header_extent(first),
    }
}

/// The bytes [`header_extent`] needs to see: the longest fixed prefix (32).
pub const HEADER_EXTENT_BYTES: usize = 32;

/// [`Blob::parse`] without the engine: `head` is the blob's first bytes (at least [`header_extent`] of them,
/// or the whole blob), `blob_len` the blob's whole length. Every check `Blob::parse` makes is made (the
/// engine's extent against `blob_len`) except [`Blob::verify_payload`]'s, which reads the engine.
///
/// # Errors
/// As [`Blob::parse`]; [`Error::Truncated`] when `head` ends before the header does.
pub fn parse_header(head: &[u8], blob_len: u64) -> Result<HeaderOnly, Error> {
    match detect(head)? {
        Format::Native { .. } => native::parse_header(head, blob_len),
        Format::Tr01 | Format::Tr02 => upstream::parse_header(head, blob_len),
    }
}

impl std::fmt::Debug for Blob<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Blob")
            .field("format", &self.format)
            .field("header", &self.header)
            .field("engine_offset", &self.engine_offset)
            .field("engine_len", &self.engine.len())
            .field("payload_xxh3", &self.payload_xxh3)
            .finish()
    }
}

/// The format and version a blob announces in its first bytes (a native blob's version is reported even when
/// this build cannot read it; [`Blob::parse`] refuses it).
///
/// # Errors
/// [`Error::Truncated`] when the bytes end inside a magic or the native version, [`Error::UnsupportedUpstream`]
/// for `TRxx` magics other than `TR01`/`TR02`, [`Error::UnknownMagic`] otherwise.
pub fn detect(bytes: &[u8]) -> Result<Format, Error> {
    const NATIVE_VERSION_END: usize = 12;
    if bytes.starts_with(&native::MAGIC) {
        return match bytes.get(8..NATIVE_VERSION_END) {
            Some(&[a, b, c, d]) => {
                Ok(Format::Native { major: u16::from_le_bytes([a, b]), minor: u16::from_le_bytes([c, d]) })
            }
            _ => Err(Error::Truncated {
                what: "native format version",
                need: NATIVE_VERSION_END as u64,
                len: bytes.len() as u64,
            }),
        };
    }
    match bytes.get(..4) {
        Some(magic) if magic == upstream::TR01 => Ok(Format::Tr01),
        Some(magic) if magic == upstream::TR02 => Ok(Format::Tr02),
        Some(&[b'T', b'R', d1, d2]) if d1.is_ascii_digit() && d2.is_ascii_digit() => {
            Err(Error::UnsupportedUpstream { magic: format!("TR{}{}", d1 as char, d2 as char) })
        }
        _ if bytes.len() < native::MAGIC.len() && native::MAGIC.starts_with(bytes) => Err(Error::Truncated {
            what: "native magic",
            need: native::MAGIC.len() as u64,
            len: bytes.len() as u64,
        }),
        _ if bytes.len() < 4 && b"TR0".starts_with(bytes) => {
            Err(Error::Truncated { what: "TR01/TR02 magic", need: 4, len: bytes.len() as u64 })
        }
        _ => Err(unknown_magic(bytes)),
    }
}

/// [`Error::UnknownMagic`] showing the blob's first bytes in hex, four at most: enough to recognise a format,
/// too few to echo the contents of a file that is not a blob (a secret passed by mistake).
pub(crate) fn unknown_magic(bytes: &[u8]) -> Error {
    let shown = &bytes[..bytes.len().min(4)];
    Error::UnknownMagic { magic: shown.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ") }
}

/// `offset + size`, checked against overflow and against the blob's end.
pub(crate) fn checked_end(what: &'static str, offset: u64, size: u64, blob_len: u64) -> Result<u64, Error> {
    let end = offset.checked_add(size).ok_or(Error::ExtentOverflow { what, offset, size })?;
    if end > blob_len {
        return Err(Error::OutOfBounds { what, offset, size, blob_len });
    }
    Ok(end)
}
