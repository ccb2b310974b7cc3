//! A plugin panic that the boundary catches does not reach stderr through the panic hook (the host reports it
//! as one `Internal` error); any other panic still reaches the hook that was installed before. Its own test
//! binary: the panic hook is process-wide.

use std::sync::atomic::{AtomicUsize, Ordering};

use delegate_abi::host::Plugin;
use delegate_abi::testing::{self, Fixture, Scripted};
use delegate_abi::{ErrorCode, InitContext, PluginInfo, Spec};

struct Panicky;
impl Fixture for Panicky {
    fn info() -> PluginInfo {
        testing::info("panicky", "PanickyBackend")
    }
}
delegate_abi::export_delegate!(@embedded Scripted<Panicky>);

static HOOK_CALLS: AtomicUsize = AtomicUsize::new(0);

#[test]
fn caught_plugin_panics_skip_the_hook_and_other_panics_still_reach_it() {
    // Stands in for the default hook, which prints the panic and the backtrace hint on stderr.
    std::panic::set_hook(Box::new(|_| {
        HOOK_CALLS.fetch_add(1, Ordering::SeqCst);
    }));
    let plugin = Plugin::embedded(delegate_root()).expect("loads");
    let specs = [Spec { key: "init", value: b"panic" }];
    let Err(err) = plugin.init(&InitContext { blob: &[], compile_specs: &specs, runtime_specs: &[] }) else {
        panic!("init panics, so it cannot succeed");
    };
    assert_eq!(err.code, ErrorCode::Internal, "{err}");
    assert!(err.message.contains("panic in init"), "{err}");
    assert_eq!(HOOK_CALLS.load(Ordering::SeqCst), 0, "a caught plugin panic went through the hook");

    let outside = std::panic::catch_unwind(|| panic!("a panic of the host's own"));
    assert!(outside.is_err());
    assert_eq!(HOOK_CALLS.load(Ordering::SeqCst), 1, "other panics still reach the previous hook");
    let _ = std::panic::take_hook();
}
