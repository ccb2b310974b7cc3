//! The contract as both delegates use it: a blob for one backend is taken by its executor and refused by
//! another's in the same words, and `open` binds every argument position.

use delegate_abi::{Compatibility, InitContext};
use et_error::{ErrorCode, HasErrorCode};
use ref_graph_contract::{Error, Executor};

const REFERENCE: Executor = Executor { backend: "ReferenceBackend", name: "the reference delegate" };
const CUDA: Executor = Executor { backend: "CudaBackend", name: "the CUDA delegate" };

fn blob(backend: kv_example::Backend) -> Vec<u8> {
    let cfg = kv_example::Config::tiny();
    let weights = kv_example::Weights::generate(&cfg);
    kv_example::export::blob(&cfg, &weights, 1, backend).expect("blob")
}

fn ctx(blob: &[u8]) -> InitContext<'_> {
    InitContext { blob, compile_specs: &[], runtime_specs: &[] }
}

#[test]
fn each_executor_takes_its_own_backend_and_names_the_other() {
    let reference = blob(kv_example::Backend::Reference);
    assert_eq!(REFERENCE.compatibility(&reference), Compatibility::Supported);
    assert_eq!(
        CUDA.compatibility(&reference),
        Compatibility::Unsupported {
            reason: "the blob is for backend 'ReferenceBackend', not 'CudaBackend'".to_owned()
        }
    );
    let err = CUDA.open(&ctx(&reference)).expect_err("another backend's blob");
    assert!(matches!(err, Error::Incompatible(_)), "{err:?}");
    assert_eq!(err.error_code(), ErrorCode::DelegateInvalidCompatibility);
}

#[test]
fn open_binds_every_position_with_the_caches_in_place() {
    let bytes = blob(kv_example::Backend::Cuda);
    let opened = CUDA.open(&ctx(&bytes)).expect("opens");
    let args = opened.plan.args();
    assert_eq!(args.len(), opened.blob.header.bindings.len());
    assert!(args.iter().any(|a| a.aliased_input), "a cache input: {args:?}");
    assert!(args.iter().any(|a| a.aliases_arg.is_some()), "an in-place slot: {args:?}");
    assert!(!ref_graph_contract::keeps_sequence_state(&opened.graph));
}

#[test]
fn garbage_is_refused_with_the_blob_format_code() {
    match REFERENCE.compatibility(b"nope") {
        Compatibility::Unsupported { reason } => assert!(!reason.is_empty()),
        other => panic!("garbage accepted: {other:?}"),
    }
    let err = REFERENCE.open(&ctx(b"nope")).expect_err("garbage");
    assert!(matches!(err, Error::Blob(_)), "{err:?}");
    assert_eq!(
        ref_graph_contract::payload_compatibility(b"RGRF"),
        Compatibility::Unsupported { reason: "the payload is not a reference graph".to_owned() }
    );
}
