//! An application linking two plugin crates as rlibs (this one and the reference delegate) beside
//! `host-runtime` (which links no plugin itself), embedding both through their `delegate_root()`, and executing each: what an application
//! built on host-runtime does to ship a third party's plugin inside its own binary.
//!
//! That this file links at all is half the test: when a plugin's library crate exported the dylib entry
//! symbol (the fixed abi_stable root-module name), two of them in one binary failed to link with a
//! duplicate-symbol error.

use blob_format::model::{Binding, DType, Dim, Header, PayloadKind, Role};
use delegate_abi::host::{ArgList, HostConfig, Plugin};
use delegate_abi::{DTypeCode, ErrorCode, InitContext, MemoryKind};
use host_runtime::plugins::{Discovery, Registry, Status};
use ref_graph::{ElemType, GraphBuilder};

fn ctx(blob: &[u8]) -> InitContext<'_> {
    InitContext { blob, compile_specs: &[], runtime_specs: &[] }
}

/// A reference blob computing `y = x + x` over `f32[1, 2]`.
fn doubling_blob() -> Vec<u8> {
    let mut b = GraphBuilder::new();
    let x = b.input("x", ElemType::F32, &[1, 2]).expect("fresh");
    let y = b.add("y", x, x).expect("typed");
    b.output(y).expect("declared");
    let graph = b.finish().expect("valid");
    let binding = |name: &str, role| Binding {
        name: name.to_owned(),
        role,
        dtype: Some(DType::F32),
        shape: Some(vec![Dim::Static(1), Dim::Static(2)]),
        threaded: true,
    };
    let header = Header::new(
        reference_delegate::BACKEND_ID,
        PayloadKind::ReferenceGraph,
        vec![binding("x", Role::Input), binding("y", Role::Output)],
        vec![],
    );
    blob_format::native::to_vec(&header, &graph.encode())
}

/// Runs `plugin` on one `f32[1, 2]` input and output.
fn run(plugin: &Plugin, blob: &[u8], input: [f32; 2]) -> Result<[f32; 2], delegate_abi::DelegateError> {
    let mut instance = plugin.init(&ctx(blob))?;
    let mut output = [0f32; 2];
    let mut args = ArgList::with_capacity(2);
    args.push_input(bytemuck::cast_slice(&input), DTypeCode::F32, &[1, 2], MemoryKind::Host)?;
    args.push_output(bytemuck::cast_slice_mut(&mut output), DTypeCode::F32, &[1, 2], MemoryKind::Host)?;
    instance.execute(&mut args, None)?;
    drop(args);
    Ok(output)
}

#[test]
fn two_plugin_rlibs_are_embedded_side_by_side_in_a_host_runtime_application_and_both_execute() {
    let config = HostConfig::default();
    // host-runtime embeds no plugin: the application adds the reference delegate and the third party's.
    let registry = Registry::discover(Discovery::new())
        .with_embedded(reference_delegate::delegate_root(), &config)
        .with_embedded(negate_delegate::delegate_root(), &config);
    let listed: Vec<(Option<String>, Status)> = registry
        .candidates()
        .iter()
        .map(|c| (c.info.as_ref().map(|i| i.name.clone()), c.status.clone()))
        .collect();
    // The application's plugins, in the order it added them, and nothing else.
    let names: Vec<Option<String>> = listed.iter().map(|(name, _)| name.clone()).collect();
    assert_eq!(names, [Some("reference-delegate".to_owned()), Some("negate-delegate".to_owned())]);
    assert_eq!((&listed[0].1, &listed[1].1), (&Status::Loaded, &Status::Loaded));
    assert!(
        registry.candidates().iter().all(|c| c.path.is_none()),
        "both embedded, neither loaded from disk"
    );
    assert_eq!(registry.backends(), ["NegateBackend", "ReferenceBackend"]);

    let blob = doubling_blob();
    let reference = registry
        .served(reference_delegate::BACKEND_ID)
        .and_then(|s| s.in_process().cloned())
        .expect("served");
    assert_eq!(run(&reference, &blob, [1.5, -2.0]).expect("reference executes"), [3.0, -4.0]);
    let negate =
        registry.served(negate_delegate::BACKEND).and_then(|s| s.in_process().cloned()).expect("served");
    assert_eq!(run(&negate, b"", [1.5, -2.0]).expect("negate executes"), [-1.5, 2.0]);

    // Each routes only its own calls: the reference delegate refuses a blob that is not its own.
    let err = run(&reference, b"not a blob", [0.0; 2]).expect_err("refused");
    assert_ne!(err.code, ErrorCode::Ok);
}

#[test]
fn both_root_modules_also_embed_without_the_registry() {
    let reference = Plugin::embedded(reference_delegate::delegate_root()).expect("reference embeds");
    let negate = Plugin::embedded(negate_delegate::delegate_root()).expect("negate embeds");
    assert_eq!(reference.info().backends, [reference_delegate::BACKEND_ID]);
    assert_eq!(negate.info().backends, [negate_delegate::BACKEND]);
    assert_eq!((reference.path(), negate.path()), (None, None));
    assert_eq!(run(&reference, &doubling_blob(), [0.25, 4.0]).expect("executes"), [0.5, 8.0]);
    assert_eq!(run(&negate, b"", [0.25, 4.0]).expect("executes"), [-0.25, -4.0]);
}
