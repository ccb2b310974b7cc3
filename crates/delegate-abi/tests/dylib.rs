//! Loads the real `abi-test` plugin from disk and drives it through the ABI.

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};

use delegate_abi::abi::AbiRange;
use delegate_abi::host::{ArgList, HostConfig, LoadError, Plugin};
use delegate_abi::{
    Compatibility, DTypeCode, ErrorCode, InitContext, MemoryKind, OptionValue, Spec, WireFormatSupport,
};

fn load() -> Plugin {
    Plugin::load(&common::abi_test_plugin(), &HostConfig::default()).expect("abi-test loads")
}

fn ctx<'a>(specs: &'a [Spec<'a>]) -> InitContext<'a> {
    InitContext { blob: b"blob", compile_specs: specs, runtime_specs: &[] }
}

#[test]
fn loads_negotiates_and_reads_metadata_before_init() {
    let plugin = load();
    assert_eq!(plugin.abi_version(), delegate_abi::abi::ABI_VERSION_MAX);
    assert_eq!(plugin.abi_range(), AbiRange::CURRENT);
    let info = plugin.info();
    assert_eq!(info.name, "abi-test");
    assert_eq!(info.version, "0.1.0");
    assert_eq!(info.backends, ["AbiTestBackend"]);
    assert_eq!(info.wire_formats, [WireFormatSupport::new("native", ">=1.0, <2")]);
    assert_eq!(info.memory_kinds, [MemoryKind::Host, MemoryKind::Pinned]);
    assert!(info.binds_aliases_in_place);
    assert_eq!(plugin.path(), Some(common::abi_test_plugin().as_path()));
    assert!(plugin.is_available());
    assert_eq!(plugin.poisoned(), None);
}

#[test]
fn compatibility_answers_cross_with_reasons() {
    let plugin = load();
    assert_eq!(plugin.compatibility(b"fine").expect("answer"), Compatibility::Supported);
    assert_eq!(
        plugin.compatibility(b"old").expect("answer"),
        Compatibility::RebuildRecommended { reason: "blob built by an older abi-test".into() }
    );
    assert_eq!(
        plugin.compatibility(b"").expect("answer"),
        Compatibility::Unsupported { reason: "empty blob".into() }
    );
}

#[test]
fn execute_writes_through_inout_and_in_place_output() {
    let plugin = load();
    let specs = [Spec { key: "execute", value: b"fill:7" }];
    let mut instance = plugin.init(&ctx(&specs)).expect("init");
    let input = [1u8; 8];
    let mut cache = [0u8; 16];
    let mut out = [0u8; 4];
    let mut args = ArgList::with_capacity(4);
    args.push_input(&input, DTypeCode::F32, &[2], MemoryKind::Host).expect("input");
    let slot = args.push_inout(&mut cache, DTypeCode::F32, &[2, 2], MemoryKind::Host).expect("cache");
    args.push_output_in_place(slot, DTypeCode::F32, &[4]).expect("aliased output");
    args.push_output(&mut out, DTypeCode::U8, &[4], MemoryKind::Host).expect("output");
    let stats = instance.execute(&mut args, None).expect("execute");
    assert_eq!(stats, delegate_abi::ExecStats::default());
    drop(args);
    assert_eq!(input, [1u8; 8], "inputs are read-only");
    assert_eq!(cache, [7u8; 16]);
    assert_eq!(out, [7u8; 4]);
}

#[test]
fn error_codes_round_trip() {
    let plugin = load();
    for code in [0x12u32, 0x30, 0x32, 0x99] {
        let value = format!("fail:{code}");
        let specs = [Spec { key: "execute", value: value.as_bytes() }];
        let mut instance = plugin.init(&ctx(&specs)).expect("init");
        let err = instance.execute(&mut ArgList::new(), None).expect_err("fails as asked");
        assert_eq!(err.code, ErrorCode::from_u32(code));
        assert_eq!(err.code.as_u32(), code);
        assert_eq!(err.message, "abi-test: execute fails as asked");

        let specs = [Spec { key: "init", value: value.as_bytes() }];
        let err = plugin.init(&ctx(&specs)).expect_err("init fails as asked");
        assert_eq!(err.code.as_u32(), code);
    }
    let err = plugin.get_option("nope").expect_err("unknown option");
    assert_eq!(err.code, ErrorCode::NotFound);
    assert_eq!(err.message, "unknown option 'nope'");
    let specs = [Spec { key: "bogus", value: b"" }];
    let err = plugin.init(&ctx(&specs)).expect_err("bad spec");
    assert_eq!(err.code, ErrorCode::InvalidArgument);
    assert!(err.message.contains("unknown compile spec 'bogus'"), "{}", err.message);
}

#[test]
fn an_instance_answers_whether_it_keeps_sequence_state_across_the_library_boundary() {
    // abi-test states `rewind_fork_without_reinit` and answers through the appended entry (its default).
    let instance = load().init(&ctx(&[])).expect("init");
    let answer = instance.sequence_state().expect("answers");
    assert_eq!(answer, delegate_abi::host::SequenceState { keeps_own: false, per_instance: true });
}

#[test]
fn an_error_code_of_ok_is_reported_as_internal() {
    let plugin = load();
    let specs = [Spec { key: "execute", value: b"fail:0" }];
    let mut instance = plugin.init(&ctx(&specs)).expect("init");
    let err = instance.execute(&mut ArgList::new(), None).expect_err("fails");
    assert_eq!(err.code, ErrorCode::Internal);
}

#[test]
fn a_panicking_plugin_returns_internal_then_is_poisoned_and_the_host_survives() {
    let (_dir, path) = common::private_copy();
    let plugin = Plugin::load(&path, &HostConfig::default()).expect("copy loads");
    let panicking = [Spec { key: "execute", value: b"panic" }];
    let mut instance = plugin.init(&ctx(&panicking)).expect("init");
    let mut healthy = plugin.init(&ctx(&[])).expect("init");

    let err = instance.execute(&mut ArgList::new(), None).expect_err("panic caught");
    assert_eq!(err.code, ErrorCode::Internal);
    assert_eq!(err.message, "plugin abi-test panic in execute: abi-test: execute panics as asked");

    let err = healthy.execute(&mut ArgList::new(), None).expect_err("poisoned");
    assert_eq!(err.code, ErrorCode::InvalidState);
    assert_eq!(
        err.message,
        "plugin abi-test is poisoned by an earlier panic: panic in execute: abi-test: execute panics as asked"
    );
    let err = plugin.init(&ctx(&[])).expect_err("poisoned");
    assert_eq!(err.code, ErrorCode::InvalidState);
    assert!(!plugin.is_available());
    assert_eq!(plugin.poisoned().as_deref(), Some("panic in execute: abi-test: execute panics as asked"));
    // Dropping instances still destroys their handles without a panic.
    drop(instance);
    drop(healthy);

    // The shared, unpoisoned library is unaffected.
    let shared = load();
    assert!(shared.is_available());
    assert_eq!(shared.poisoned(), None);
}

#[test]
fn a_panic_in_init_poisons_too() {
    let (_dir, path) = common::private_copy();
    let plugin = Plugin::load(&path, &HostConfig::default()).expect("copy loads");
    let specs = [Spec { key: "init", value: b"panic" }];
    let err = plugin.init(&ctx(&specs)).expect_err("panic caught");
    assert_eq!(err.code, ErrorCode::Internal);
    assert!(err.message.contains("panic in init: abi-test: init panics as asked"), "{}", err.message);
    assert_eq!(plugin.compatibility(b"x").expect_err("poisoned").code, ErrorCode::InvalidState);
}

#[test]
fn a_text_file_named_like_a_library_is_rejected_with_a_reason() {
    let dir = tempfile::tempdir().expect("temp dir");
    let fake = dir.path().join(common::dylib_name("not_a_plugin"));
    std::fs::write(&fake, "this is text, not ELF\n").expect("write");
    let err = Plugin::load(&fake, &HostConfig::default()).expect_err("rejected");
    assert!(matches!(err, LoadError::NotALibrary { .. }), "{err:?}");
    assert_eq!(err.path(), Some(fake.as_path()));
    let text = err.to_string();
    assert!(text.starts_with("not a loadable library: "), "{text}");
    assert!(!text.contains('\n'), "one line: {text}");
    // The real plugin still loads.
    load();
}

#[test]
fn a_library_without_the_entry_symbol_is_not_a_plugin() {
    // libc is a real shared library with no delegate entry: the one this test process has mapped, wherever
    // the system keeps it.
    let maps = std::fs::read_to_string("/proc/self/maps").expect("Linux lists the process's mappings");
    let libc = maps
        .lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .find(|path| Path::new(path).file_name().is_some_and(|n| n.to_string_lossy().starts_with("libc.so")))
        .expect("the test process maps a libc.so");
    let err = Plugin::load(Path::new(libc), &HostConfig::default()).expect_err("rejected");
    assert!(matches!(err, LoadError::NoEntrySymbol { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "not a delegate plugin: no `_1as_0lib_1header_0root_bmodule_bloader` entry symbol"
    );
}

#[test]
fn a_missing_file_is_not_a_library() {
    let err =
        Plugin::load(Path::new("/nonexistent/libnothing.so"), &HostConfig::default()).expect_err("missing");
    assert!(matches!(err, LoadError::NotALibrary { .. }), "{err:?}");
}

#[test]
fn new_host_old_plugin_and_old_host_new_plugin_negotiate_over_a_real_dylib() {
    let path = common::abi_test_plugin();
    // A newer host that still speaks 1 meets the plugin that speaks only 1: they agree on 1.
    let newer_host = HostConfig::default().with_abi_range(AbiRange::new(1, 4));
    assert_eq!(Plugin::load(&path, &newer_host).expect("negotiates").abi_version(), 1);
    // A host that dropped 1 cannot use it, and says so with both ranges.
    let host_without_1 = HostConfig::default().with_abi_range(AbiRange::new(2, 4));
    let err = Plugin::load(&path, &host_without_1).expect_err("disjoint");
    assert!(matches!(err, LoadError::AbiVersionDisjoint { .. }), "{err:?}");
    assert_eq!(err.to_string(), "plugin speaks ABI 1..=1, host 2..=4");
    // An older host (speaking only 0) against this plugin.
    let older_host = HostConfig::default().with_abi_range(AbiRange::new(0, 0));
    assert_eq!(
        Plugin::load(&path, &older_host).expect_err("disjoint").to_string(),
        "plugin speaks ABI 1..=1, host 0..=0"
    );
}

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<(tracing::Level, String, String)>>>);

struct Capture(Captured);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Capture {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: tracing_subscriber::layer::Context<'_, S>) {
        struct Msg(String);
        impl tracing::field::Visit for Msg {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        let mut msg = Msg(String::new());
        event.record(&mut msg);
        let meta = event.metadata();
        self.0 .0.lock().expect("lock").push((*meta.level(), meta.target().to_string(), msg.0));
    }
}

#[test]
fn plugin_logs_reach_the_host_subscriber_with_level_target_and_message() {
    use tracing_subscriber::layer::SubscriberExt;
    let captured = Captured::default();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_subscriber::filter::LevelFilter::INFO)
        .with(Capture(captured.clone()));
    let plugin = load();
    tracing::subscriber::with_default(subscriber, || {
        plugin.set_option("log", OptionValue::Str("hello from the plugin".into())).expect("logs");
    });
    let records = captured.0.lock().expect("lock").clone();
    assert_eq!(
        records,
        [(tracing::Level::INFO, "abi_test".to_string(), "hello from the plugin".to_string())]
    );
}
