//! Shared test data: the KV decoder `.pte` around a native blob, and byte-patching helpers.
#![allow(dead_code)]

use blob_format::model::{Alias, AliasKind, Binding, DType, Dim, Header, PayloadKind, Producer, Role};
use pte_format::testing;

/// The native blob the KV decoder's delegate carries: bindings in delegate-argument order (the
/// DelegateCall's args), and the two KV aliases.
pub fn kv_blob_header() -> Header {
    Header {
        producer: Some(Producer { name: "pte-format tests".into(), version: "0.1.0".into() }),
        backend_id: testing::kv::BACKEND.into(),
        payload_kind: PayloadKind::ReferenceGraph,
        bindings: vec![
            typed("input_pos", Role::Input, DType::I64, &[1]),
            typed("tokens", Role::Input, DType::I64, &[1, 1]),
            typed("k_cache", Role::Input, DType::F32, &[1, 2, 16, 8]),
            typed("v_cache", Role::Input, DType::F32, &[1, 2, 16, 8]),
            typed("k_cache_out", Role::Output, DType::F32, &[1, 2, 16, 8]),
            typed("v_cache_out", Role::Output, DType::F32, &[1, 2, 16, 8]),
            typed("logits", Role::Output, DType::F32, &[1, 1, 32]),
        ],
        aliases: vec![
            Alias { output: "k_cache_out".into(), input: "k_cache".into(), kind: AliasKind::KvCacheUpdate },
            Alias { output: "v_cache_out".into(), input: "v_cache".into(), kind: AliasKind::KvCacheUpdate },
        ],
        device_id: 0,
        hardware_compatible: false,
        hardware_target: None,
        engine_library_version: None,
        engine_metadata: None,
    }
}

fn typed(name: &str, role: Role, dtype: DType, shape: &[u64]) -> Binding {
    Binding {
        name: name.into(),
        role,
        dtype: Some(dtype),
        shape: Some(shape.iter().map(|&d| Dim::Static(d)).collect()),
        threaded: true,
    }
}

/// The blob's bytes: a native blob with a 300-byte payload.
pub fn kv_blob() -> Vec<u8> {
    let engine: Vec<u8> = (0..300u32).map(|i| (i * 7) as u8).collect();
    blob_format::native::to_vec(&kv_blob_header(), &engine)
}

/// The KV decoder `.pte`.
pub fn kv_pte() -> Vec<u8> {
    testing::kv_decoder(&kv_blob())
}

pub fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

pub fn set_u32(bytes: &mut [u8], at: usize, value: u32) {
    bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

pub fn set_u64(bytes: &mut [u8], at: usize, value: u64) {
    bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
}

/// Replaces the one occurrence of the u64 `old` inside the program data (bytes 40..program_size) with
/// `value`; panics unless it occurs exactly once.
pub fn patch_program_u64(bytes: &mut [u8], old: u64, value: u64) {
    let program_size = u64_at(bytes, 16) as usize;
    let hits: Vec<usize> = (40..program_size - 7).filter(|&at| u64_at(bytes, at) == old).collect();
    assert_eq!(hits.len(), 1, "{old} occurs once in the program data: {hits:?}");
    set_u64(bytes, hits[0], value);
}

/// The same program without its extended header and segment data, as if written by a tool that puts
/// segments in the table but never inserts the header.
pub fn strip_header(bytes: &[u8]) -> Vec<u8> {
    let program_size = u64_at(bytes, 16) as usize;
    let root = u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes"));
    let mut out = Vec::new();
    out.extend_from_slice(&(root - 32).to_le_bytes());
    out.extend_from_slice(&bytes[4..8]);
    out.extend_from_slice(&bytes[40..program_size]);
    out
}
