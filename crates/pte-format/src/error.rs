//! Why a `.pte` file could not be read.

use et_error::{ErrorCode, HasErrorCode};

/// Why a `.pte` file could not be read.
///
/// Malformed files map to [`ErrorCode::InvalidProgram`], as ExecuTorch's own loader reports them; a container
/// or schema version this build does not read ([`Error::UnsupportedIdentifier`], [`Error::NewerSchema`])
/// maps to [`ErrorCode::NotSupported`]. Every message names the field, index or file offset involved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The file ends before a fixed-size part (the flatbuffer root offset and identifier, the extended
    /// header) is complete.
    #[error("program is truncated: {what} needs {need} bytes, the file has {len}")]
    Truncated {
        /// The part that did not fit, e.g. `"extended header"`.
        what: &'static str,
        /// Bytes the part needs from the start of the file.
        need: u64,
        /// Bytes the file has.
        len: u64,
    },
    /// Bytes 4..8 are not an ExecuTorch file identifier (`ET` and two more characters): not a `.pte` file.
    #[error(
        "not an ExecuTorch program: file identifier [{identifier}] (hex) at bytes 4..8, expected \"ET12\""
    )]
    NotAProgram {
        /// The four identifier bytes, in hex.
        identifier: String,
    },
    /// An ExecuTorch identifier of another container version than `ET12` (e.g. a future `ET13`).
    #[error(
        "ExecuTorch program container \"{identifier}\" is not read by this build (it reads \"ET12\", ExecuTorch 1.x); \
         re-export the program with ExecuTorch 1.x or upgrade the reader"
    )]
    UnsupportedIdentifier {
        /// The identifier, escaped as ASCII.
        identifier: String,
    },
    /// The extended header (magic `eh00` at offset 8) declares a length shorter than its required fields.
    #[error(
        "extended header at offset 8 declares length {length}, less than the {min} bytes of its required fields"
    )]
    HeaderLength {
        /// The declared length.
        length: u32,
        /// The least length ExecuTorch writes fields for (24).
        min: u32,
    },
    /// The extended header's `program_size` is smaller than the header itself or larger than the file.
    #[error(
        "extended header program_size {program_size} is out of range: it must be at least {min} (8 bytes \
         before the header plus the header's declared length) and at most the file's {file_len} bytes"
    )]
    ProgramSize {
        /// The declared program size.
        program_size: u64,
        /// The least size (8 + the header's length).
        min: u64,
        /// Length of the file.
        file_len: u64,
    },
    /// The extended header's `segment_base_offset` lies inside the program data or past the end of the file.
    #[error(
        "extended header segment_base_offset {segment_base_offset} is out of range: segments must start at or \
         after the end of the program data ({program_size}) and inside the {file_len}-byte file"
    )]
    SegmentBase {
        /// The declared segment base offset.
        segment_base_offset: u64,
        /// The declared program size.
        program_size: u64,
        /// Length of the file.
        file_len: u64,
    },
    /// `offset + size` of a region does not fit in 64 bits.
    #[error("{what} extent overflows: offset {offset} + size {size} exceeds 2^64")]
    ExtentOverflow {
        /// The region, e.g. `"segments[1]"`.
        what: String,
        /// Its file offset.
        offset: u64,
        /// Its size.
        size: u64,
    },
    /// A region ends past the end of the file or of the segment data the extended header declares.
    #[error(
        "{what} at file offset {offset} with size {size} ends at {}, past the end of {limit_what} at {limit}",
        offset.saturating_add(*size)
    )]
    OutOfBounds {
        /// The region, e.g. `"segments[1]"`.
        what: String,
        /// Its file offset.
        offset: u64,
        /// Its size.
        size: u64,
        /// What bounds it: `"the file"` or `"the segment data (extended header)"`.
        limit_what: &'static str,
        /// Where that bound ends (a file offset).
        limit: u64,
    },
    /// The program lists non-empty segments but the file has no extended header saying where they start.
    #[error(
        "segments[{index}] has {size} bytes but the file has no extended header (\"eh00\" at offset 8) giving \
         the segment base offset"
    )]
    SegmentsWithoutHeader {
        /// The first non-empty segment.
        index: usize,
        /// Its size.
        size: u64,
    },
    /// The program's flatbuffer failed verification.
    #[error("invalid program flatbuffer (bytes 0..{program_size}): {detail}")]
    Flatbuffer {
        /// The size of the verified region.
        program_size: u64,
        /// What the verifier found, with the position.
        detail: String,
    },
    /// The program's schema version is newer than this build reads.
    #[error("program schema version {version} is newer than this build reads ({max}); upgrade the reader")]
    NewerSchema {
        /// The program's `version`.
        version: u32,
        /// The newest version this build reads (ExecuTorch 1.5.1's `kMaxSupportedSchemaVersion`).
        max: u32,
    },
    /// An index (a value, operator, delegate, segment or inline-data index) points past its table.
    #[error("{what} is {index}, but {table} has {len} entries")]
    Index {
        /// Where the index is, e.g. `method "forward" chains[0].instructions[2] (DelegateCall) args[1]`.
        what: String,
        /// The index as recorded.
        index: i64,
        /// The table it indexes, e.g. `"values"`.
        table: &'static str,
        /// The table's length.
        len: usize,
    },
    /// A field ExecuTorch's runtime needs is absent.
    #[error("{what} is missing")]
    Missing {
        /// The field, e.g. `method "forward" delegates[0].id`.
        what: String,
    },
    /// A field holds a value this build cannot take (an unknown data location, a value of the wrong type).
    #[error("invalid {what}: {problem}")]
    InvalidField {
        /// The field.
        what: String,
        /// What is wrong with its value.
        problem: String,
    },
}

impl HasErrorCode for Error {
    fn error_code(&self) -> ErrorCode {
        match self {
            Error::UnsupportedIdentifier { .. } | Error::NewerSchema { .. } => ErrorCode::NotSupported,
            Error::Truncated { .. }
            | Error::NotAProgram { .. }
            | Error::HeaderLength { .. }
            | Error::ProgramSize { .. }
            | Error::SegmentBase { .. }
            | Error::ExtentOverflow { .. }
            | Error::OutOfBounds { .. }
            | Error::SegmentsWithoutHeader { .. }
            | Error::Flatbuffer { .. }
            | Error::Index { .. }
            | Error::Missing { .. }
            | Error::InvalidField { .. } => ErrorCode::InvalidProgram,
        }
    }
}
