//! The stable plugin ABI between `delegate-host` and delegate plugins: a safe [`Delegate`] trait for plugin
//! authors, the [`export_delegate!`] macro that writes the FFI glue, and the safe [`host`] side that loads,
//! negotiates and drives plugins.
//!
//! Built on [abi_stable] 0.11: one permanent entry symbol (abi_stable's root-module header) whose root module
//! holds only a Vulkan-style handshake. The host offers the ABI versions it speaks, the plugin answers the one
//! it will use (see [`abi::negotiate`]); all other tables are reached through that answer and grow
//! append-only. Errors cross as an ExecuTorch code plus a message; panics are caught at every entry and
//! poison the plugin; plugin `tracing` records reach the host's subscriber.
//!
//! ## Examples
//!
//! A no-op delegate, embedded (statically linked) and driven through the same tables a dylib would use:
//!
//! ```
//! use delegate_abi::host::{ArgList, Plugin};
//! use delegate_abi::{
//!     Compatibility, DTypeCode, Delegate, DelegateError, ExecuteArgs, InitContext, MemoryKind, PluginInfo,
//!     WireFormatSupport,
//! };
//!
//! pub struct Doubler;
//!
//! impl Delegate for Doubler {
//!     type Handle = ();
//!     fn new() -> Self { Doubler }
//!     fn info() -> PluginInfo {
//!         PluginInfo {
//!             name: "doubler".into(),
//!             version: "0.1.0".into(),
//!             backends: vec!["DoublerBackend".into()],
//!             wire_formats: vec![WireFormatSupport { format: "native".into(), versions: "^1".into() }],
//!             memory_kinds: vec![MemoryKind::Host],
//!             binds_aliases_in_place: true,
//!         }
//!     }
//!     fn is_available(&self) -> bool { true }
//!     fn compatibility(&self, _blob: &[u8]) -> Compatibility { Compatibility::Supported }
//!     fn init(&self, _ctx: InitContext<'_>) -> Result<(), DelegateError> { Ok(()) }
//!     fn execute(&self, _h: &mut (), args: &mut ExecuteArgs<'_>) -> Result<(), DelegateError> {
//!         let ([input], [output]) = args.borrow([0], [1])?;
//!         for (o, i) in output.iter_mut().zip(input) { *o = i * 2; }
//!         Ok(())
//!     }
//! }
//!
//! // In a plugin crate: `delegate_abi::export_delegate!(Doubler);` (also exports the dylib entry).
//! // `@embedded` writes only `delegate_root()`, as a host binary embedding a plugin would need.
//! delegate_abi::export_delegate!(@embedded Doubler);
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let plugin = Plugin::embedded(delegate_root())?;
//!     assert_eq!(plugin.info().backends, ["DoublerBackend"]);
//!     let ctx = delegate_abi::InitContext { blob: b"", compile_specs: &[], runtime_specs: &[] };
//!     let mut instance = plugin.init(&ctx)?;
//!
//!     let input = [1u8, 2, 3];
//!     let mut output = [0u8; 3];
//!     let mut args = ArgList::with_capacity(2);
//!     args.push_input(&input, DTypeCode::U8, &[3], MemoryKind::Host)?;
//!     args.push_output(&mut output, DTypeCode::U8, &[3], MemoryKind::Host)?;
//!     instance.execute(&mut args, None)?;
//!     drop(args);
//!     assert_eq!(output, [2, 4, 6]);
//!     Ok(())
//! }
//! ```
//!
//! ## Writing a third-party delegate plugin
//!
//! 1. Create a library crate and make it a `cdylib`:
//!
//!    ```text
//!    cargo new --lib my-delegate
//!    ```
//!
//!    ```toml
//!    # my-delegate/Cargo.toml
//!    [lib]
//!    crate-type = ["cdylib"]          # add "rlib" too if a host should also link it statically
//!
//!    [dependencies]
//!    delegate-abi = "0.1"             # (or a path / git dependency on this workspace)
//!    tracing = "0.1"                  # optional: your logs reach the host's subscriber
//!    ```
//!
//!    No direct `abi_stable` dependency is needed: the macro reaches it through `delegate-abi`.
//!
//! 2. Implement [`Delegate`] for a type (see the example above, and `plugins/reference` for a full one):
//!    - `info()` is metadata, read before anything else runs: name, version, the ExecuTorch backend ids
//!      you serve (the host routes blobs by these), the blob wire formats you read as semver ranges, the
//!      memory kinds you accept, and whether you bind aliased outputs in place;
//!    - `compatibility(blob)` answers from the header only, with a reason when it is not `Supported`;
//!    - `init` gets the blob borrowed for the call; keep what you derive from it in your `Handle`;
//!    - `execute` reaches memory only through [`ExecuteArgs::borrow`], which refuses to hand out an inout
//!      and its in-place output at once; record copies with `record_reflect` / `record_staging`;
//!    - return [`DelegateError`]s with the right [`ErrorCode`]; a panic is caught, reported as `Internal`
//!      and poisons your plugin for the rest of the process.
//!
//! 3. Export it at the crate root:
//!
//!    ```text
//!    delegate_abi::export_delegate!(MyDelegate);
//!    ```
//!
//! 4. Build and list it:
//!
//!    ```text
//!    cargo build                                      # target/debug/libmy_delegate.so (.dylib, .dll)
//!    delegate-host plugins --plugin-dir target/debug  # lists it: path, name, version, ABI, backends, status
//!    ```
//!
//!    A plugin the host cannot use is listed as `rejected: <reason>` (e.g. `plugin speaks ABI 2..=3, host
//!    1..=1`) and the others still load. Put the directory in `DELEGATE_PLUGIN_PATH` (colon-separated) to
//!    find it without `--plugin-dir`.
//!
//! ## Feature Flags
//!
//! None.
//!
//! [abi_stable]: https://docs.rs/abi_stable/0.11
#![deny(missing_docs)]

