//! A plugin that announces only ABI versions 2..=3, newer than any host of this release speaks (1..=1): the
//! fixture for the "new plugin, old host" case of the ABI negotiation (ABI.md, lesson 4). A host must list it
//! as rejected, naming both ranges, and keep loading every other plugin.
//!
//! It is `delegate_abi::testing::Scripted` over [`Future`], which refuses every blob and every `init`.
//!
//! ## Examples
//!
//! ```text
//! cargo build -p abi-test-future         # target/debug/libabi_test_future.so
//! delegate-host plugins --plugin-dir target/debug
//! #   .../libabi_test_future.so  ...  rejected: plugin speaks ABI 2..=3, host 1..=1
//! ```
//!
//! ## Feature Flags
//!
//! None.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

use delegate_abi::testing::{Fixture, Scripted};
use delegate_abi::{Compatibility, DelegateError, InitContext, MemoryKind, PluginInfo};

/// A delegate that would serve `FutureBackend`, if a host could speak its ABI.
#[derive(Debug)]
pub enum Future {}

impl Fixture for Future {
    fn info() -> PluginInfo {
        PluginInfo::new("abi-test-future", env!("CARGO_PKG_VERSION"))
            .with_backend("FutureBackend")
            .with_wire_format("native", ">=2.0, <3")
            .with_memory_kinds([MemoryKind::Host])
            .with_binds_aliases_in_place(true)
    }

    fn compatibility(_blob: &[u8]) -> Compatibility {
        Compatibility::Unsupported { reason: "abi-test-future runs nothing".into() }
    }

    fn init(_ctx: &InitContext<'_>) -> Result<(), DelegateError> {
        Err(DelegateError::not_supported("abi-test-future runs nothing"))
    }
}

delegate_abi::export_delegate!(Scripted<Future>, abi = 2..=3);
