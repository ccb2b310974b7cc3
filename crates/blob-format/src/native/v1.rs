//! Native format major 1: reads every 1.x header into the model, and writes 1.0.

use flatbuffers::{FlatBufferBuilder, VerifierOptions, WIPOffset};
use xxhash_rust::xxh3::xxh3_64;

use super::{format_of, PayloadLocation, Prefix, PAYLOAD_ALIGN, PREFIX_LEN};
use crate::generated::v1 as fb;
use crate::model::{Alias, AliasKind, Binding, DType, Dim, Header, PayloadKind, Producer, Role};
use crate::{checked_end, Blob, Error};

/// The FlatBuffers file identifier of a 1.x header.
pub(crate) const IDENTIFIER: &[u8; 4] = b"DLBH";

/// Verifier limits: far above any real header, low enough that hostile input cannot make verification slow.
fn verifier_options() -> VerifierOptions {
    VerifierOptions {
        max_depth: 16,
        max_tables: 1 << 20,
        max_apparent_size: 1 << 31,
        ignore_missing_null_terminator: false,
    }
}

pub(super) fn read<'a>(bytes: &'a [u8], prefix: &Prefix) -> Result<Blob<'a>, Error> {
    let (header, location) = read_header(bytes, bytes.len() as u64, prefix)?;
    // `read_header` checked the payload's extent against the blob's length, which is `bytes.len()`.
    let payload_end = location.offset + location.size;
    let engine = &bytes[to_usize(location.offset)?..to_usize(payload_end)?];
    Ok(Blob {
        format: format_of(prefix.major, prefix.minor),
        header,
        engine,
        engine_offset: location.offset,
        payload_xxh3: Some(location.xxh3),
    })
}

/// Reads the header from `head`, the first bytes of a blob of `blob_len` bytes (all of them, or at least the
/// prefix and the header), checking the payload's extent against `blob_len` without touching it.
pub(super) fn read_header(
    head: &[u8],
    blob_len: u64,
    prefix: &Prefix,
) -> Result<(Header, PayloadLocation), Error> {
    let header_offset = u64::from(prefix.header_offset);
    let header_len = u64::from(prefix.header_len);
    if header_offset < PREFIX_LEN as u64 {
        return Err(Error::Layout {
            problem: format!("native header offset {header_offset} lies inside the {PREFIX_LEN}-byte prefix"),
        });
    }
    let header_end = checked_end("native header", header_offset, header_len, blob_len)?;
    let header_bytes = head.get(to_usize(header_offset)?..to_usize(header_end)?).ok_or(Error::Truncated {
        what: "native header",
        need: header_end,
        len: head.len() as u64,
    })?;
    let computed = xxh3_64(header_bytes);
    if computed != prefix.header_xxh3 {
        return Err(Error::HeaderChecksum { stored: prefix.header_xxh3, computed });
    }
    if header_bytes.get(4..8) != Some(IDENTIFIER.as_slice()) {
        return Err(Error::InvalidHeader {
            detail: format!(
                "missing file identifier \"{}\" (found \"{}\")",
                IDENTIFIER.escape_ascii(),
                header_bytes.get(4..8).unwrap_or_default().escape_ascii()
            ),
        });
    }
    let root = fb::root_as_header_with_opts(&verifier_options(), header_bytes)
        .map_err(|err| Error::InvalidHeader { detail: one_line(&err.to_string()) })?;

    let payload = root.payload();
    let location = PayloadLocation { offset: payload.offset(), size: payload.size(), xxh3: payload.xxh3() };
    if location.offset % PAYLOAD_ALIGN != 0 {
        return Err(Error::Layout {
            problem: format!(
                "engine payload offset {} is not a multiple of {PAYLOAD_ALIGN}",
                location.offset
            ),
        });
    }
    if location.offset < header_end {
        return Err(Error::Layout {
            problem: format!(
                "engine payload offset {} lies before the end of the native header at {header_end}",
                location.offset
            ),
        });
    }
    checked_end("engine payload", location.offset, location.size, blob_len)?;
    Ok((to_model(&root)?, location))
}

/// A blob offset as an index; it is at most the blob's length, so it fits on every platform.
fn to_usize(offset: u64) -> Result<usize, Error> {
    usize::try_from(offset).map_err(|_| Error::Layout {
        problem: format!("offset {offset} does not fit this platform's address space"),
    })
}

/// The verifier's message (which appends a multi-line trace) on one line.
fn one_line(message: &str) -> String {
    message.split('\n').map(str::trim).filter(|line| !line.is_empty()).collect::<Vec<_>>().join("; ")
}

fn non_empty(text: Option<&str>) -> Option<String> {
    text.filter(|t| !t.is_empty()).map(str::to_owned)
}

