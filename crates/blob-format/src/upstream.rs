//! Upstream Torch-TensorRT blobs: `TR01` (2.13+) and `TR02` (2.14, aliased I/O), read and written with
//! upstream's exact semantics.
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | magic `TR01` or `TR02` |
//! | 4 | 4 | u32 LE `metadata_offset` (written 32) |
//! | 8 | 4 | u32 LE `metadata_size` |
//! | 12 | 4 | u32 LE `engine_offset` (written: metadata end rounded up to 16) |
//! | 16 | 8 | u64 LE `engine_size` |
//! | 24 | 8 | reserved (written `01 00 00 00 00 00 00 00`, never read) |
//!
//! Then compact JSON metadata, zero padding, and the TensorRT engine plan.
//!
//! Reading: the JSON is parsed by a real parser (`serde_json`), so `\uXXXX` escapes decode and a binding
//! literally named `aliased_io` or `device_id` is just a name. A missing `aliased_io` means no aliases, a
//! missing (or `null`) `kind` means `kv_cache_update`, an empty `dtype` or `shape` means "not recorded"
//! (`None`). `io_bindings` and each binding's `name` and `is_input` are required; `hardware_compatible`,
//! `device_id`, `serialized_metadata` and `target_platform` default to `false`, `0`, `""`, `""`; unknown keys
//! are ignored. Every extent is checked with overflow-free arithmetic: the metadata and the engine lie inside
//! the blob, and the engine starts at or after the metadata's end. Bytes after the engine are ignored.

use serde::Deserialize;

use crate::model::{
    Alias, AliasKind, Binding, DType, Dim, Format, Header, PayloadKind, Role, TENSORRT_BACKEND,
};
use crate::{checked_end, Blob, Error, WriteError};

/// Magic of Torch-TensorRT 2.13+ blobs (and 2.14 blobs without aliases).
pub const TR01: [u8; 4] = *b"TR01";
/// Magic of Torch-TensorRT 2.14 blobs with aliased I/O.
pub const TR02: [u8; 4] = *b"TR02";
/// Length of the fixed prefix; upstream's writer puts the metadata right after it.
pub const PREFIX_LEN: usize = 32;
/// The engine offset upstream writes is the metadata end rounded up to a multiple of this.
pub const ENGINE_ALIGN: u64 = 16;
/// The reserved bytes 24..32 as upstream's writer fills them.
pub const RESERVED: [u8; 8] = [1, 0, 0, 0, 0, 0, 0, 0];
/// Largest TR01/TR02 metadata a reader parses: 4 MiB, far above what Torch-TensorRT writes (a few KiB for
/// hundreds of bindings), so a hostile or corrupt blob cannot make a host spend seconds and gigabytes on JSON.
pub const MAX_METADATA_BYTES: u64 = 4 << 20;

#[derive(Deserialize)]
struct Metadata {
    io_bindings: Vec<JsonBinding>,
    #[serde(default)]
    aliased_io: Vec<JsonAlias>,
    #[serde(default)]
    hardware_compatible: bool,
    #[serde(default)]
    device_id: i64,
    #[serde(default)]
    serialized_metadata: String,
    #[serde(default)]
    target_platform: String,
}

#[derive(Deserialize)]
struct JsonBinding {
    name: String,
    #[serde(default)]
    dtype: String,
    #[serde(default)]
    shape: Vec<i64>,
    is_input: bool,
}

#[derive(Deserialize)]
struct JsonAlias {
    output: String,
    input: String,
    #[serde(default)]
    kind: Option<String>,
}

/// Parses a `TR01` or `TR02` blob without touching the engine bytes (only the JSON metadata is read).
///
/// [`Blob::parse`] calls this for blobs starting with `TR01`/`TR02`; call it directly to refuse every other
/// format.
///
/// # Errors
/// [`Error::UnsupportedUpstream`] for another `TRxx` magic, [`Error::UnknownMagic`] for anything else, and the
/// malformed-blob errors ([`Error::Truncated`], [`Error::OutOfBounds`], [`Error::ExtentOverflow`],
/// [`Error::Layout`], [`Error::MetadataUtf8`], [`Error::MetadataJson`], [`Error::InvalidField`]).
pub fn parse(bytes: &[u8]) -> Result<Blob<'_>, Error> {
    let parts = parse_header(bytes, bytes.len() as u64)?;
    // `parse_header` checked the engine's extent against the blob's length, which is `bytes.len()`.
    let index = |at: u64| usize::try_from(at).expect("bounded by the slice length");
    let engine = &bytes[index(parts.engine_offset)..index(parts.engine_offset + parts.engine_size)];
    Ok(Blob {
        format: parts.format,
        header: parts.header,
        engine,
        engine_offset: parts.engine_offset,
        payload_xxh3: None,
    })
}