pub mod abi;
mod conv;
pub mod delegate;
#[doc(hidden)]
pub mod export;
pub mod host;
mod logging;
pub mod tensor;

pub use conv::NoDTypeCode;
pub use delegate::*;
pub use tensor::*;

/// Implementation details of [`export_delegate!`]; not a public API.
#[doc(hidden)]
pub mod __private {
    pub use crate::export::{root_module, Exported, PluginState};
    use abi_stable::library::{CheckTypeLayout, LibHeader, RootModuleResult};

    /// The exported symbol's name; a test pins it to `abi_stable::library::ROOT_MODULE_LOADER_NAME`.
    pub const ROOT_SYMBOL: &str = "_1as_0lib_1header_0root_bmodule_bloader";

    /// What `#[abi_stable::export_root_module]` writes into the exported static, for `delegate_root`.
    pub const fn lib_header(constructor: extern "C" fn() -> RootModuleResult) -> LibHeader {
        // SAFETY: `constructor` is the macro's `__delegate_abi_root_loader`, which returns
        // `__call_root_module_loader(delegate_root)`: a `PrefixRef<ErasedPrefix>` erased from the
        // `DelegateRootRef` that `delegate_root` returns, as `from_constructor` requires.
        unsafe {
            LibHeader::from_constructor::<crate::abi::DelegateRootRef>(constructor, CheckTypeLayout::Yes)
        }
    }

    /// Runs the root-module loader as `#[export_root_module]` does (catching panics).
    pub fn call_root_module_loader(loader: fn() -> crate::abi::DelegateRootRef) -> RootModuleResult {
        abi_stable::library::__call_root_module_loader(loader)
    }

    pub use abi_stable::library::LibHeader as Header;
    pub use abi_stable::library::RootModuleResult as LoaderResult;
}

