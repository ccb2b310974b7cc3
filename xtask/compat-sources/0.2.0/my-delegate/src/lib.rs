//! A doubling delegate, as delegate-abi 0.2.0's guide writes one ("Writing a third-party delegate plugin").

use delegate_abi::{
    Capabilities, Compatibility, Delegate, DelegateError, ExecuteArgs, InitContext, MemoryKind, PluginInfo,
};

pub struct Doubler;

impl Delegate for Doubler {
    type Handle = ();

    fn new() -> Self {
        Doubler
    }

    fn info() -> PluginInfo {
        PluginInfo::new("doubler", "0.1.0")
            .with_backend("DoublerBackend")
            .with_wire_format("native", "^1")
            .with_memory_kinds([MemoryKind::Host])
            .with_binds_aliases_in_place(true)
            .with_capabilities(Capabilities::default().with_rewind_fork_without_reinit(true))
    }

    fn compatibility(&self, _blob: &[u8]) -> Compatibility {
        Compatibility::Supported
    }

    fn init(&self, _ctx: InitContext<'_>) -> Result<(), DelegateError> {
        Ok(())
    }

    fn execute(&self, _h: &mut (), args: &mut ExecuteArgs<'_>) -> Result<(), DelegateError> {
        let ([input], [output]) = args.borrow_typed::<f32, 1, 1>([0], [1])?;
        for (o, i) in output.iter_mut().zip(input) {
            *o = i * 2.0;
        }
        Ok(())
    }
}

delegate_abi::export_delegate!(@embedded Doubler);