/// The fixed prefix's extents: `(metadata_offset, metadata_size, engine_offset, engine_size)`.
fn extents(first: &[u8]) -> Result<(Format, [u64; 4]), Error> {
    let format = match crate::detect(first)? {
        format @ (Format::Tr01 | Format::Tr02) => format,
        Format::Native { .. } => return Err(crate::unknown_magic(first)),
    };
    let prefix: &[u8; PREFIX_LEN] =
        first.get(..PREFIX_LEN).and_then(|p| p.try_into().ok()).ok_or(Error::Truncated {
            what: "TR01/TR02 prefix",
            need: PREFIX_LEN as u64,
            len: first.len() as u64,
        })?;
    let u32_at = |at: usize| {
        u64::from(u32::from_le_bytes([prefix[at], prefix[at + 1], prefix[at + 2], prefix[at + 3]]))
    };
    let mut engine_size = [0u8; 8];
    engine_size.copy_from_slice(&prefix[16..24]);
    Ok((format, [u32_at(4), u32_at(8), u32_at(12), u64::from_le_bytes(engine_size)]))
}

/// The bytes from the blob's start to its metadata's end, from its prefix; a metadata size above
/// [`MAX_METADATA_BYTES`] is refused here, before anything is read.
pub(crate) fn header_extent(first: &[u8]) -> Result<u64, Error> {
    let (_, [metadata_offset, metadata_size, ..]) = extents(first)?;
    check_metadata_size(metadata_size)?;
    Ok(metadata_offset + metadata_size)
}

fn check_metadata_size(metadata_size: u64) -> Result<(), Error> {
    if metadata_size > MAX_METADATA_BYTES {
        return Err(Error::Layout {
            problem: format!(
                "metadata of {metadata_size} bytes is more than the {MAX_METADATA_BYTES} a reader parses"
            ),
        });
    }
    Ok(())
}

/// [`parse`] of the header only: `head` is the blob's first bytes (at least the prefix and the metadata),
/// `blob_len` its whole length; the engine's extent is checked, never read.
pub(crate) fn parse_header(head: &[u8], blob_len: u64) -> Result<crate::HeaderOnly, Error> {
    let (format, [metadata_offset, metadata_size, engine_offset, engine_size]) = extents(head)?;
    if metadata_offset < PREFIX_LEN as u64 {
        return Err(Error::Layout {
            problem: format!("metadata_offset {metadata_offset} lies inside the {PREFIX_LEN}-byte prefix"),
        });
    }
    check_metadata_size(metadata_size)?;
    let metadata_end = checked_end("metadata", metadata_offset, metadata_size, blob_len)?;
    if engine_offset < metadata_end {
        return Err(Error::Layout {
            problem: format!(
                "engine_offset {engine_offset} lies before the end of the metadata at {metadata_end}"
            ),
        });
    }
    checked_end("engine", engine_offset, engine_size, blob_len)?;
    let range = usize::try_from(metadata_offset).ok().zip(usize::try_from(metadata_end).ok());
    let metadata = range.and_then(|(start, end)| head.get(start..end)).ok_or(Error::Truncated {
        what: "TR01/TR02 metadata",
        need: metadata_end,
        len: head.len() as u64,
    })?;

    let text = std::str::from_utf8(metadata).map_err(|source| Error::MetadataUtf8 {
        offset: metadata_offset + source.valid_up_to() as u64,
        source,
    })?;
    let json: Metadata = serde_json::from_str(text).map_err(|source| Error::MetadataJson { source })?;
    let header = to_model(json)?;
    Ok(crate::HeaderOnly { format, header, engine_offset, engine_size })
}

