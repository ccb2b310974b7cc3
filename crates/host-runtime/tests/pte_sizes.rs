//! Issue 17, item 12: a `.pte` tensor's size goes through the same checked product as a TOML manifest's, so a
//! shape whose size in bytes overflows is a typed error naming the tensor, never an overflow panic (debug) or
//! a wrapped size and a too-small allocation (release).

#[path = "support/kv_pte.rs"]
mod kv_pte;

use blob_format::model::Dim;
use blob_format::Blob;
use delegate_abi::host::HostConfig;
use et_error::{ErrorCode, HasErrorCode};
use host_runtime::plugins::{Discovery, Registry};
use host_runtime::program::Mode;
use host_runtime::pte;
use pte_format::testing::{ProgramSpec, ValueSpec};

/// 2^64 elements: every size fits ExecuTorch's `i32`, their product does not fit 64 bits.
const HUGE: [i32; 4] = [1 << 16; 4];

/// The one-method program with value `value` of shape [`HUGE`], and the delegate's blob binding `binding`
/// declaring the same shape, so that every check of the call's arguments against the blob agrees and only
/// the size is wrong.
fn huge(value: usize, binding: &str) -> ProgramSpec {
    let mut spec = kv_pte::spec(false);
    let ValueSpec::Tensor(tensor) = &mut spec.methods[0].values[value] else { panic!("value {value}") };
    tensor.sizes = HUGE.to_vec();
    let blob = Blob::parse(&spec.segments[1]).expect("the example blob");
    let mut header = blob.header.clone();
    let b = header.bindings.iter_mut().find(|b| b.name == binding).expect("binding");
    b.shape = Some(HUGE.iter().map(|&d| Dim::Static(d as u64)).collect());
    spec.segments[1] = blob_format::native::to_vec(&header, blob.engine);
    spec
}

/// The reference delegate embedded, as `delegate-host` ships it.
fn registry() -> Registry {
    Registry::discover(Discovery::new())
        .with_embedded(reference_delegate::delegate_root(), &HostConfig::default())
}

#[test]
fn a_tensor_whose_size_overflows_is_refused_naming_it() {
    let registry = registry();
    for (value, binding, what) in [
        (0, "tokens", "input 0 (value 0): '0' (i64 [65536, 65536, 65536, 65536])"),
        (6, "logits", "output 0 (value 8): '0' (f32 [65536, 65536, 65536, 65536])"),
    ] {
        let mut spec = huge(value, binding);
        if value == 6 {
            // The method output is the clone of the delegate's logits: both have the shape.
            let ValueSpec::Tensor(out) = &mut spec.methods[0].values[kv_pte::LOGITS as usize] else {
                panic!()
            };
            out.sizes = HUGE.to_vec();
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("huge.pte");
        std::fs::write(&path, spec.to_bytes()).expect("write");
        let err = pte::load(&path, &registry, Mode::ZeroCopy, None).err().expect("refused");
        let message = err.to_string();
        assert!(message.starts_with(&path.display().to_string()), "names the file: {message}");
        assert!(message.contains(what), "{message}");
        assert!(message.ends_with("is too large to allocate: its size in bytes overflows"), "{message}");
        assert_eq!(err.error_code(), ErrorCode::InvalidProgram, "{message}");
    }
}

#[test]
fn a_buffer_whose_size_overflows_is_refused_naming_it() {
    let mut spec = kv_pte::spec(false);
    let ValueSpec::Tensor(tensor) = &mut spec.methods[0].values[2] else { panic!("the k cache") };
    tensor.sizes = HUGE.to_vec();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("huge.pte");
    std::fs::write(&path, spec.to_bytes()).expect("write");
    let err = pte::load(&path, &registry(), Mode::ZeroCopy, None).err().expect("refused");
    assert_eq!(
        err.to_string(),
        format!(
            "{}: method 'forward': buffer 'k_cache_0' (value 2): 'k_cache_0' (f32 [65536, 65536, 65536, 65536]) \
             is too large to allocate: its size in bytes overflows",
            path.display()
        )
    );
    assert_eq!(err.error_code(), ErrorCode::InvalidProgram);
}