/// Writes all FFI glue that makes a [`Delegate`] implementation a plugin.
///
/// # Usage
///
/// In the plugin crate (`crate-type = ["cdylib"]`, or `["cdylib", "rlib"]` to also embed it), at the crate
/// root, once per crate:
///
/// ```text
/// pub struct ReferenceDelegate { /* ... */ }
/// impl delegate_abi::Delegate for ReferenceDelegate { /* ... */ }
///
/// delegate_abi::export_delegate!(ReferenceDelegate);
/// ```
///
/// It generates:
/// - `pub fn delegate_root() -> delegate_abi::abi::DelegateRootRef`: the root module, for a host that links
///   the crate as an rlib (`Plugin::embedded(my_plugin::delegate_root())`); the same tables a dylib exports;
/// - the exported root-module symbol the host finds in the dylib: exactly what abi_stable's
///   `#[export_root_module]` writes, spelled through `delegate-abi` so the plugin crate needs no direct
///   abi_stable dependency (the symbol is `abi_stable::library::ROOT_MODULE_LOADER_NAME`);
/// - a hidden `static` with the plugin's state (the delegate, built on first use by `Delegate::new`; the
///   poisoned flag; the negotiated tables) and a hidden trait impl tying the type to it.
///
/// The type must implement [`Delegate`]; `Delegate::info` must name at least one backend id. The exported
/// entries catch panics; the plugin announces ABI versions [`abi::AbiRange::CURRENT`].
///
/// Other forms, for tests and embedding-only crates:
/// - `export_delegate!(Type, abi = MIN..=MAX)`: announce another ABI range (to test negotiation);
/// - `export_delegate!(@embedded Type)` / `export_delegate!(@embedded Type, abi = MIN..=MAX)`: only
///   `delegate_root()` and the state, no exported symbol (several may live in one binary, each in its own
///   module).
#[macro_export]
macro_rules! export_delegate {
    (@embedded $ty:ty) => {
        $crate::export_delegate!(@with_range $ty, $crate::abi::AbiRange::CURRENT);
    };
    (@embedded $ty:ty, abi = $min:literal ..= $max:literal) => {
        $crate::export_delegate!(@with_range $ty, $crate::abi::AbiRange::new($min, $max));
    };
    (@with_range $ty:ty, $range:expr) => {
        const _: () = {
            static __DELEGATE_ABI_STATE: $crate::__private::PluginState<$ty> =
                $crate::__private::PluginState::new($range);
            impl $crate::__private::Exported for $ty {
                fn state() -> &'static $crate::__private::PluginState<$ty> {
                    &__DELEGATE_ABI_STATE
                }
            }
        };

        /// The plugin's root module, for embedding: `delegate_abi::host::Plugin::embedded(delegate_root())`.
        pub fn delegate_root() -> $crate::abi::DelegateRootRef {
            $crate::__private::root_module::<$ty>()
        }
    };
    (@export $ty:ty, $range:expr) => {
        $crate::export_delegate!(@with_range $ty, $range);

        /// The abi_stable root-module header the host looks up by name (hidden glue).
        #[doc(hidden)]
        #[unsafe(export_name = "_1as_0lib_1header_0root_bmodule_bloader")]
        pub static __DELEGATE_ABI_LIB_HEADER: $crate::__private::Header = {
            extern "C" fn __delegate_abi_root_loader() -> $crate::__private::LoaderResult {
                $crate::__private::call_root_module_loader(delegate_root)
            }
            $crate::__private::lib_header(__delegate_abi_root_loader)
        };
    };
    ($ty:ty) => {
        $crate::export_delegate!(@export $ty, $crate::abi::AbiRange::CURRENT);
    };
    ($ty:ty, abi = $min:literal ..= $max:literal) => {
        $crate::export_delegate!(@export $ty, $crate::abi::AbiRange::new($min, $max));
    };
}

#[cfg(test)]
mod tests {
    #[test]
    fn exported_symbol_is_abi_stables_root_module_loader_name() {
        assert_eq!(crate::__private::ROOT_SYMBOL, abi_stable::library::ROOT_MODULE_LOADER_NAME);
    }
}
