//! Errors of reading a blob ([`Error`]) and of writing one in a format that cannot express it
//! ([`WriteError`]).

use et_error::{ErrorCode, HasErrorCode};

/// What this build reads, for messages: `native 1.x, TR01 and TR02`.
pub(crate) fn formats_read() -> String {
    format!("native {}.x, TR01 and TR02", crate::native::CURRENT.0)
}

/// Why a blob could not be read.
///
/// Malformed blobs map to [`ErrorCode::InvalidProgram`]; blobs in a format or version this build does not read
/// (unknown magic, a newer native major, a future upstream `TRxx`) map to
/// [`ErrorCode::DelegateInvalidCompatibility`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The blob ends before a fixed-size part (prefix, magic) is complete.
    #[error("blob is truncated: {what} needs {need} bytes, the blob has {len}")]
    Truncated {
        /// The part that did not fit, e.g. `"native prefix"`.
        what: &'static str,
        /// Bytes the part needs from the start of the blob.
        need: u64,
        /// Bytes the blob has.
        len: u64,
    },
    /// The first bytes are no magic this build knows (this includes the Torch-TensorRT 2.12 layout, which has
    /// no magic at all).
    #[error(
        "unknown blob magic [{magic}] (hex); this build reads {} (the magic-less Torch-TensorRT 2.12 layout is not supported)",
        formats_read()
    )]
    UnknownMagic {
        /// The first bytes of the blob (up to 4), in hex.
        magic: String,
    },
    /// An upstream `TRxx` magic other than `TR01`/`TR02`, e.g. `TR03` from a newer Torch-TensorRT.
    #[error(
        "upstream blob format {magic} is not read by this build (it reads {}); upgrade delegate-host",
        formats_read()
    )]
    UnsupportedUpstream {
        /// The 4-byte magic, escaped as ASCII.
        magic: String,
    },
    /// A native blob of a newer major version than this build reads.
    #[error(
        "native blob format {major}.{minor} is newer than this build reads ({}.x); upgrade delegate-host",
        crate::native::CURRENT.0
    )]
    NewerMajor {
        /// The blob's major version.
        major: u16,
        /// The blob's minor version.
        minor: u16,
    },
    /// A native version that was never written (major 0).
    #[error("native blob format {major}.{minor} was never released; this build reads {}", formats_read())]
    UnknownVersion {
        /// The blob's major version.
        major: u16,
        /// The blob's minor version.
        minor: u16,
    },
    /// The native header's bytes do not match the checksum in the prefix.
    #[error(
        "native header checksum mismatch: prefix says {stored:#018x}, header bytes hash to {computed:#018x}"
    )]
    HeaderChecksum {
        /// The XXH3-64 recorded in the prefix.
        stored: u64,
        /// The XXH3-64 of the header bytes.
        computed: u64,
    },
    /// The payload's bytes do not match the checksum recorded in the native header.
    #[error(
        "engine payload checksum mismatch: header says {stored:#018x}, the {size} payload bytes hash to {computed:#018x}"
    )]
    PayloadChecksum {
        /// The XXH3-64 recorded in the header.
        stored: u64,
        /// The XXH3-64 of the payload bytes.
        computed: u64,
        /// Payload length in bytes.
        size: u64,
    },
    /// `offset + size` of a region does not fit in 64 bits.
    #[error("{what} extent overflows: offset {offset} + size {size} exceeds 2^64")]
    ExtentOverflow {
        /// The region, e.g. `"engine"`.
        what: &'static str,
        /// Its recorded offset.
        offset: u64,
        /// Its recorded size.
        size: u64,
    },
    /// A region ends past the end of the blob.
    #[error("{what} at offset {offset} with size {size} ends at {}, past the end of the {blob_len}-byte blob", offset.saturating_add(*size))]
    OutOfBounds {
        /// The region, e.g. `"engine"`.
        what: &'static str,
        /// Its recorded offset.
        offset: u64,
        /// Its recorded size.
        size: u64,
        /// Length of the blob.
        blob_len: u64,
    },
    /// Regions overlap or are misplaced (e.g. the engine starts inside the metadata, or is misaligned).
    #[error("invalid blob layout: {problem}")]
    Layout {
        /// What is wrong, with the offsets involved.
        problem: String,
    },
    /// The native FlatBuffers header failed verification.
    #[error("invalid native header: {detail}")]
    InvalidHeader {
        /// What the verifier found.
        detail: String,
    },
    /// The upstream JSON metadata is not UTF-8.
    #[error("upstream metadata is not UTF-8 at blob offset {offset}: {source}")]
    MetadataUtf8 {
        /// Blob offset of the first invalid byte.
        offset: u64,
        /// The decoding error.
        #[source]
        source: std::str::Utf8Error,
    },
    /// The upstream JSON metadata does not parse or has the wrong shape.
    #[error("upstream metadata JSON is invalid: {source}")]
    MetadataJson {
        /// The JSON error, with line and column.
        #[source]
        source: serde_json::Error,
    },
    /// A field holds a value this build cannot take (unknown dtype or role, out-of-range device id, ...).
    #[error("invalid {field}: {problem}")]
    InvalidField {
        /// The field, e.g. `bindings[2].dtype`.
        field: String,
        /// What is wrong with its value.
        problem: String,
    },
}

impl HasErrorCode for Error {
    fn error_code(&self) -> ErrorCode {
        match self {
            Error::UnknownMagic { .. }
            | Error::UnsupportedUpstream { .. }
            | Error::NewerMajor { .. }
            | Error::UnknownVersion { .. } => ErrorCode::DelegateInvalidCompatibility,
            Error::Truncated { .. }
            | Error::HeaderChecksum { .. }
            | Error::PayloadChecksum { .. }
            | Error::ExtentOverflow { .. }
            | Error::OutOfBounds { .. }
            | Error::Layout { .. }
            | Error::InvalidHeader { .. }
            | Error::MetadataUtf8 { .. }
            | Error::MetadataJson { .. }
            | Error::InvalidField { .. } => ErrorCode::InvalidProgram,
        }
    }
}

/// Why a blob could not be written in the requested format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WriteError {
    /// The header records things the target format cannot express; writing would silently lose them.
    #[error("{format} cannot express this blob: {}", losses.join("; "))]
    Unrepresentable {
        /// The target format, e.g. `"TR02"`.
        format: &'static str,
        /// One entry per lost field, each starting with the field's path (`producer: ...`).
        losses: Vec<String>,
    },
    /// A size does not fit the target format's fixed-width field.
    #[error(
        "{format} cannot express this blob: {what} is {size} bytes, more than its {limit}-byte field allows"
    )]
    TooLarge {
        /// The target format.
        format: &'static str,
        /// The region, e.g. `"metadata"`.
        what: &'static str,
        /// Its size in bytes.
        size: u64,
        /// The largest size the format can record.
        limit: u64,
    },
    /// The native header would exceed [`crate::native::MAX_HEADER_BYTES`].
    #[error("native cannot express this blob: its header would take up to {estimate} bytes, more than the {limit} bytes a native header may have")]
    HeaderTooLarge {
        /// The upper bound of the encoded size.
        estimate: u64,
        /// The limit.
        limit: u64,
    },
}

impl HasErrorCode for WriteError {
    fn error_code(&self) -> ErrorCode {
        match self {
            WriteError::Unrepresentable { .. }
            | WriteError::TooLarge { .. }
            | WriteError::HeaderTooLarge { .. } => ErrorCode::NotSupported,
        }
    }
}
