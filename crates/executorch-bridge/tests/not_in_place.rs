//! A plugin that does not bind aliased outputs in place never gets one storage twice, even when the export's
//! planning pass made ExecuTorch pass the buffer's own storage as the KV output: the bridge gives it a scratch
//! output and writes it back (host-runtime's rule for such plugins), and the program still decodes right.

mod common;

use delegate_abi::host::HostConfig;
use delegate_abi::{Compatibility, Delegate, DelegateError, ExecuteArgs, InitContext, PluginInfo};
use executorch_bridge::runner::{self, Protocol};
use host_runtime::plugins::{Discovery, Registry};
use reference_delegate::{ReferenceDelegate, ReferenceHandle};

/// The reference delegate, declaring that it does not bind aliased outputs in place.
pub struct NotInPlace(ReferenceDelegate);

impl Delegate for NotInPlace {
    type Handle = ReferenceHandle;

    fn new() -> Self {
        NotInPlace(ReferenceDelegate::new())
    }

    fn info() -> PluginInfo {
        let mut info = ReferenceDelegate::info();
        info.name = "not-in-place".to_owned();
        info.binds_aliases_in_place = false;
        info
    }

    fn compatibility(&self, blob: &[u8]) -> Compatibility {
        self.0.compatibility(blob)
    }

    fn init(&self, ctx: InitContext<'_>) -> Result<ReferenceHandle, DelegateError> {
        self.0.init(ctx)
    }

    fn execute(&self, handle: &mut ReferenceHandle, args: &mut ExecuteArgs<'_>) -> Result<(), DelegateError> {
        // The one storage twice would be refused by the reference delegate's own checks only if it were
        // shared otherwise than exactly; this plugin must simply never see it.
        let (first, second) = (args.arg(2)?, args.arg(4)?);
        if first.same_storage(second) {
            return Err(DelegateError::invalid_argument("the cache and its output share storage"));
        }
        self.0.execute(handle, args)
    }
}

delegate_abi::export_delegate!(@embedded NotInPlace);

#[test]
fn a_plugin_that_does_not_bind_in_place_gets_a_separate_output_written_back() {
    let registry =
        Registry::discover(Discovery::new()).with_embedded(delegate_root(), &HostConfig::default());
    let served = registry.served(common::BACKEND).expect("served");
    assert_eq!(served.in_process().expect("embedded: runs here").info().name, "not-in-place");
    let dir = tempfile::tempdir().expect("temp dir");
    let cases = common::own_cases(dir.path());
    for case in &cases {
        let report = runner::run(
            &case.path,
            &registry,
            &Protocol { prompt: common::PROMPT.to_vec(), steps: common::STEPS, require_zero_copy: false },
        )
        .unwrap_or_else(|e| panic!("{}: {e}", case.path.display()));
        assert_eq!(report.tokens, case.tokens, "{}", case.path.display());
        for stats in &report.decode {
            // Planned or not, the whole cache moves once per step: by the bridge (planned: the program has no
            // write-back left), or by the program's copy_ kernels.
            let (kernels, bridge) =
                if case.zero_copy { (0, case.cache_bytes) } else { (case.cache_bytes, 0) };
            assert_eq!(stats.write_back_bytes, kernels, "{}", case.path.display());
            assert_eq!(stats.bridge_write_back_bytes, bridge, "{}", case.path.display());
        }
    }
}
