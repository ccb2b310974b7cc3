//! The container around the flatbuffer: identifier, extended header, program size, segment area.

use crate::model::ExtendedHeader;
use crate::Error;

/// The file identifier of an ExecuTorch 1.x program, at bytes 4..8.
pub const IDENTIFIER: &[u8; 4] = b"ET12";

/// The extended header's magic, at bytes 8..12 when present.
pub const EXTENDED_HEADER_MAGIC: &[u8; 4] = b"eh00";

/// Offset of the extended header in the file.
pub const EXTENDED_HEADER_OFFSET: u64 = 8;

/// Bytes of the header's required fields (magic, length, program size, segment base offset).
pub(crate) const HEADER_MIN_LEN: u32 = 24;

/// Bytes of the header with `segment_data_size`, as ExecuTorch 1.x writes it.
pub const EXTENDED_HEADER_LEN: u32 = 32;

/// Whether `bytes` look like an ExecuTorch program of any container version: `ET` at bytes 4..6, as
/// ExecuTorch's `Program::check_header` decides. [`crate::Program::parse`] reads `ET12` and refuses other
/// versions with [`Error::UnsupportedIdentifier`]. No blob format of this workspace has `ET` there.
pub fn is_program(bytes: &[u8]) -> bool {
    bytes.get(4..6) == Some(b"ET".as_slice())
}

/// Where segments may lie: `[base, limit)`, `limit` being the end of the declared segment data or of the file.
#[derive(Clone, Copy)]
pub(crate) struct SegmentArea {
    pub base: u64,
    pub limit: u64,
    pub limit_what: &'static str,
}

/// The container's layout, checked: identifier, header, program size, segment area.
pub(crate) struct Layout {
    pub header: Option<ExtendedHeader>,
    pub program_size: u64,
    pub segments: Option<SegmentArea>,
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut raw = [0u8; 4];
    raw.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(raw)
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut raw = [0u8; 8];
    raw.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(raw)
}

/// The layout of a file of `file_len` bytes whose first bytes are `bytes` (all of them, or at least the
/// identifier and the extended header).
pub(crate) fn layout(bytes: &[u8], file_len: u64) -> Result<Layout, Error> {
    if bytes.len() < 8 {
        return Err(Error::Truncated {
            what: "the flatbuffer root offset and file identifier",
            need: 8,
            len: bytes.len() as u64,
        });
    }
    let identifier = &bytes[4..8];
    if identifier != IDENTIFIER {
        return Err(if is_program(bytes) {
            Error::UnsupportedIdentifier { identifier: identifier.escape_ascii().to_string() }
        } else {
            Error::NotAProgram {
                identifier: identifier.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" "),
            }
        });
    }
    let header = extended_header(bytes)?;
    let Some(header) = header else {
        return Ok(Layout { header: None, program_size: file_len, segments: None });
    };
    let min = EXTENDED_HEADER_OFFSET + u64::from(header.length);
    if header.program_size < min || header.program_size > file_len {
        return Err(Error::ProgramSize { program_size: header.program_size, min, file_len });
    }
    let base = header.segment_base_offset;
    if base == 0 {
        // ExecuTorch writes 0 when there is no segment data.
        return Ok(Layout { header: Some(header), program_size: header.program_size, segments: None });
    }
    if base < header.program_size || base > file_len {
        return Err(Error::SegmentBase {
            segment_base_offset: base,
            program_size: header.program_size,
            file_len,
        });
    }
    let area = if header.segment_data_size == 0 {
        SegmentArea { base, limit: file_len, limit_what: "the file" }
    } else {
        let what = "the segment data (extended header)";
        let end = checked_end(what, base, header.segment_data_size, file_len, "the file")?;
        SegmentArea { base, limit: end, limit_what: what }
    };
    Ok(Layout { header: Some(header), program_size: header.program_size, segments: Some(area) })
}

/// The extended header, if bytes 8..12 are its magic.
fn extended_header(bytes: &[u8]) -> Result<Option<ExtendedHeader>, Error> {
    if bytes.get(8..12) != Some(EXTENDED_HEADER_MAGIC.as_slice()) {
        return Ok(None);
    }
    let file_len = bytes.len() as u64;
    let need = EXTENDED_HEADER_OFFSET + u64::from(HEADER_MIN_LEN);
    if file_len < need {
        return Err(Error::Truncated { what: "the extended header", need, len: file_len });
    }
    let length = u32_at(bytes, 12);
    if length < HEADER_MIN_LEN {
        return Err(Error::HeaderLength { length, min: HEADER_MIN_LEN });
    }
    let segment_data_size = if length >= EXTENDED_HEADER_LEN {
        let need = EXTENDED_HEADER_OFFSET + u64::from(EXTENDED_HEADER_LEN);
        if file_len < need {
            return Err(Error::Truncated { what: "the extended header", need, len: file_len });
        }
        u64_at(bytes, 32)
    } else {
        0
    };
    Ok(Some(ExtendedHeader {
        length,
        program_size: u64_at(bytes, 16),
        segment_base_offset: u64_at(bytes, 24),
        segment_data_size,
    }))
}

/// `offset + size`, checked against overflow and against `limit`.
pub(crate) fn checked_end(
    what: &str,
    offset: u64,
    size: u64,
    limit: u64,
    limit_what: &'static str,
) -> Result<u64, Error> {
    let end = offset.checked_add(size).ok_or_else(|| Error::ExtentOverflow {
        what: what.to_owned(),
        offset,
        size,
    })?;
    if end > limit {
        return Err(Error::OutOfBounds { what: what.to_owned(), offset, size, limit_what, limit });
    }
    Ok(end)
}
