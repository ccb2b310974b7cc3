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
//! A doubling delegate, embedded (statically linked) and driven through the same tables a dylib would use:
//!
//! ```
//! use delegate_abi::host::{ArgList, Plugin};
//! use delegate_abi::{
//!     Compatibility, DTypeCode, Delegate, DelegateError, ExecuteArgs, InitContext, MemoryKind, PluginInfo,
//! };
//!
//! pub struct Doubler;
//!
//! impl Delegate for Doubler {
//!     type Handle = ();
//!     fn new() -> Self { Doubler }
//!     fn info() -> PluginInfo {
//!         // A constructor and `with_*` methods, never a struct literal: `PluginInfo` is `#[non_exhaustive]`,
//!         // so a field appended to it later (with the default an older plugin is read as) breaks no build.
//!         PluginInfo::new("doubler", "0.1.0")
//!             .with_backend("DoublerBackend")
//!             .with_wire_format("native", "^1")
//!             .with_memory_kinds([MemoryKind::Host])
//!             .with_binds_aliases_in_place(true)
//!     }
//!     fn compatibility(&self, _blob: &[u8]) -> Compatibility { Compatibility::Supported }
//!     fn init(&self, _ctx: InitContext<'_>) -> Result<(), DelegateError> { Ok(()) }
//!     fn execute(&self, _h: &mut (), args: &mut ExecuteArgs<'_>) -> Result<(), DelegateError> {
//!         // Typed slices: the dtype and alignment are checked, a mismatch is `InvalidArgument`.
//!         let ([input], [output]) = args.borrow_typed::<f32, 1, 1>([0], [1])?;
//!         for (o, i) in output.iter_mut().zip(input) { *o = i * 2.0; }
//!         Ok(())
//!     }
//! }
//!
//! // In the plugin's library crate: no exported symbol, only `delegate_root()` (see "Writing a third-party
//! // delegate plugin" below for the cdylib that exports it).
//! delegate_abi::export_delegate!(@embedded Doubler);
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let plugin = Plugin::embedded(delegate_root())?;
//!     assert_eq!(plugin.info().backends, ["DoublerBackend"]);
//!     let ctx = delegate_abi::InitContext { blob: b"", compile_specs: &[], runtime_specs: &[] };
//!     let mut instance = plugin.init(&ctx)?;
//!
//!     // Caller memory of the element type (so it is aligned for it), lent as bytes.
//!     let input = [1.5f32, -2.0];
//!     let mut output = [0f32; 2];
//!     let mut args = ArgList::with_capacity(2);
//!     args.push_input(bytemuck::cast_slice(&input), DTypeCode::F32, &[2], MemoryKind::Host)?;
//!     args.push_output(bytemuck::cast_slice_mut(&mut output), DTypeCode::F32, &[2], MemoryKind::Host)?;
//!     instance.execute(&mut args, None)?;
//!     drop(args);
//!     assert_eq!(output, [3.0, -4.0]);
//!     Ok(())
//! }
//! ```
//!
//! ## Writing a third-party delegate plugin
//!
//! 1. Make two crates: a library with the delegate, and a thin `cdylib` that exports it.
//!
//!    ```toml
//!    # my-delegate/Cargo.toml: the delegate, an ordinary rlib that any host may link
//!    [dependencies]
//!    delegate-abi = { path = "../kv-delegate/crates/delegate-abi" }   # see "Depending on delegate-abi"
//!    tracing = "0.1"                                                  # optional: logs reach the host
//!
//!    # my-delegate-plugin/Cargo.toml: the library the host loads from disk
//!    [lib]
//!    crate-type = ["cdylib"]
//!
//!    [dependencies]
//!    delegate-abi = { path = "../kv-delegate/crates/delegate-abi" }
//!    my-delegate = { path = "../my-delegate" }
//!    ```
//!
//!    Why two: the exported entry symbol has one fixed name (abi_stable's root-module loader), so one binary
//!    can link at most one crate that exports it. A library crate without it can be linked into any host
//!    next to other plugins and embedded with `Plugin::embedded(my_delegate::delegate_root())`; the thin
//!    crate adds the symbol only to the `.so` (`.dylib`, `.dll`). No direct `abi_stable` dependency is
//!    needed: the macro reaches it through `delegate-abi`.
//!
//! 2. Implement [`Delegate`] in the library (see the example above, and `plugins/reference` for a full one):
//!    - `info()` is metadata, read before anything else runs: name, version, the ExecuTorch backend ids
//!      you serve (the host routes blobs by these), the blob wire formats you read as semver ranges, the
//!      memory kinds you accept, and whether you bind aliased outputs in place;
//!    - `compatibility(blob)` answers from the header only, with a reason when it is not `Supported`;
//!    - `init` gets the blob borrowed for the call; keep what you derive from it in your `Handle`;
//!    - `execute` reaches memory only through [`ExecuteArgs::borrow`] (bytes) or
//!      [`ExecuteArgs::borrow_typed`] (`&[f32]`, `&mut [i64]`, ...), which refuse to hand out an inout and
//!      its in-place output at once; record copies with `record_reflect` / `record_staging`;
//!    - return [`DelegateError`]s with the right [`ErrorCode`]. Your own error type converts with `?` when
//!      it implements `std::error::Error` and `et_error::HasErrorCode` (`From<E>` keeps its code and
//!      message); a panic is caught, reported as `Internal` and poisons your plugin for the rest of the
//!      process.
//!
//!    Then give the library its root module, for hosts that embed it:
//!
//!    ```text
//!    delegate_abi::export_delegate!(@embedded MyDelegate);        // my-delegate/src/lib.rs
//!    ```
//!
//! 3. The thin crate's whole `src/lib.rs` exports it:
//!
//!    ```text
//!    delegate_abi::export_delegate!(my_delegate::MyDelegate);     // my-delegate-plugin/src/lib.rs
//!    ```
//!
//! 4. Build it, write its manifest, and list it:
//!
//!    ```text
//!    cargo build -p my-delegate-plugin                 # target/debug/libmy_delegate_plugin.so
//!    delegate-host plugin-manifest target/debug/libmy_delegate_plugin.so
//!                                                      # writes target/debug/libmy_delegate_plugin.plugin.json
//!    delegate-host plugins --plugin-dir target/debug   # lists it: path, name, version, ABI, backends, status
//!    ```
//!
//!    Hosts open no library on the plugin path until a program needs one of its backends, and then only if
//!    its bytes are what its **manifest** (`libfoo.plugin.json`, next to `libfoo.so`) says: discovery reads
//!    the manifest, hashes the library, and runs none of its code before the SHA-256 agrees. So:
//!    - a library without a manifest is listed `not loaded: no manifest` and serves nothing (`--probe` loads
//!      every library anyway, for a directory you trust);
//!    - **after every rebuild, write the manifest again**: a stale one is listed `rejected: sha256: manifest
//!      ..., library ...`, and the host falls back to the next plugin serving the backend (the embedded
//!      reference delegate, for `ReferenceBackend`). Both messages name the library and the
//!      `delegate-host plugin-manifest LIB` command that fixes them;
//!    - `plugin-manifest` loads the library once, as the host will, and writes what it says about itself
//!      (the `info()` above) plus the file's SHA-256; never edit a manifest by hand: when the library is
//!      loaded its self-description is compared with the manifest, and a difference passes it over.
//!
//!    A plugin the host cannot use is listed as `rejected: <reason>` (e.g. `plugin speaks ABI 2..=3, host
//!    1..=1`) and the others still load. Among the plugins serving one backend, the highest version wins; the
//!    listing ends with which plugin serves each backend, where it runs, and why. Put the directory in
//!    `DELEGATE_PLUGIN_PATH` (colon-separated) to find it without `--plugin-dir`.
//!
//! 5. Decide whether it runs isolated. `delegate-host plugin-manifest --isolate LIB` writes `"isolate":
//!    true`: hosts then never load the library into their own process but run it in a worker process
//!    (`delegate-host worker`), so a crash or a hang fails one call instead of the host (`--isolate` does
//!    this for every library plugin). `plugins` (column `RUNS`, key `isolated`) and `run` (a `plugin for
//!    ...` line, key `plugins`) say where each plugin runs. What it changes for your code:
//!    - each instance (each `init`, i.e. each delegate call of a program) gets a worker of its own, and a
//!      worker builds your delegate with `Delegate::new` itself: **plugin-wide state (counters, caches,
//!      options set with `set_option`) lives once per worker**, not once per host, and starts over when a
//!      worker is restarted after a failure;
//!    - your memory is the host's through shared memory files (host memory) or CUDA IPC (device memory):
//!      pinned and managed arguments are refused for an isolated call;
//!    - calls have a deadline (`--deadline-ms`); a worker that misses it is killed and the call fails.
//!
//! ### Depending on delegate-abi
//!
//! The crates of this workspace are not published yet, so `delegate-abi = "0.1"` does not resolve. Depend
//! on a checkout instead, by path or by git (pin a revision: the ABI version is negotiated at load time,
//! but the Rust API follows semver only once published):
//!
//! ```toml
//! delegate-abi = { path = "../kv-delegate/crates/delegate-abi" }
//! delegate-abi = { git = "https://example.invalid/kv-delegate", rev = "<commit>" }
//! ```
//!
//! ### Blobs and payloads
//!
//! A native blob names its payload kind (`blob_format::model::PayloadKind`). A third-party engine format
//! uses its own kind string, which reads back as `PayloadKind::Other`; check it in `compatibility` and
//! `init` and refuse other kinds with a reason.
//!
//! ### Which argument is which
//!
//! A call's arguments are the blob's bindings in the order the header lists them, counting only the
//! bindings with `threaded` set: argument `i` is the `i`-th threaded binding, which names the engine tensor
//! it binds, its role, and (when recorded) its dtype and shape. An unthreaded binding (e.g. an aliased
//! output whose cache is not a registered buffer) takes no position: bind it to its aliased input's storage
//! yourself. Resolve every position to your engine's tensor **by that name** once, in `init`, and check each
//! call's arguments against it: [`check`] has the count, dtype, shape, size and writability checks and their
//! errors (what the reference and CUDA delegates use).
//!
//! Why by name: upstream's runtime bound by position, and positions do not survive lowering reliably.
//! TensorRT appends aliased KV-cache outputs after the user outputs while ExecuTorch may move
//! buffer-mutation outputs first, and two cases drop an aliased output argument altogether (two engines
//! aliasing one buffer; a cache that is not a registered buffer), shifting every later position. A blob
//! that records, per argument, the tensor it binds and whether it is threaded removes that whole class.
//!
//! ### Aliased outputs: zero-copy and copy-back
//!
//! An output that aliases an input (a KV-cache update, `AliasKind::KvCacheUpdate`) has its own argument
//! position, but what that slot *is* depends on the host's mode:
//!
//! - **zero-copy** (what `delegate-host` does by default): the output argument is the input's own storage,
//!   same pointer and size ([`TensorArg::same_storage`]; the input is flagged inout). Write the update into
//!   the cache once; the slot already holds it, and nothing is copied.
//! - **copy-back** (upstream ExecuTorch's layout, `--mode copy-back`): the output argument is a separate
//!   buffer. After `execute` the host copies that slot into its buffer, as ExecuTorch's buffer-mutation
//!   write-back `copy_(buffer, slot)` does. So the plugin must write the **output slot**: an update made
//!   only in place, into the input, is overwritten by the slot's stale bytes when the host copies back.
//!   Engines that update the cache in place (TensorRT's KV-cache layer, the reference graph) then copy the
//!   input into the slot (a "reflect", as upstream's delegate does after `enqueueV3`) and count it with
//!   [`ExecuteArgs::record_reflect`].
//!
//! Tell them apart per call with `same_storage` (the reference delegate does exactly this), never by a
//! setting: the host decides, and `binds_aliases_in_place` in your metadata only says you can take the
//! zero-copy form.
//!
//! ### Streams and completion
//!
//! The host may pass a CUDA stream. Without one, your results must be complete when `execute` returns; with
//! one, they may complete later on that stream, and the host waits for the stream before touching the
//! memory. The exact rule is on [`Delegate::execute`].
//!
//! ### Capabilities
//!
//! State what a host must know before it runs anything in [`PluginInfo::capabilities`] ([`Capabilities`]:
//! memory kinds you update in place, whether you take the caller's stream, can be captured into a CUDA graph,
//! read positions from device memory, serve rewinds and forks without a new `init`, and your most positions).
//! Build it from `Capabilities::default()` with its `with_*` methods (`PluginInfo::with_capabilities`); the
//! defaults claim nothing, and a host refuses at load what you do not claim (a `--cuda-graph` run of a plugin
//! without `cuda_graph_capturable`).
//!
//! ### Structs that grow
//!
//! [`PluginInfo`], [`WireFormatSupport`] and [`Capabilities`] are `#[non_exhaustive]`: build them with
//! their constructors and `with_*` methods (as the example above does), never with a struct literal or
//! struct update syntax, and a field appended in a later release breaks no plugin's build. A public function
//! that is replaced stays one release as a `#[deprecated]` shim over its replacement.
//!
//! ### Sequence state of your own
//!
//! A host moves a sequence by moving the caller's caches: it rewinds them to an earlier position, restores
//! them from a file, or forks them into a second set that the same instance then runs. If an instance keeps
//! state of its own that later calls read (caches it holds itself, a recurrent state, a position counter),
//! answer `true` from [`Delegate::keeps_sequence_state`] for that instance: the host then refuses those
//! moves for the program holding it, in one line naming the call and your plugin, instead of running your
//! instance on state of another position or sequence. Its default answers what your capabilities state for
//! every instance (`!rewind_fork_without_reinit`); override it when the answer depends on the blob, as the
//! reference delegate does (state for a graph with delegate-owned `state`, none otherwise). A host asks an
//! instance at any time after `init`, never during `execute`.
//!
//! ## Feature Flags
//!
//! - `test-support`: the `testing` module, delegates in a few lines for tests, benchmarks and test plugins
//!   (`plugins/abi-test`, `plugins/abi-test-future`). Not for production plugins.
//!
//! [abi_stable]: https://docs.rs/abi_stable/0.11
#![deny(missing_docs)]

