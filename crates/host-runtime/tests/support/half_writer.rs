//! A test delegate for `HalfBackend` that adds 1 to each float of its cache in place; when [`FAIL`] is set it
//! updates the first half only and then fails, as a plugin that dies mid-call leaves a cache. It keeps no
//! sequence state of its own and states so (`rewind_fork_without_reinit`): programs of it rewind and restore.

use std::sync::atomic::{AtomicBool, Ordering};

use delegate_abi::testing::{self, Fixture, Scripted};
use delegate_abi::{Capabilities, DelegateError, ExecuteArgs, PluginInfo};

/// Set: the next calls update half the cache, then fail.
pub static FAIL: AtomicBool = AtomicBool::new(false);

/// The delegate.
pub struct HalfWriter;

impl Fixture for HalfWriter {
    fn info() -> PluginInfo {
        let capabilities = Capabilities::default().with_rewind_fork_without_reinit(true);
        testing::info("half-writer", "HalfBackend").with_capabilities(capabilities)
    }
    fn execute(args: &mut ExecuteArgs<'_>) -> Result<(), DelegateError> {
        let ([], [cache]) = args.borrow_typed::<f32, 0, 1>([], [1])?;
        let fail = FAIL.load(Ordering::SeqCst);
        let updated = if fail { cache.len() / 2 } else { cache.len() };
        for value in &mut cache[..updated] {
            *value += 1.0;
        }
        if fail {
            return Err(DelegateError::internal("half-writer: failed halfway, as asked"));
        }
        Ok(())
    }
}

delegate_abi::export_delegate!(@embedded Scripted<HalfWriter>);
