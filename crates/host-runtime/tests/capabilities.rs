//! What a plugin states about itself decides at load: a CUDA graph of a method whose plugin does not state
//! that it can be captured is refused before anything runs, naming the plugin and the capability.

use std::path::Path;

use delegate_abi::host::HostConfig;
use et_error::{ErrorCode, HasErrorCode};
use host_runtime::manifest::Manifest;
use host_runtime::plugins::{Discovery, Registry};
use host_runtime::program::{Error, Mode, Program};

fn load_reference_program(dir: &Path) -> Program {
    kv_example::export::reference(&kv_example::Config::tiny(), dir).expect("export");
    let registry = Registry::discover(Discovery::new())
        .with_embedded(reference_delegate::delegate_root(), &HostConfig::default());
    let manifest = Manifest::load(&dir.join("program.toml")).expect("manifest");
    Program::load(manifest, &registry, Mode::ZeroCopy).expect("loads")
}

#[test]
fn a_cuda_graph_of_a_plugin_that_cannot_be_captured_is_refused_at_load_naming_plugin_and_capability() {
    let dir = tempfile::tempdir().expect("temp dir");
    let program = load_reference_program(dir.path());
    let info = <reference_delegate::ReferenceDelegate as delegate_abi::Delegate>::info();
    assert!(!info.capabilities.cuda_graph_capturable, "the reference delegate computes on the host");
    let err = program.require_capturable("decode").expect_err("not capturable");
    assert!(matches!(&err, Error::NotCapturable { method, .. } if method == "decode"), "{err:?}");
    assert_eq!(err.error_code(), ErrorCode::NotSupported);
    assert_eq!(
        err.to_string(),
        "a CUDA graph (--cuda-graph) of method 'decode' is refused at load: call 0 (ReferenceBackend) is \
         served by plugin 'reference-delegate', which does not state the capability cuda_graph_capturable"
    );
    // The same reason is what a capture, or a benchmark choosing whether to capture, is given.
    assert_eq!(
        program.capture_refusal("decode").expect("a method").as_deref(),
        Some(
            "call 0 (ReferenceBackend) is served by plugin 'reference-delegate', which does not state the \
             capability cuda_graph_capturable"
        )
    );
}

/// The reference delegate, stating that it supports at most 2 positions.
mod short {
    use delegate_abi::{Compatibility, Delegate, DelegateError, ExecuteArgs, InitContext, PluginInfo};
    use reference_delegate::ReferenceDelegate;

    pub struct Short(ReferenceDelegate);

    impl Delegate for Short {
        type Handle = <ReferenceDelegate as Delegate>::Handle;

        fn new() -> Self {
            Short(ReferenceDelegate::new())
        }

        fn info() -> PluginInfo {
            let mut info = ReferenceDelegate::info();
            info.name = "short-reference".to_owned();
            info.capabilities.max_positions = 2;
            info
        }

        fn compatibility(&self, blob: &[u8]) -> Compatibility {
            self.0.compatibility(blob)
        }

        fn init(&self, ctx: InitContext<'_>) -> Result<Self::Handle, DelegateError> {
            self.0.init(ctx)
        }

        fn execute(
            &self,
            handle: &mut Self::Handle,
            args: &mut ExecuteArgs<'_>,
        ) -> Result<(), DelegateError> {
            self.0.execute(handle, args)
        }
    }

    delegate_abi::export_delegate!(@embedded Short);
}

#[test]
fn a_program_holding_more_positions_than_its_plugin_states_is_refused_at_load() {
    let dir = tempfile::tempdir().expect("temp dir");
    kv_example::export::reference(&kv_example::Config::tiny(), dir.path()).expect("export");
    let manifest = Manifest::load(&dir.path().join("program.toml")).expect("manifest");
    let needs =
        manifest.generate.as_ref().and_then(|g| g.max_positions).expect("the program states its positions");
    assert!(needs > 2, "the tiny config holds {needs} positions");
    let registry =
        Registry::discover(Discovery::new()).with_embedded(short::delegate_root(), &HostConfig::default());
    let err = Program::load(manifest, &registry, Mode::ZeroCopy).err().expect("refused at load");
    assert!(matches!(err, Error::TooManyPositions { most: 2, .. }), "{err:?}");
    assert_eq!(err.error_code(), ErrorCode::NotSupported);
    let method = match &err {
        Error::TooManyPositions { method, .. } => method.clone(),
        _ => unreachable!("matched above"),
    };
    assert_eq!(
        err.to_string(),
        format!(
            "method '{method}', call 0 (ReferenceBackend): plugin 'short-reference' states the capability \
             max_positions = 2, but the program's caches hold {needs} positions ([generate] max_positions)"
        )
    );
}
