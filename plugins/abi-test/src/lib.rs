//! A delegate plugin that does nothing, on purpose, and misbehaves on request: the fixture for
//! `delegate-abi`'s ABI tests and the ABI-overhead benchmark, built as a dylib.
//!
//! It is `delegate_abi::testing::Scripted` over this crate's metadata ([`AbiTest`]): behaviour is chosen per
//! instance through compile specs (so tests running in parallel against the same loaded library do not
//! disturb each other), and per plugin through options; the table is in `delegate_abi::testing`. This crate
//! adds:
//!
//! | where | key | value | effect |
//! |---|---|---|---|
//! | option | `log` | string | logs it with `tracing::info!` (target `abi_test`) and `tracing::debug!` |
//! | `compatibility` | | empty blob / `old` / other | `Unsupported` / `RebuildRecommended` / `Supported` |
//! | environment | `ABI_TEST_PRINT` | string | printed to stdout whenever the host reads the plugin's info: a chatty native library |
//!
//! ## Examples
//!
//! ```text
//! cargo build -p abi-test        # target/debug/libabi_test.so
//! ```
//!
//! ## Feature Flags
//!
//! None.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

use delegate_abi::testing::{Fixture, Scripted};
use delegate_abi::{
    Capabilities, Compatibility, DelegateError, ErrorCode, InitContext, MemoryKind, OptionValue, PluginInfo,
};

/// Backend id this plugin serves.
pub const BACKEND: &str = "AbiTestBackend";

/// This plugin's metadata and its few behaviours of its own.
#[derive(Debug)]
pub enum AbiTest {}

impl Fixture for AbiTest {
    fn info() -> PluginInfo {
        if let Ok(text) = std::env::var("ABI_TEST_PRINT") {
            println!("{text}");
        }
        PluginInfo::new("abi-test", env!("CARGO_PKG_VERSION"))
            .with_backend(BACKEND)
            .with_wire_format("native", ">=1.0, <2")
            .with_memory_kinds([MemoryKind::Host, MemoryKind::Pinned])
            .with_binds_aliases_in_place(true)
            // Some of each kind of capability, for the listing and manifest tests; never CUDA-graph capturable.
            .with_capabilities(
                Capabilities::default()
                    .with_in_place_memory_kinds([MemoryKind::Host, MemoryKind::Pinned])
                    .with_rewind_fork_without_reinit(true)
                    .with_max_positions(4096),
            )
    }

    fn compatibility(blob: &[u8]) -> Compatibility {
        match blob {
            b"" => Compatibility::Unsupported { reason: "empty blob".into() },
            b"old" => Compatibility::RebuildRecommended { reason: "blob built by an older abi-test".into() },
            _ => Compatibility::Supported,
        }
    }

    fn init(ctx: &InitContext<'_>) -> Result<(), DelegateError> {
        tracing::debug!(blob_bytes = ctx.blob.len(), "abi-test: init");
        Ok(())
    }

    fn set_option(key: &str, value: OptionValue) -> Result<(), DelegateError> {
        match (key, value) {
            ("log", OptionValue::Str(message)) => {
                tracing::info!("{message}");
                tracing::debug!(detail = 7, "debug: {message}");
                Ok(())
            }
            (key, value) => {
                Err(DelegateError::new(ErrorCode::NotFound, format!("unknown option '{key}' = {value:?}")))
            }
        }
    }
}

delegate_abi::export_delegate!(Scripted<AbiTest>);
