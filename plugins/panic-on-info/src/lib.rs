//! A plugin library whose self-description (`Delegate::info`) panics: the handshake catches the panic and
//! refuses, so a host that chose this library for a backend must fall back to the next candidate, with one
//! log line and no panic text on stderr. It cannot describe itself, so its tests write its manifest by hand
//! (claiming `ReferenceBackend` at a high version).
//!
//! ```text
//! cargo build -p panic-on-info      # target/debug/libpanic_on_info.so
//! ```
//!
//! ## Feature Flags
//!
//! None.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

use delegate_abi::testing::{Fixture, Scripted};
use delegate_abi::PluginInfo;

/// A fixture whose metadata panics.
#[derive(Debug)]
pub enum PanicOnInfo {}

impl Fixture for PanicOnInfo {
    fn info() -> PluginInfo {
        panic!("panic-on-info: info panics as it is built to")
    }
}

delegate_abi::export_delegate!(Scripted<PanicOnInfo>);