fn to_model(json: Metadata) -> Result<Header, Error> {
    let mut bindings = Vec::with_capacity(json.io_bindings.len());
    for (index, b) in json.io_bindings.into_iter().enumerate() {
        let dtype = match b.dtype.as_str() {
            "" => None,
            name => Some(DType::from_name(name).ok_or_else(|| Error::InvalidField {
                field: format!("io_bindings[{index}] '{}'.dtype", b.name),
                problem: format!("unknown dtype \"{}\"", name.escape_debug()),
            })?),
        };
        let shape = if b.shape.is_empty() {
            None
        } else {
            let mut dims = Vec::with_capacity(b.shape.len());
            for extent in b.shape {
                dims.push(match extent {
                    -1 => Dim::Dynamic,
                    n => Dim::Static(u64::try_from(n).map_err(|_| Error::InvalidField {
                        field: format!("io_bindings[{index}] '{}'.shape", b.name),
                        problem: format!("extent {n} is negative and not -1 (dynamic)"),
                    })?),
                });
            }
            Some(dims)
        };
        let role = if b.is_input { Role::Input } else { Role::Output };
        bindings.push(Binding { name: b.name, role, dtype, shape, threaded: true });
    }
    let aliases = json
        .aliased_io
        .into_iter()
        .map(|a| Alias {
            output: a.output,
            input: a.input,
            kind: a.kind.as_deref().map_or(AliasKind::KvCacheUpdate, AliasKind::from_wire),
        })
        .collect();
    // One rule with manifests: a CUDA device ordinal is 0 or more (and fits the ABI's 32 bits).
    let device_id =
        i32::try_from(json.device_id).ok().filter(|&d| d >= 0).ok_or_else(|| Error::InvalidField {
            field: "device_id".to_owned(),
            problem: format!("{} is not a CUDA device ordinal (0 to 2^31-1)", json.device_id),
        })?;
    Ok(Header {
        producer: None,
        backend_id: TENSORRT_BACKEND.to_owned(),
        payload_kind: PayloadKind::TensorRtPlan,
        bindings,
        aliases,
        device_id,
        hardware_compatible: json.hardware_compatible,
        hardware_target: Some(json.target_platform).filter(|s| !s.is_empty()),
        engine_library_version: None,
        engine_metadata: Some(json.serialized_metadata).filter(|s| !s.is_empty()),
    })
}

/// What writing `header` as TR01/TR02 would lose, one entry per field, each starting with the field's path
/// (e.g. `"producer: TR02 does not record the producing tool"`). Empty when [`write_tr02`] accepts it.
pub fn unrepresentable(header: &Header) -> Vec<String> {
    let mut losses = Vec::new();
    if let Some(producer) = &header.producer {
        losses.push(format!(
            "producer: TR02 does not record the producing tool ({} {})",
            producer.name, producer.version
        ));
    }
    if header.backend_id != TENSORRT_BACKEND {
        losses.push(format!(
            "backend_id: TR02 implies backend {TENSORRT_BACKEND}, this blob is for \"{}\"",
            header.backend_id.escape_debug()
        ));
    }
    if header.payload_kind != PayloadKind::TensorRtPlan {
        losses.push(format!(
            "payload_kind: TR02 carries a TensorRT plan, this payload is \"{}\"",
            header.payload_kind.as_str().escape_debug()
        ));
    }
    if let Some(version) = &header.engine_library_version {
        losses.push(format!(
            "engine_library_version: TR02 does not record it (\"{}\")",
            version.escape_debug()
        ));
    }
    for (index, b) in header.bindings.iter().enumerate() {
        if let Some(dtype) = b.dtype {
            losses.push(format!("bindings[{index}] '{}'.dtype: TR02 writes dtypes empty ({dtype})", b.name));
        }
        if let Some(shape) = &b.shape {
            losses.push(format!(
                "bindings[{index}] '{}'.shape: TR02 writes shapes empty ({})",
                b.name,
                crate::model::DisplayShape(shape)
            ));
        }
        if !b.threaded {
            losses.push(format!(
                "bindings[{index}] '{}'.threaded: TR02 threads every binding as a delegate argument",
                b.name
            ));
        }
    }
    if let Some(first_output) = header.bindings.iter().position(|b| b.role == Role::Output) {
        if let Some(late) = header.bindings[first_output..].iter().find(|b| b.role == Role::Input) {
            losses.push(format!(
                "bindings: TR02 lists all inputs before all outputs, input '{}' follows output '{}'",
                late.name, header.bindings[first_output].name
            ));
        }
    }
    losses
}

