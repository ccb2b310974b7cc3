//! Property tests: every header survives native write + parse unchanged, every TR02-representable header
//! survives TR02 write + parse unchanged, and no mutation of a valid blob makes a reader panic.

use blob_format::model::{
    Alias, AliasKind, Binding, DType, Dim, Format, Header, PayloadKind, Producer, Role, TENSORRT_BACKEND,
};
use blob_format::{native, upstream, Blob, WriteError};
use et_error::{ErrorCode, HasErrorCode};
use proptest::prelude::*;

fn text() -> impl Strategy<Value = String> {
    prop_oneof![4 => "[a-z_][a-z0-9_.]{0,12}", 1 => "\\PC{0,8}", 1 => any::<String>()]
}

fn non_empty_text() -> impl Strategy<Value = String> {
    text().prop_filter("empty reads back as absent", |s| !s.is_empty())
}

fn role() -> impl Strategy<Value = Role> {
    prop_oneof![Just(Role::Input), Just(Role::Output)]
}

fn dim() -> impl Strategy<Value = Dim> {
    prop_oneof![3 => any::<u64>().prop_map(Dim::Static), 1 => Just(Dim::Dynamic)]
}

fn binding() -> impl Strategy<Value = Binding> {
    (
        text(),
        role(),
        proptest::option::of(proptest::sample::select(DType::ALL.to_vec())),
        proptest::option::of(proptest::collection::vec(dim(), 0..5)),
        any::<bool>(),
    )
        .prop_map(|(name, role, dtype, shape, threaded)| Binding { name, role, dtype, shape, threaded })
}

fn alias_kind() -> impl Strategy<Value = AliasKind> {
    prop_oneof![
        Just(AliasKind::KvCacheUpdate),
        Just(AliasKind::User),
        text().prop_map(|k| AliasKind::from_wire(&k))
    ]
}

fn alias() -> impl Strategy<Value = Alias> {
    (text(), text(), alias_kind()).prop_map(|(output, input, kind)| Alias { output, input, kind })
}

fn payload_kind() -> impl Strategy<Value = PayloadKind> {
    prop_oneof![
        Just(PayloadKind::TensorRtPlan),
        Just(PayloadKind::ReferenceGraph),
        text().prop_map(|k| PayloadKind::from_wire(&k))
    ]
}

prop_compose! {
    fn header()(
        producer in proptest::option::of((text(), text()).prop_map(|(name, version)| Producer { name, version })),
        backend_id in text(),
        payload_kind in payload_kind(),
        bindings in proptest::collection::vec(binding(), 0..6),
        aliases in proptest::collection::vec(alias(), 0..4),
        device_id in 0..=i32::MAX,
        hardware_compatible in any::<bool>(),
        hardware_target in proptest::option::of(non_empty_text()),
        engine_library_version in proptest::option::of(text()),
        engine_metadata in proptest::option::of(non_empty_text()),
    ) -> Header {
        Header {
            producer, backend_id, payload_kind, bindings, aliases, device_id, hardware_compatible,
            hardware_target, engine_library_version, engine_metadata,
        }
    }
}

prop_compose! {
    /// Headers TR02 can express: TensorRT, untyped threaded bindings with inputs first, no producer.
    fn tr02_header()(
        inputs in proptest::collection::vec(text(), 0..4),
        outputs in proptest::collection::vec(text(), 0..4),
        aliases in proptest::collection::vec(alias(), 0..4),
        device_id in 0..=i32::MAX,
        hardware_compatible in any::<bool>(),
        hardware_target in proptest::option::of(non_empty_text()),
        engine_metadata in proptest::option::of(non_empty_text()),
    ) -> Header {
        let bindings = inputs.into_iter().map(|n| Binding::untyped(n, Role::Input))
            .chain(outputs.into_iter().map(|n| Binding::untyped(n, Role::Output)))
            .collect();
        Header {
            producer: None,
            backend_id: TENSORRT_BACKEND.to_owned(),
            payload_kind: PayloadKind::TensorRtPlan,
            bindings, aliases, device_id, hardware_compatible, hardware_target,
            engine_library_version: None,
            engine_metadata,
        }
    }
}

