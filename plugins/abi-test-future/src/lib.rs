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
use delegate_abi::{Compatibility, DelegateError, InitContext, MemoryKind, PluginInfo, WireFormatSupport};

/// A delegate that would serve `FutureBackend`, if a host could speak its ABI.
#[derive(Debug)]
pub enum Future {}

impl Fixture for Future {
    fn info() -> PluginInfo {
        PluginInfo {
            name: "abi-test-future".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            backends: vec!["FutureBackend".into()],
            wire_formats: vec![WireFormatSupport { format: "native".into(), versions: ">=2.0, <3".into() }],
            memory_kinds: vec![MemoryKind::Host],
            binds_aliases_in_place: true,
            capabilities: delegate_abi::Capabilities::default(),
        }
    }

    fn compatibility(_blob: &[u8]) -> Compatibility {
        Compatibility::Unsupported { reason: "abi-test-future runs nothing".into() }
    }

    fn init(_ctx: &InitContext<'_>) -> Result<(), DelegateError> {
        Err(DelegateError::not_supported("abi-test-future runs nothing"))
    }
}

delegate_abi::export_delegate!(Scripted<Future>, abi = 2..=3);