/// Writes `header` and `engine` byte-for-byte as Torch-TensorRT 2.14's serializer does: magic `TR02` when
/// there are aliases, else `TR01`; metadata at offset 32 as compact JSON (Python `json.dumps` spelling:
/// upstream's key order, non-ASCII escaped as `\uXXXX`); the engine at the metadata end rounded up to 16.
/// Upstream's reader accepts the output unchanged.
///
/// # Errors
/// [`WriteError::Unrepresentable`] listing every field TR02 cannot express (see [`unrepresentable`]);
/// [`WriteError::TooLarge`] when the metadata exceeds the 32-bit offsets.
pub fn write_tr02(header: &Header, engine: &[u8]) -> Result<Vec<u8>, WriteError> {
    let losses = unrepresentable(header);
    if !losses.is_empty() {
        return Err(WriteError::Unrepresentable { format: "TR02", losses });
    }
    let json = metadata_json(header);
    let too_large =
        |what, size: u64| WriteError::TooLarge { format: "TR02", what, size, limit: u64::from(u32::MAX) };
    let metadata_size = u32::try_from(json.len()).map_err(|_| too_large("metadata", json.len() as u64))?;
    let metadata_end = PREFIX_LEN as u64 + u64::from(metadata_size);
    let engine_offset_wide = metadata_end.div_ceil(ENGINE_ALIGN) * ENGINE_ALIGN;
    let engine_offset =
        u32::try_from(engine_offset_wide).map_err(|_| too_large("metadata", json.len() as u64))?;
    let magic = if header.aliases.is_empty() { TR01 } else { TR02 };

    let mut out = Vec::with_capacity(engine_offset as usize + engine.len());
    out.extend_from_slice(&magic);
    out.extend_from_slice(&(PREFIX_LEN as u32).to_le_bytes());
    out.extend_from_slice(&metadata_size.to_le_bytes());
    out.extend_from_slice(&engine_offset.to_le_bytes());
    out.extend_from_slice(&(engine.len() as u64).to_le_bytes());
    out.extend_from_slice(&RESERVED);
    out.extend_from_slice(json.as_bytes());
    out.resize(engine_offset as usize, 0);
    out.extend_from_slice(engine);
    Ok(out)
}

/// The metadata JSON exactly as Python's `json.dumps(obj, separators=(",", ":"))` spells upstream's dict.
fn metadata_json(header: &Header) -> String {
    let mut out = String::with_capacity(256);
    out.push_str("{\"io_bindings\":[");
    for (i, b) in header.bindings.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str("{\"name\":");
        push_json_str(&mut out, &b.name);
        out.push_str(",\"dtype\":\"\",\"shape\":[],\"is_input\":");
        out.push_str(if b.role == Role::Input { "true" } else { "false" });
        out.push('}');
    }
    out.push_str("],\"aliased_io\":[");
    for (i, a) in header.aliases.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str("{\"output\":");
        push_json_str(&mut out, &a.output);
        out.push_str(",\"input\":");
        push_json_str(&mut out, &a.input);
        out.push_str(",\"kind\":");
        push_json_str(&mut out, a.kind.as_str());
        out.push('}');
    }
    out.push_str("],\"hardware_compatible\":");
    out.push_str(if header.hardware_compatible { "true" } else { "false" });
    out.push_str(",\"device_id\":");
    out.push_str(&header.device_id.to_string());
    out.push_str(",\"serialized_metadata\":");
    push_json_str(&mut out, header.engine_metadata.as_deref().unwrap_or_default());
    out.push_str(",\"target_platform\":");
    push_json_str(&mut out, header.hardware_target.as_deref().unwrap_or_default());
    out.push('}');
    out
}

/// A JSON string as Python's `json.dumps` (`ensure_ascii=True`) writes it: `\"`, `\\`, `\n`, `\r`, `\t`,
/// `\b`, `\f`, and every other character outside printable ASCII as `\uXXXX` (UTF-16, lowercase hex).
fn push_json_str(out: &mut String, text: &str) {
    use std::fmt::Write as _;
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    write!(out, "\\u{unit:04x}").expect("writing to a String cannot fail");
                }
            }
        }
    }
    out.push('"');
}
