//! A minimal delegate written the way a third party writes one, built only as an rlib: the fixture that
//! proves plugins link statically side by side.
//!
//! It serves backend [`BACKEND`]: argument 0 is an `f32` input, argument 1 an `f32` output of the same
//! shape, and `execute` writes `-x`. The crate depends on `delegate-abi` alone, exports no entry symbol
//! (`export_delegate!(@embedded ...)`), and offers [`delegate_root`] for a host to embed it. Its test
//! (`tests/linked_with_host.rs`) links it, the reference delegate's rlib and `host-runtime` into one binary,
//! which fails to link with a duplicate-symbol error if either crate exports the dylib entry symbol.
//!
//! ## Examples
//!
//! ```
//! use delegate_abi::host::{ArgList, Plugin};
//! use delegate_abi::{DTypeCode, InitContext, MemoryKind};
//!
//! let plugin = Plugin::embedded(negate_delegate::delegate_root())?;
//! let mut instance = plugin.init(&InitContext { blob: b"", compile_specs: &[], runtime_specs: &[] })?;
//! let input = [2.0f32];
//! let mut output = [0f32];
//! let mut args = ArgList::new();
//! args.push_input(bytemuck::cast_slice(&input), DTypeCode::F32, &[1], MemoryKind::Host)?;
//! args.push_output(bytemuck::cast_slice_mut(&mut output), DTypeCode::F32, &[1], MemoryKind::Host)?;
//! instance.execute(&mut args, None)?;
//! drop(args);
//! assert_eq!(output, [-2.0]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Feature Flags
//!
//! None.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

use delegate_abi::{
    Compatibility, Delegate, DelegateError, ExecuteArgs, InitContext, MemoryKind, PluginInfo,
};

/// The backend id this delegate serves.
pub const BACKEND: &str = "NegateBackend";

/// Negates an `f32` tensor.
#[derive(Debug, Default)]
pub struct NegateDelegate;

impl Delegate for NegateDelegate {
    type Handle = ();

    fn new() -> Self {
        NegateDelegate
    }

    fn info() -> PluginInfo {
        PluginInfo::new("negate-delegate", env!("CARGO_PKG_VERSION"))
            .with_backend(BACKEND)
            .with_memory_kinds([MemoryKind::Host, MemoryKind::Pinned, MemoryKind::Managed])
    }

    fn compatibility(&self, _blob: &[u8]) -> Compatibility {
        Compatibility::Supported
    }

    fn init(&self, _ctx: InitContext<'_>) -> Result<(), DelegateError> {
        Ok(())
    }

    fn execute(&self, _handle: &mut (), args: &mut ExecuteArgs<'_>) -> Result<(), DelegateError> {
        if args.len() != 2 {
            return Err(DelegateError::invalid_argument(format!(
                "negate takes an input and an output, the call has {} arguments",
                args.len()
            )));
        }
        let ([input], [output]) = args.borrow_typed::<f32, 1, 1>([0], [1])?;
        if input.len() != output.len() {
            return Err(DelegateError::invalid_argument(format!(
                "input has {} elements, output {}",
                input.len(),
                output.len()
            )));
        }
        for (o, i) in output.iter_mut().zip(input) {
            *o = -i;
        }
        Ok(())
    }
}

// No exported entry symbol: a crate that other binaries link never writes `export_delegate!(Type)`.
delegate_abi::export_delegate!(@embedded NegateDelegate);