pub mod abi;
mod build;
pub mod capabilities;
pub mod check;
mod conv;
pub mod delegate;
#[doc(hidden)]
pub mod export;
pub mod host;
mod logging;
pub mod tensor;
#[cfg(feature = "test-support")]
pub mod testing;

pub use capabilities::Capabilities;
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
/// A plugin is two crates (see the crate docs, "Writing a third-party delegate plugin"):
///
/// ```text
/// // my-delegate (an rlib): the Delegate implementation, embeddable by any host.
/// pub struct MyDelegate { /* ... */ }
/// impl delegate_abi::Delegate for MyDelegate { /* ... */ }
/// delegate_abi::export_delegate!(@embedded MyDelegate);      // pub fn delegate_root()
///
/// // my-delegate-plugin (a cdylib): the library the host loads from disk.
/// delegate_abi::export_delegate!(my_delegate::MyDelegate);   // the exported entry symbol
/// ```
///
/// `export_delegate!(Type)` generates, in the module where it is written:
/// - the exported root-module symbol the host finds in the dylib: exactly what abi_stable's
///   `#[export_root_module]` writes, spelled through `delegate-abi` so the plugin crate needs no direct
///   abi_stable dependency (the symbol is `abi_stable::library::ROOT_MODULE_LOADER_NAME`). It has a fixed
///   name, so **one binary links at most one crate that writes it**: write it only in a `cdylib` crate,
///   never in a library another binary links;
/// - `pub fn delegate_root() -> delegate_abi::abi::DelegateRootRef`: the root module, the same tables the
///   dylib exports;
/// - a private marker type (`__DelegateAbiPlugin`) tying the type to a hidden `static` with the plugin's
///   state (the delegate, built on first use by `Delegate::new`; the poisoned flag; the negotiated tables).
///
/// `export_delegate!(@embedded Type)` generates the last two only: no exported symbol, so any number of
/// such crates (and modules) link into one binary, and a host embeds each with
/// `Plugin::embedded(my_delegate::delegate_root())`. The type may come from another crate.
///
/// Write each form at most once per module. The type must implement [`Delegate`]; `Delegate::info` must name
/// at least one backend id. The exported entries catch panics; the plugin announces ABI versions
/// [`abi::AbiRange::CURRENT`], or `MIN..=MAX` with `export_delegate!(Type, abi = MIN..=MAX)` /
/// `export_delegate!(@embedded Type, abi = MIN..=MAX)` (to test negotiation).
#[macro_export]
macro_rules! export_delegate {
    (@embedded $ty:ty) => {
        $crate::export_delegate!(@with_range $ty, $crate::abi::AbiRange::CURRENT);
    };
    (@embedded $ty:ty, abi = $min:literal ..= $max:literal) => {
        $crate::export_delegate!(@with_range $ty, $crate::abi::AbiRange::new($min, $max));
    };
    (@with_range $ty:ty, $range:expr) => {
        /// Ties the exported delegate to its plugin state (hidden glue of `delegate_abi::export_delegate!`;
        /// private, so the delegate type may be private too).
        #[doc(hidden)]
        enum __DelegateAbiPlugin {}

        impl $crate::__private::Exported for __DelegateAbiPlugin {
            type Delegate = $ty;

            fn state() -> &'static $crate::__private::PluginState<$ty> {
                static __DELEGATE_ABI_STATE: $crate::__private::PluginState<$ty> =
                    $crate::__private::PluginState::new($range);
                &__DELEGATE_ABI_STATE
            }
        }

        /// The plugin's root module, for embedding: `delegate_abi::host::Plugin::embedded(delegate_root())`.
        pub fn delegate_root() -> $crate::abi::DelegateRootRef {
            $crate::__private::root_module::<__DelegateAbiPlugin>()
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
