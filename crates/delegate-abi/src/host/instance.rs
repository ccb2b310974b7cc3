//! [`Instance`]: one initialised delegate handle, executed through the negotiated table and destroyed on drop.

use std::fmt;

use abi_stable::std_types::{RResult, RSlice};

use super::args::ArgList;
use super::plugin::Plugin;
use crate::abi::{PluginModuleRef, RError, RawHandle};
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

/// Whether an instance keeps sequence state of its own, and how the host knows ([`Instance::sequence_state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SequenceState {
    /// It keeps state its later calls read beyond the caller's caches: a host that rewinds, restores or forks
    /// the caches would run it on state of another position or sequence.
    pub keeps_own: bool,
    /// Whether the instance answered itself; `false`: the plugin predates the per-instance entry and its
    /// plugin-level capability (`rewind_fork_without_reinit`) answered.
    pub per_instance: bool,
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

    /// Whether this instance keeps sequence state of its own (`Delegate::keeps_sequence_state`), so that a
    /// rewind, a restored cache or a fork of the caller's caches would not carry the whole sequence. A plugin
    /// built before the per-instance entry (release 0.1.0) cannot be asked: its plugin-level capability
    /// answers for every instance (`keeps_own` unless it states `rewind_fork_without_reinit`, which 0.1.0
    /// plugins do not).
    ///
    /// # Errors
    /// The plugin's error (`InvalidState` when it is poisoned); `Internal` when it answers a byte other than
    /// 0 or 1.
    pub fn sequence_state(&self) -> Result<SequenceState, DelegateError> {
        let plugin = self.plugin.info();
        let Some(entry) = self.module.keeps_sequence_state() else {
            let keeps_own = !plugin.capabilities.rewind_fork_without_reinit;
            return Ok(SequenceState { keeps_own, per_instance: false });
        };
        // SAFETY: `self.handle` came from this module's `init` and is destroyed only on drop; `Instance` is not
        // `Sync` and `execute` takes `&mut self`, so no other call uses the handle meanwhile.
        let answer = unsafe { entry(self.handle) }.into_result().map_err(RError::into_delegate)?;
        match answer {
            0 | 1 => Ok(SequenceState { keeps_own: answer == 1, per_instance: true }),
            byte => Err(DelegateError::internal(format!(
                "plugin {} answers {byte} to keeps_sequence_state, which is 0 or 1",
                plugin.name
            ))),
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
