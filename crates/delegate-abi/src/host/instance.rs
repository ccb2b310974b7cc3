//! [`Instance`]: one initialised delegate handle, executed through the negotiated table and destroyed on drop.

use std::fmt;

use abi_stable::std_types::{RResult, RSlice};

use super::args::ArgList;
use super::plugin::Plugin;
use crate::abi::{PluginModuleRef, RawHandle};
use crate::delegate::{CudaStream, DelegateError, ExecStats};

/// One initialised delegate handle. Dropping it calls the plugin's `destroy`.
///
/// It owns the handle: made only from what `module`'s `init` returned, handed to `execute` only through
/// `&mut self` and to `destroy` only on drop, which is what the table's `unsafe` entries require.
pub struct Instance {
    module: PluginModuleRef,
    handle: RawHandle,
    plugin: Plugin,
}

// SAFETY: the handle is the plugin's `Box<D::Handle>` with `D::Handle: Send` (required by `Delegate`), and
// `Instance` hands it to the plugin only through `&mut self` (execute) or by value (drop), so moving the
// instance to another thread moves exclusive ownership of the handle.
unsafe impl Send for Instance {}

impl fmt::Debug for Instance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Instance")
            .field("plugin", &self.plugin.info().name)
            .field("handle", &self.handle)
            .finish()
    }
}

impl Instance {
    /// `handle` must be what `module`'s `init` just returned (the [`Plugin::init`] that calls this).
    pub(super) fn new(module: PluginModuleRef, handle: RawHandle, plugin: Plugin) -> Instance {
        Instance { module, handle, plugin }
    }

    /// Runs one call with `args` and the caller's `stream`; returns the plugin's copy counters.
    ///
    /// Without a stream, everything is complete when this returns. With one, the results are complete when
    /// the stream reaches the point after this call, and the caller may not touch the arguments' memory
    /// before (the rule of [`crate::Delegate::execute`], which [`CudaStream::from_raw`]'s caller accepted).
    ///
    /// Allocates nothing on success.
    #[inline]
    pub fn execute(
        &mut self,
        args: &mut ArgList<'_>,
        stream: Option<CudaStream>,
    ) -> Result<ExecStats, DelegateError> {
        let mut stats = ExecStats::default();
        let stream = stream.map_or(std::ptr::null_mut(), CudaStream::as_raw);
        let entry = self.module.execute();
        // SAFETY: `self.handle` came from this module's `init` and is destroyed only on drop; `&mut self`
        // keeps other calls off it. `ArgList` built `args` from live borrows that outlast this call, sharing
        // storage only between an inout and its in-place output (its `push_raw` callers promised the same),
        // with codes made from Rust enums. A stream came through the `unsafe` `CudaStream::from_raw`, whose
        // caller vouched for it and for the completion rule. `stats` is a local.
        let result = unsafe { entry(self.handle, RSlice::from_slice(args.as_slice()), stream, &mut stats) };
        match result {
            RResult::ROk(()) => Ok(stats),
            RResult::RErr(err) => Err(err.into_delegate()),
        }
    }

    /// The plugin this instance belongs to.
    pub fn plugin(&self) -> &Plugin {
        &self.plugin
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let entry = self.module.destroy();
        // SAFETY: the handle came from this module's `init`, was never destroyed (this is the only place that
        // does) and is not in use (`&mut self`); the instance is gone afterwards.
        if let RResult::RErr(err) = unsafe { entry(self.handle) } {
            tracing::warn!(plugin = %self.plugin.info().name, "destroy failed: {}", err.into_delegate());
        }
    }
}
