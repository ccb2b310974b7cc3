//! The reference delegate ([`reference_delegate::ReferenceDelegate`]) as a plugin library: this crate only
//! exports the plugin entry symbol, which one binary may hold once, so the delegate itself stays in an rlib
//! that hosts link next to other plugins.
//!
//! ## Examples
//!
//! ```text
//! cargo build -p reference-delegate-dylib          # target/debug/libreference_delegate_dylib.so
//! delegate-host plugins --plugin-dir target/debug  # lists it beside the embedded copy
//! ```
//!
//! ## Feature Flags
//!
//! None.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

delegate_abi::export_delegate!(reference_delegate::ReferenceDelegate);