fn to_model(root: &fb::Header<'_>) -> Result<Header, Error> {
    let device_id = root.device_id();
    if device_id < 0 {
        return Err(Error::InvalidField {
            field: "device_id".to_owned(),
            problem: format!("{device_id} is not a CUDA device ordinal (0 or more)"),
        });
    }
    let producer =
        root.producer().map(|p| Producer { name: p.name().to_owned(), version: p.version().to_owned() });
    let mut bindings = Vec::new();
    for (index, binding) in root.bindings().iter().flatten().enumerate() {
        let role = match binding.role() {
            fb::Role::Input => Role::Input,
            fb::Role::Output => Role::Output,
            fb::Role(code) => {
                return Err(Error::InvalidField {
                    field: format!("bindings[{index}] '{}'.role", binding.name()),
                    problem: format!("unknown role code {code} (0 = input, 1 = output)"),
                })
            }
        };
        let dtype = match binding.dtype() {
            None => None,
            Some(name) => Some(DType::from_name(name).ok_or_else(|| Error::InvalidField {
                field: format!("bindings[{index}] '{}'.dtype", binding.name()),
                problem: format!("unknown dtype \"{}\"", name.escape_debug()),
            })?),
        };
        let shape = binding.shape().map(|dims| {
            dims.iter().map(|d| if d.dynamic() { Dim::Dynamic } else { Dim::Static(d.extent()) }).collect()
        });
        bindings.push(Binding {
            name: binding.name().to_owned(),
            role,
            dtype,
            shape,
            threaded: binding.threaded(),
        });
    }
    let aliases = root
        .aliases()
        .iter()
        .flatten()
        .map(|a| Alias {
            output: a.output().to_owned(),
            input: a.input().to_owned(),
            kind: a.kind().map_or(AliasKind::KvCacheUpdate, AliasKind::from_wire),
        })
        .collect();
    Ok(Header {
        producer,
        backend_id: root.backend_id().to_owned(),
        payload_kind: PayloadKind::from_wire(root.payload().kind()),
        bindings,
        aliases,
        device_id,
        hardware_compatible: root.hardware_compatible(),
        hardware_target: non_empty(root.hardware_target()),
        engine_library_version: root.engine_library_version().map(str::to_owned),
        engine_metadata: non_empty(root.engine_metadata()),
    })
}

/// Encodes `header` as a finished 1.0 FlatBuffers header recording the payload at `location`.
pub(super) fn encode_header(header: &Header, location: PayloadLocation) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::with_capacity(1024);
    let root = build_header(&mut fbb, header, location);
    fb::finish_header_buffer(&mut fbb, root);
    fbb.finished_data().to_vec()
}

fn build_header<'a>(
    fbb: &mut FlatBufferBuilder<'a>,
    header: &Header,
    location: PayloadLocation,
) -> WIPOffset<fb::Header<'a>> {
    let producer = header.producer.as_ref().map(|p| build_producer(fbb, p));
    let backend_id = fbb.create_string(&header.backend_id);
    let payload = build_payload(fbb, header, location);
    let bindings: Vec<_> = header.bindings.iter().map(|b| build_binding(fbb, b)).collect();
    let bindings = fbb.create_vector(&bindings);
    let aliases: Vec<_> = header.aliases.iter().map(|a| build_alias(fbb, a)).collect();
    let aliases = fbb.create_vector(&aliases);
    let hardware_target = header.hardware_target.as_deref().map(|s| fbb.create_string(s));
    let engine_library_version = header.engine_library_version.as_deref().map(|s| fbb.create_string(s));
    let engine_metadata = header.engine_metadata.as_deref().map(|s| fbb.create_string(s));
    fb::Header::create(
        fbb,
        &fb::HeaderArgs {
            producer,
            backend_id: Some(backend_id),
            payload: Some(payload),
            bindings: Some(bindings),
            aliases: Some(aliases),
            device_id: header.device_id,
            hardware_compatible: header.hardware_compatible,
            hardware_target,
            engine_library_version,
            engine_metadata,
        },
    )
}

fn build_producer<'a>(fbb: &mut FlatBufferBuilder<'a>, producer: &Producer) -> WIPOffset<fb::Producer<'a>> {
    let args = fb::ProducerArgs {
        name: Some(fbb.create_string(&producer.name)),
        version: Some(fbb.create_string(&producer.version)),
    };
    fb::Producer::create(fbb, &args)
}

fn build_payload<'a>(
    fbb: &mut FlatBufferBuilder<'a>,
    header: &Header,
    location: PayloadLocation,
) -> WIPOffset<fb::Payload<'a>> {
    let kind = fbb.create_string(header.payload_kind.as_str());
    let args = fb::PayloadArgs {
        kind: Some(kind),
        offset: location.offset,
        size: location.size,
        xxh3: location.xxh3,
    };
    fb::Payload::create(fbb, &args)
}

fn build_binding<'a>(fbb: &mut FlatBufferBuilder<'a>, binding: &Binding) -> WIPOffset<fb::Binding<'a>> {
    let name = fbb.create_string(&binding.name);
    let dtype = binding.dtype.map(|d| fbb.create_string(d.name()));
    let shape = binding.shape.as_ref().map(|dims| {
        let dims: Vec<fb::Dim> = dims
            .iter()
            .map(|d| match d {
                Dim::Static(extent) => fb::Dim::new(*extent, false),
                Dim::Dynamic => fb::Dim::new(0, true),
            })
            .collect();
        fbb.create_vector(&dims)
    });
    let role = match binding.role {
        Role::Input => fb::Role::Input,
        Role::Output => fb::Role::Output,
    };
    fb::Binding::create(
        fbb,
        &fb::BindingArgs { name: Some(name), role, dtype, shape, threaded: binding.threaded },
    )
}

fn build_alias<'a>(fbb: &mut FlatBufferBuilder<'a>, alias: &Alias) -> WIPOffset<fb::Alias<'a>> {
    let args = fb::AliasArgs {
        output: Some(fbb.create_string(&alias.output)),
        input: Some(fbb.create_string(&alias.input)),
        kind: Some(fbb.create_string(alias.kind.as_str())),
    };
    fb::Alias::create(fbb, &args)
}
