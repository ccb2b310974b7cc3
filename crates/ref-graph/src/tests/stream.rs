//! A graph read with its constants left in their section ([`Graph::from_description_extents`]) and its
//! payload streamed from there ([`Graph::write_payload`]): what `delegate-pack` writes without holding the
//! weights must be what [`Graph::encode`] writes with them.

use std::io::Cursor;

use super::*;

/// Constants of every element type, sized so that most need padding to [`CONSTANT_ALIGN`], one larger than
/// the 1 MiB the payload is copied by, each read by an op (`emb` gathered, the rest cast and added).
fn every_dtype() -> Graph {
    let mut b = GraphBuilder::new();
    let tokens = b.input("tokens", ElemType::I64, &[1]).expect("fresh");
    let big: Vec<f32> = (0..300_001).map(|i| i as f32 * 0.5 - 7.0).collect();
    let emb = b.constant_f32("emb", &[300_001, 1], big).expect("sized");
    let h = b.constant_f16("h", &[3], vec![half::f16::from_f32(1.5), half::f16::INFINITY, half::f16::MIN]);
    let bf = b.constant_bf16("bf", &[1], vec![half::bf16::from_f32(-2.25)]).expect("sized");
    let ids = b.constant_i64("ids", &[1], vec![-3]).expect("sized");
    let (h, row) = (h.expect("sized"), b.gather("row", emb, tokens).expect("typed"));
    let h32 = b.cast("h32", h, ElemType::F32).expect("typed");
    let bf32 = b.cast("bf32", bf, ElemType::F32).expect("typed");
    let sum = b.add("sum", h32, bf32).expect("typed");
    let mixed = b.add("mixed", row, sum).expect("broadcasts");
    let next = b.add("next", tokens, ids).expect("typed");
    b.output(mixed).expect("declared");
    b.output(next).expect("declared");
    b.finish().expect("valid")
}

/// `graph`'s payload split as an exporter gives it: (JSON description, constant section).
fn split(payload: &[u8]) -> (&[u8], &[u8]) {
    let json_len = u32::from_le_bytes(payload[8..12].try_into().expect("4 bytes")) as usize;
    let section = (16 + json_len).div_ceil(16) * 16;
    (&payload[16..16 + json_len], &payload[section..])
}

#[test]
fn a_payload_streamed_from_its_section_is_the_encoded_payload() {
    let graph = every_dtype();
    let payload = graph.encode();
    let (description, section) = split(&payload);
    let outline = Graph::from_description_extents(description, section.len() as u64).expect("valid");
    let extent = outline.constant(outline.find("emb").expect("declared")).expect("a constant");
    assert_eq!((extent.offset(), extent.nbytes()), (0, 300_001 * 4));
    let mut streamed = Vec::new();
    outline.write_payload(&mut Cursor::new(section), &mut streamed).expect("written");
    assert_eq!(streamed.len(), payload.len());
    assert!(streamed == payload, "the streamed payload differs from the encoded one");
    assert!(
        Graph::decode(&streamed).expect("decodes") == graph,
        "the streamed payload decodes to another graph"
    );
}

#[test]
fn extents_are_checked_against_the_section_as_values_are() {
    let payload = every_dtype().encode();
    let (description, section) = split(&payload);
    let short = &section[..section.len() - 1];
    let by_values = Graph::from_description(description, short).expect_err("the last constant overruns");
    let by_extents = Graph::from_description_extents(description, short.len() as u64).expect_err("overruns");
    assert_eq!(by_extents.to_string(), by_values.to_string());
    assert!(by_extents.to_string().contains("the constant section holds only"), "{by_extents}");
}

/// The section is read when the payload is written, after the graph was checked against its length: one
/// shorter by then is an error naming the constant it cuts, never a short payload.
#[test]
fn a_section_cut_after_the_graph_was_read_is_an_error_naming_the_constant() {
    let payload = every_dtype().encode();
    let (description, section) = split(&payload);
    let outline = Graph::from_description_extents(description, section.len() as u64).expect("valid");
    let mut out = Vec::new();
    let cut = &section[..1000];
    let err = outline.write_payload(&mut Cursor::new(cut), &mut out).expect_err("the section ends early");
    let StreamError::Section { name, offset, nbytes, source } = &err else {
        panic!("not a section error: {err}")
    };
    assert_eq!((name.as_str(), *offset, *nbytes), ("emb", 0, 300_001 * 4));
    assert_eq!(source.kind(), std::io::ErrorKind::UnexpectedEof);
    assert_eq!(et_error::HasErrorCode::error_code(&err), et_error::ErrorCode::AccessFailed);
}
