//! A test delegate for `UnstatedBackend` that states no capability, as a plugin built before capabilities
//! existed: it adds 1 to each float of its cache in place, through its arguments only, but says nothing of
//! it, so a host must take it that its instances may keep sequence state of their own.

use delegate_abi::testing::{self, Fixture, Scripted};
use delegate_abi::{DelegateError, ExecuteArgs, PluginInfo};

/// The delegate.
pub struct Unstated;

impl Fixture for Unstated {
    fn info() -> PluginInfo {
        testing::info("unstated", "UnstatedBackend")
    }
    fn execute(args: &mut ExecuteArgs<'_>) -> Result<(), DelegateError> {
        let ([], [cache]) = args.borrow_typed::<f32, 0, 1>([], [1])?;
        for value in cache.iter_mut() {
            *value += 1.0;
        }
        Ok(())
    }
}

delegate_abi::export_delegate!(@embedded Scripted<Unstated>);
