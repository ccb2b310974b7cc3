//! Forward compatibility: a header written by a future 1.x writer, with fields this build does not know.

use flatbuffers::{FlatBufferBuilder, WIPOffset};

use super::{encode_head, parse, PayloadLocation};
use crate::generated::v1 as fb;
use crate::model::{Alias, AliasKind, Binding, Format, Header, PayloadKind, Producer, Role};

/// The next free vtable slot of a table whose last known field sits at `last`.
const fn next_slot(last: flatbuffers::VOffsetT) -> flatbuffers::VOffsetT {
    last + 2
}

/// Builds a 1.x header the way a future writer would: every 1.0 field plus unknown ones appended to `Header`
/// and to `Producer` (the schema's append-only rule), each ignored by this reader.
fn future_header(location: PayloadLocation) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let producer_name = fbb.create_string("future exporter");
    let producer_version = fbb.create_string("9.1");
    let producer_extra = fbb.create_string("a field added in 1.1");
    let start = fbb.start_table();
    fbb.push_slot_always(fb::Producer::VT_NAME, producer_name);
    fbb.push_slot_always(fb::Producer::VT_VERSION, producer_version);
    fbb.push_slot_always(next_slot(fb::Producer::VT_VERSION), producer_extra);
    let producer: WIPOffset<fb::Producer> = WIPOffset::new(fbb.end_table(start).value());

    let backend_id = fbb.create_string("ReferenceBackend");
    let kind = fbb.create_string("reference-graph");
    let payload = fb::Payload::create(
        &mut fbb,
        &fb::PayloadArgs {
            kind: Some(kind),
            offset: location.offset,
            size: location.size,
            xxh3: location.xxh3,
        },
    );
    let name_in = fbb.create_string("x");
    let input = fb::Binding::create(&mut fbb, &fb::BindingArgs { name: Some(name_in), ..Default::default() });
    let name_out = fbb.create_string("y");
    let output = fb::Binding::create(
        &mut fbb,
        &fb::BindingArgs { name: Some(name_out), role: fb::Role::Output, ..Default::default() },
    );
    let bindings = fbb.create_vector(&[input, output]);
    let (alias_out, alias_in) = (fbb.create_string("y"), fbb.create_string("x"));
    let alias = fb::Alias::create(
        &mut fbb,
        &fb::AliasArgs { output: Some(alias_out), input: Some(alias_in), kind: None },
    );
    let aliases = fbb.create_vector(&[alias]);
    let extra_string = fbb.create_string("unknown to 1.0 readers");
    let extra_vector = fbb.create_vector(&[1u32, 2, 3]);

    let start = fbb.start_table();
    fbb.push_slot_always(fb::Header::VT_PRODUCER, producer);
    fbb.push_slot_always(fb::Header::VT_BACKEND_ID, backend_id);
    fbb.push_slot_always(fb::Header::VT_PAYLOAD, payload);
    fbb.push_slot_always(fb::Header::VT_BINDINGS, bindings);
    fbb.push_slot_always(fb::Header::VT_ALIASES, aliases);
    fbb.push_slot::<i32>(fb::Header::VT_DEVICE_ID, 3, 0);
    let first_new = next_slot(fb::Header::VT_ENGINE_METADATA);
    fbb.push_slot_always(first_new, extra_string);
    fbb.push_slot::<u64>(next_slot(first_new), 0xdead_beef, 0);
    fbb.push_slot_always(next_slot(next_slot(first_new)), extra_vector);
    let root = fbb.end_table(start);
    fbb.finish(root, Some("DLBH"));
    fbb.finished_data().to_vec()
}

#[test]
fn newer_minor_reads_with_unknown_fields_ignored() {
    let engine = b"graph bytes".to_vec();
    let mut bytes = encode_head((1, 7), &engine, future_header);
    bytes.extend_from_slice(&engine);

    let blob = parse(&bytes).expect("a 1.7 blob reads in a 1.0 build");
    assert_eq!(blob.format, Format::Native { major: 1, minor: 7 });
    assert_eq!(
        blob.header,
        Header {
            producer: Some(Producer { name: "future exporter".into(), version: "9.1".into() }),
            backend_id: "ReferenceBackend".into(),
            payload_kind: PayloadKind::ReferenceGraph,
            bindings: vec![Binding::untyped("x", Role::Input), Binding::untyped("y", Role::Output)],
            aliases: vec![Alias { output: "y".into(), input: "x".into(), kind: AliasKind::KvCacheUpdate }],
            device_id: 3,
            hardware_compatible: false,
            hardware_target: None,
            engine_library_version: None,
            engine_metadata: None,
        }
    );
    assert_eq!(blob.engine, engine.as_slice());
    blob.verify_payload().expect("payload checksum recorded by the future writer");
}

#[test]
fn newer_major_is_refused_naming_both_versions() {
    let engine = b"graph".to_vec();
    let mut bytes = encode_head((2, 3), &engine, future_header);
    bytes.extend_from_slice(&engine);
    let err = crate::Blob::parse(&bytes).expect_err("2.3 is newer than this build");
    assert_eq!(
        err.to_string(),
        "native blob format 2.3 is newer than this build reads (1.x); upgrade delegate-host"
    );
    assert_eq!(et_error::HasErrorCode::error_code(&err), et_error::ErrorCode::DelegateInvalidCompatibility);
}
