//! The safe host side: load a plugin, read its metadata, create instances and execute them.
//!
//! All `unsafe` of the host lives in this crate; `host-runtime` drives plugins through these types only.
//!
//! # Libraries are never unloaded
//!
//! A loaded plugin library stays mapped until the process exits, by design:
//! - a dylib that ran Rust code may have registered thread-local destructors (`std`'s own TLS, `tracing`'s
//!   per-thread dispatcher cache); unloading it while any thread lives makes those destructors jump into
//!   unmapped memory when the thread exits;
//! - tables, info records, strings and `'static` references handed out by the plugin would dangle;
//! - abi_stable itself leaks every library it opens (`lib_header_from_path` forgets the handle).
//!
//! Loading the same path twice gives the same library (the dynamic loader reference-counts it), so the
//! negotiated tables and the poisoned state are shared.

//!
//! # Modules
//!
//! - [`Plugin`] (`plugin`): loading, the handshake and metadata checks; [`LoadError`] (`load_error`) says
//!   why a library is not a usable plugin, in one line;
//! - [`Instance`] (`instance`): one initialised handle, executed, asked whether it keeps sequence state of
//!   its own ([`SequenceState`]) and destroyed through the tables;
//! - [`ArgList`] (`args`): the safe builder of call arguments, tied to the caller's borrows.

mod args;
mod instance;
mod load_error;
mod plugin;
mod root;

pub use args::{ArgError, ArgList, Slot};
pub use instance::{Instance, SequenceState};
pub use load_error::LoadError;
pub use plugin::Plugin;

use crate::abi::AbiRange;

/// How the host loads plugins.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HostConfig {
    /// ABI versions the host offers; [`AbiRange::CURRENT`] unless testing negotiation.
    pub abi_range: AbiRange,
    /// Whether a plugin loaded from disk forwards its `tracing` records to this process's subscriber.
    pub forward_logs: bool,
}

impl Default for HostConfig {
    fn default() -> HostConfig {
        HostConfig { abi_range: AbiRange::CURRENT, forward_logs: true }
    }
}

impl HostConfig {
    /// The default: current ABI range, logs forwarded.
    pub fn new() -> HostConfig {
        HostConfig::default()
    }

    /// Offers `range` instead of [`AbiRange::CURRENT`] (to test negotiation).
    pub fn with_abi_range(mut self, range: AbiRange) -> HostConfig {
        self.abi_range = range;
        self
    }

    /// Whether plugin logs are forwarded.
    pub fn with_forward_logs(mut self, forward: bool) -> HostConfig {
        self.forward_logs = forward;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}
    fn assert_send<T: Send>() {}

    #[test]
    fn plugin_is_send_sync_and_instance_is_send() {
        assert_send_sync::<Plugin>();
        assert_send::<Instance>();
    }
}
