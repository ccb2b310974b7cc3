//! The TensorRT delegate ([`tensorrt_delegate::TensorRtDelegate`]) as a plugin library: this crate only
//! exports the plugin entry symbol, which one binary may hold once, so the delegate itself stays in an rlib
//! that hosts link next to other plugins.
//!
//! ## Examples
//!
//! ```text
//! cargo build -p tensorrt-delegate-dylib           # target/debug/libtensorrt_delegate_dylib.so
//! delegate-host plugins --plugin-dir target/debug  # lists it (TensorRTBackend)
//! ```
//!
//! ## Feature Flags
//!
//! None.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

delegate_abi::export_delegate!(tensorrt_delegate::TensorRtDelegate);