proptest! {
    #[test]
    fn native_round_trip(header in header(), engine in proptest::collection::vec(any::<u8>(), 0..600)) {
        let bytes = native::to_vec(&header, &engine);
        let blob = Blob::parse(&bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(blob.format, Format::Native { major: 1, minor: 0 });
        prop_assert_eq!(&blob.header, &header);
        prop_assert_eq!(blob.engine, engine.as_slice());
        prop_assert_eq!(blob.engine_offset() % 256, 0);
        prop_assert!(blob.verify_payload().is_ok());
        // The size check's bound holds: the header written is never larger than `header_size_bound` says.
        let header_len = u32::from_le_bytes(bytes[16..20].try_into().expect("4 bytes")) as u64;
        prop_assert!(header_len <= native::header_size_bound(&header), "{} > bound", header_len);
        prop_assert!(native::check_header(&header).is_ok());
    }

    #[test]
    fn tr02_round_trip(header in tr02_header(), engine in proptest::collection::vec(any::<u8>(), 0..100)) {
        prop_assert!(upstream::unrepresentable(&header).is_empty());
        let bytes = upstream::write_tr02(&header, &engine).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let blob = Blob::parse(&bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let expected = if header.aliases.is_empty() { Format::Tr01 } else { Format::Tr02 };
        prop_assert_eq!(blob.format, expected);
        prop_assert_eq!(&blob.header, &header);
        prop_assert_eq!(blob.engine, engine.as_slice());
        prop_assert_eq!(blob.engine_offset() % 16, 0);
        // Re-writing the parsed blob is byte-identical: the writer is a function of the model.
        let again = upstream::write_tr02(&blob.header, blob.engine).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(again, bytes);
    }

    #[test]
    fn unrepresentable_is_exactly_what_write_tr02_refuses(header in header()) {
        let losses = upstream::unrepresentable(&header);
        match upstream::write_tr02(&header, b"") {
            Ok(bytes) => {
                prop_assert!(losses.is_empty());
                let blob = Blob::parse(&bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(&blob.header, &header);
            }
            Err(blob_format::WriteError::Unrepresentable { losses: refused, .. }) => prop_assert_eq!(refused, losses),
            Err(other) => prop_assert!(false, "unexpected {other}"),
        }
    }

    #[test]
    fn mutated_blobs_never_panic(
        header in header(),
        native_format in any::<bool>(),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut bytes = if native_format {
            native::to_vec(&header, b"engine payload")
        } else {
            let representable = Header { producer: None, backend_id: TENSORRT_BACKEND.into(),
                payload_kind: PayloadKind::TensorRtPlan, engine_library_version: None,
                bindings: vec![Binding::untyped("a", Role::Input), Binding::untyped("b", Role::Output)], ..header };
            upstream::write_tr02(&representable, b"engine payload").map_err(|e| TestCaseError::fail(e.to_string()))?
        };
        for (at, value) in edits {
            let len = bytes.len();
            bytes[at.index(len)] = value;
        }
        let len = bytes.len();
        for input in [&bytes[..], &bytes[..cut.index(len + 1)]] {
            if let Ok(blob) = Blob::parse(input) {
                let end = blob.engine_offset() as usize + blob.engine.len();
                prop_assert!(end <= input.len());
                prop_assert_eq!(blob.engine.as_ptr(), input[blob.engine_offset() as usize..].as_ptr());
                let _ = blob.verify_payload();
            }
        }
    }
}

#[test]
fn a_header_too_large_to_write_is_refused_before_anything_is_built() {
    // An upstream blob's metadata is bounded (4 MiB), but a JSON dim costs 2 bytes and a native one 24: a TR01
    // of long shape tables would make a native header far larger than what was read.
    let dims = vec![Dim::Static(1); 200_000];
    let bindings = (0..4)
        .map(|i| Binding { shape: Some(dims.clone()), ..Binding::untyped(format!("t{i}"), Role::Input) })
        .collect();
    let header = Header {
        bindings,
        ..Header::new(TENSORRT_BACKEND, PayloadKind::TensorRtPlan, Vec::new(), Vec::new())
    };
    let err = native::check_header(&header).expect_err("about 19 MB of dims");
    assert!(
        matches!(err, WriteError::HeaderTooLarge { estimate, limit } if estimate > limit && limit == native::MAX_HEADER_BYTES)
    );
    assert_eq!(err.error_code(), ErrorCode::NotSupported);
    assert!(
        err.to_string().starts_with("native cannot express this blob: its header would take up to "),
        "{err}"
    );
}
