//! Payload 1.4: `causal_attention`'s `softcap` (Gemma 2's logit soft-capping) is typed, round trips, and is
//! written as 1.4 only when present.

use crate::*;

use ElemType::{F32, I64};

/// One attention layer over `[1, 2, 8, 4]` caches with `options`.
fn layer(options: AttentionOptions) -> Result<Graph, Error> {
    let mut b = GraphBuilder::new();
    let pos = b.input("pos", I64, &[1])?;
    let kc = b.input("kc", F32, &[1, 2, 8, 4])?;
    let vc = b.input("vc", F32, &[1, 2, 8, 4])?;
    let (u, q) = (b.input("u", F32, &[1, 2, 3, 4])?, b.input("q", F32, &[1, 4, 3, 4])?);
    let k = b.kv_cache_update("k", kc, u, pos)?;
    let v = b.kv_cache_update("v", vc, u, pos)?;
    let out = b.causal_attention_with("attn", [q, k, v, pos], options)?;
    b.output(out)?;
    b.finish()
}

#[test]
fn a_soft_capped_attention_round_trips_as_1_4() {
    let graph = layer(AttentionOptions { scale: Some(0.25), softcap: Some(50.0) }).expect("valid");
    assert_eq!(graph.payload_version(), (1, 4));
    assert_eq!(PAYLOAD_VERSION_MINOR, 4);
    let payload = graph.encode();
    assert_eq!(u16::from_le_bytes([payload[6], payload[7]]), 4);
    let json = String::from_utf8_lossy(&payload[16..]);
    assert!(json.contains(r#""softcap":50.0"#), "the payload spells it");
    // Under another op name: a 1.3 reader ignores unknown fields, so it must refuse the op instead.
    assert!(json.contains(r#""op":"causal_attention_softcapped""#), "{json}");
    assert!(!crate::ops::OP_NAMES.contains(&"causal_attention_softcapped"), "not a name a 1.3 reader knows");
    let decoded = Graph::decode(&payload).expect("valid payload");
    assert_eq!(decoded, graph);
    assert!(matches!(decoded.ops()[2], Op::CausalAttention { softcap: Some(c), .. } if c == 50.0));
}

#[test]
fn without_a_cap_the_graph_keeps_its_older_version() {
    let scaled = layer(AttentionOptions { scale: Some(0.25), softcap: None }).expect("valid");
    assert_eq!(scaled.payload_version(), (1, PAYLOAD_MINOR_DECODER_OPS));
    assert!(!String::from_utf8_lossy(&scaled.encode()[16..]).contains("softcap"), "absent means absent");
}

#[test]
fn a_cap_that_is_not_finite_and_positive_is_refused_by_name() {
    for softcap in [0.0, -30.0, f32::NAN, f32::INFINITY] {
        let message =
            layer(AttentionOptions { scale: None, softcap: Some(softcap) }).expect_err("refused").to_string();
        assert!(
            message
                .ends_with(&format!("attribute 'softcap' is {softcap}, expected a finite positive number")),
            "{message}"
        );
        assert!(message.contains("causal_attention"), "{message}");
    }
}

#[test]
fn a_decoded_cap_is_checked_too() {
    let graph = layer(AttentionOptions { scale: None, softcap: Some(30.0) }).expect("valid");
    let payload = graph.encode();
    // The same length, so the JSON length in the prefix still holds.
    let needle = br#""softcap":30.0"#;
    let at = payload.windows(needle.len()).position(|w| w == needle).expect("spelled");
    let mut bad = payload.clone();
    bad[at..at + needle.len()].copy_from_slice(br#""softcap":-3.0"#);
    let message = Graph::decode(&bad).expect_err("refused").to_string();
    assert!(message.contains("attribute 'softcap' is -3"), "{message}");
}

#[test]
fn a_softcapped_attention_without_its_cap_is_malformed() {
    let graph = layer(AttentionOptions { scale: None, softcap: Some(30.0) }).expect("valid");
    let payload = graph.encode();
    // The same length, so the JSON length in the prefix still holds.
    let needle = br#""softcap":30.0"#;
    let at = payload.windows(needle.len()).position(|w| w == needle).expect("spelled");
    let mut bad = payload.clone();
    bad[at..at + needle.len()].copy_from_slice(br#""softcaq":30.0"#);
    let message = Graph::decode(&bad).expect_err("refused").to_string();
    assert!(message.contains("(causal_attention_softcapped): it has no attribute 'softcap'"), "{message}");
}
