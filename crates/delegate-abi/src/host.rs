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

use std::fmt;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use abi_stable::library::{lib_header_from_path, LibraryError};
use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::std_types::{RResult, RSlice, RStr};
use abi_stable::StableAbi;

use crate::abi::{
    AbiRange, DelegateRootRef, HostOffer, PluginModuleRef, RError, ROptionValue, RSpec, RawHandle,
    ROOT_INTERFACE_VERSION,
};
use crate::delegate::{
    Compatibility, CudaStream, DelegateError, ErrorCode, ExecStats, InitContext, OptionValue, PluginInfo,
};
use crate::tensor::{DTypeCode, MemoryKind, TensorArg, ARG_INOUT, ARG_WRITABLE, MAX_RANK};

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

/// Why a plugin could not be loaded. The message never repeats the path (callers list it beside it);
/// [`LoadError::path`] gives it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The dynamic loader could not open the file (not a shared library, wrong architecture, missing
    /// dependency).
    #[error("not a loadable library: {reason}")]
    NotALibrary {
        /// The file.
        path: PathBuf,
        /// The loader's words.
        reason: String,
    },
    /// The library loads but exports no delegate entry symbol: it is not a delegate plugin.
    #[error("not a delegate plugin: no `{symbol}` entry symbol")]
    NoEntrySymbol {
        /// The file.
        path: PathBuf,
        /// The missing symbol.
        symbol: String,
    },
    /// The plugin was built with an incompatible abi_stable (its header or C ABI self-test differs).
    #[error("plugin was built with an incompatible abi_stable: {detail}")]
    IncompatibleAbiStable {
        /// The file.
        path: PathBuf,
        /// One line.
        detail: String,
    },
    /// The permanent root interface version differs (this never happens between releases of this crate).
    #[error("plugin root interface is {found}, host expects {expected}")]
    RootVersion {
        /// The file.
        path: PathBuf,
        /// Host's.
        expected: String,
        /// Plugin's.
        found: String,
    },
    /// abi_stable's layout check of the root module failed.
    #[error(
        "plugin root module layout is incompatible: plugin built with {found}, host with {expected} ({detail})"
    )]
    LayoutMismatch {
        /// The file.
        path: PathBuf,
        /// `delegate-abi <version>` of the host.
        expected: String,
        /// `<crate> <version>` that defined the plugin's root module.
        found: String,
        /// First line of abi_stable's report.
        detail: String,
    },
    /// The plugin's entry failed or panicked while building its root module.
    #[error("plugin entry failed: {detail}")]
    EntryFailed {
        /// The file, `None` for an embedded plugin.
        path: Option<PathBuf>,
        /// What happened.
        detail: String,
    },
    /// No ABI version in common.
    #[error("plugin speaks ABI {plugin}, host {host}")]
    AbiVersionDisjoint {
        /// The file, `None` for an embedded plugin.
        path: Option<PathBuf>,
        /// What the plugin speaks.
        plugin: AbiRange,
        /// What the host offered.
        host: AbiRange,
    },
    /// The plugin refused the handshake for another reason (e.g. its metadata panicked).
    #[error("plugin refused the handshake: {message}")]
    Refused {
        /// The file, `None` for an embedded plugin.
        path: Option<PathBuf>,
        /// What the plugin speaks.
        plugin: AbiRange,
        /// The plugin's words.
        message: String,
    },
    /// The plugin answered a version outside the host's offer (a plugin bug).
    #[error("plugin chose ABI {chosen}, outside the host's offer {host} (plugin speaks {plugin})")]
    BadAnswer {
        /// The file, `None` for an embedded plugin.
        path: Option<PathBuf>,
        /// What it chose.
        chosen: u32,
        /// What the host offered.
        host: AbiRange,
        /// What the plugin speaks.
        plugin: AbiRange,
    },
    /// The plugin's metadata is unusable (e.g. no backend id).
    #[error("plugin metadata is invalid: {reason}")]
    InvalidInfo {
        /// The file, `None` for an embedded plugin.
        path: Option<PathBuf>,
        /// What is wrong.
        reason: String,
    },
}

impl LoadError {
    /// The file that failed, `None` for an embedded plugin.
    pub fn path(&self) -> Option<&Path> {
        match self {
            LoadError::NotALibrary { path, .. }
            | LoadError::NoEntrySymbol { path, .. }
            | LoadError::IncompatibleAbiStable { path, .. }
            | LoadError::RootVersion { path, .. }
            | LoadError::LayoutMismatch { path, .. } => Some(path),
            LoadError::EntryFailed { path, .. }
            | LoadError::AbiVersionDisjoint { path, .. }
            | LoadError::Refused { path, .. }
            | LoadError::BadAnswer { path, .. }
            | LoadError::InvalidInfo { path, .. } => path.as_deref(),
        }
    }
}

impl et_error::HasErrorCode for LoadError {
    fn error_code(&self) -> ErrorCode {
        match self {
            LoadError::NotALibrary { .. } => ErrorCode::AccessFailed,
            LoadError::NoEntrySymbol { .. } | LoadError::InvalidInfo { .. } => ErrorCode::InvalidProgram,
            LoadError::EntryFailed { .. } => ErrorCode::Internal,
            LoadError::IncompatibleAbiStable { .. }
            | LoadError::RootVersion { .. }
            | LoadError::LayoutMismatch { .. }
            | LoadError::AbiVersionDisjoint { .. }
            | LoadError::Refused { .. }
            | LoadError::BadAnswer { .. } => ErrorCode::NotSupported,
        }
    }
}

/// First non-empty line of a (possibly huge, multi-line) report, trimmed to 200 characters.
fn one_line(text: &str) -> String {
    let line = text.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("no details");
    let mut out: String = line.chars().take(200).collect();
    if line.chars().count() > 200 {
        out.push('…');
    }
    out
}

/// `<crate> <version>` that defined the root module's layout. `DelegateRootRef` is abi_stable's `PrefixRef`,
/// so look through it to the prefix struct it points to (defined by `delegate-abi`).
fn defining_crate(layout: &'static abi_stable::type_layout::TypeLayout) -> String {
    let mut layout = layout;
    if layout.package().as_str() == "abi_stable" {
        if let Some(pointee) = layout.shared_vars().type_layouts().first() {
            layout = pointee();
        }
    }
    let (package, version) = layout.package_and_version();
    format!("{} {}", package, version.version)
}

fn host_abi_crate() -> String {
    defining_crate(<DelegateRootRef as StableAbi>::LAYOUT)
}

fn map_library_error(path: &Path, err: LibraryError, plugin_layout: Option<String>) -> LoadError {
    let path = path.to_path_buf();
    match err {
        LibraryError::OpenError { err, .. } => {
            // The loader's message usually starts with the path; callers print the path already.
            let text = err.to_string();
            let prefix = format!("{}: ", path.display());
            let reason = one_line(text.strip_prefix(&prefix).unwrap_or(&text));
            LoadError::NotALibrary { path, reason }
        }
        LibraryError::GetSymbolError { symbol, .. } => {
            let symbol = String::from_utf8_lossy(&symbol).trim_end_matches('\0').to_string();
            LoadError::NoEntrySymbol { path, symbol }
        }
        LibraryError::IncompatibleVersionNumber { expected_version, actual_version, .. } => {
            LoadError::RootVersion {
                path,
                expected: expected_version.to_string(),
                found: actual_version.to_string(),
            }
        }
        LibraryError::ParseVersionError(e) => LoadError::RootVersion {
            path,
            expected: ROOT_INTERFACE_VERSION.into(),
            found: one_line(&e.to_string()),
        },
        LibraryError::AbiInstability(report) => LoadError::LayoutMismatch {
            path,
            expected: host_abi_crate(),
            found: plugin_layout.unwrap_or_else(|| "an unknown crate version".into()),
            detail: summarize_layout_report(&report.to_string()),
        },
        LibraryError::InvalidAbiHeader(header) => LoadError::IncompatibleAbiStable {
            path,
            detail: format!(
                "plugin's abi_stable header is {header:?}, host's {:?}",
                abi_stable::library::AbiHeader::VALUE
            ),
        },
        LibraryError::InvalidCAbi { expected, found } => LoadError::IncompatibleAbiStable {
            path,
            detail: format!(
                "C ABI self-test expected {}, found {}",
                one_line(&expected.to_string()),
                one_line(&found.to_string())
            ),
        },
        LibraryError::RootModule { err, .. } => {
            LoadError::EntryFailed { path: Some(path), detail: one_line(&err.to_string()) }
        }
        LibraryError::Many(errors) => match errors.into_iter().next() {
            Some(first) => map_library_error(&path, first, plugin_layout),
            None => LoadError::EntryFailed { path: Some(path), detail: "unknown abi_stable error".into() },
        },
    }
}

/// abi_stable's layout report is dozens of lines; keep the line that names the first difference.
fn summarize_layout_report(report: &str) -> String {
    let interesting = report.lines().map(str::trim).find(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("error") || l.contains("mismatch") || l.contains("expected") || l.contains("too many")
    });
    one_line(interesting.unwrap_or(report))
}

/// A loaded, negotiated plugin. Cheap to share: `Send + Sync`; the library stays loaded forever.
#[derive(Clone)]
pub struct Plugin {
    inner: Arc<PluginInner>,
}

struct PluginInner {
    path: Option<PathBuf>,
    module: PluginModuleRef,
    info: PluginInfo,
    version: semver::Version,
    abi_version: u32,
    plugin_range: AbiRange,
}

impl fmt::Debug for Plugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Plugin")
            .field("path", &self.inner.path)
            .field("name", &self.inner.info.name)
            .field("version", &self.inner.info.version)
            .field("abi_version", &self.inner.abi_version)
            .finish()
    }
}

impl Plugin {
    /// Loads the plugin library at `path`, checks its root module, negotiates the ABI version and reads
    /// its metadata. Runs no plugin `init` (nor `Delegate::new`).
    pub fn load(path: &Path, config: &HostConfig) -> Result<Plugin, LoadError> {
        let header = lib_header_from_path(path).map_err(|e| map_library_error(path, e, None))?;
        let plugin_layout = header.layout().map(defining_crate);
        let root: DelegateRootRef = header
            .init_root_module::<DelegateRootRef>()
            .map_err(|e| map_library_error(path, e, plugin_layout))?;
        Plugin::handshake(root, Some(path.to_path_buf()), config, config.forward_logs)
    }

    /// A plugin linked into this binary, from the `delegate_root()` that [`crate::export_delegate!`]
    /// generated (e.g. `reference_delegate::delegate_root()`), through exactly the same tables as a dylib.
    pub fn embedded(root: DelegateRootRef) -> Result<Plugin, LoadError> {
        Plugin::embedded_with(root, &HostConfig::default())
    }

    /// [`Plugin::embedded`] with a configuration (e.g. an ABI range to test negotiation). Logs are never
    /// forwarded: an embedded plugin already shares this process's `tracing`.
    pub fn embedded_with(root: DelegateRootRef, config: &HostConfig) -> Result<Plugin, LoadError> {
        Plugin::handshake(root, None, config, false)
    }

    fn handshake(
        root: DelegateRootRef,
        path: Option<PathBuf>,
        config: &HostConfig,
        forward_logs: bool,
    ) -> Result<Plugin, LoadError> {
        let host = config.abi_range;
        // One small leak per load: the offer is a prefix type, which abi_stable hands out as 'static.
        let offer = HostOffer {
            abi: host,
            forward_logs,
            log: crate::logging::host_log,
            log_enabled: crate::logging::host_log_enabled,
        }
        .leak_into_prefix();
        let negotiated = match (root.negotiate())(offer) {
            RResult::ROk(n) => n,
            RResult::RErr(refusal) => {
                let plugin = refusal.plugin_range;
                return Err(if crate::abi::negotiate(host, plugin).is_err() {
                    LoadError::AbiVersionDisjoint { path, plugin, host }
                } else {
                    LoadError::Refused { path, plugin, message: refusal.message.into_string() }
                });
            }
        };
        let plugin = negotiated.plugin_range;
        if !host.contains(negotiated.version) || !plugin.contains(negotiated.version) {
            return Err(LoadError::BadAnswer { path, chosen: negotiated.version, host, plugin });
        }
        let module = negotiated.module;
        let info = (module.info())().to_info();
        if info.name.trim().is_empty() {
            return Err(LoadError::InvalidInfo { path, reason: "the plugin name is empty".into() });
        }
        if info.backends.is_empty() || info.backends.iter().any(|b| b.trim().is_empty()) {
            return Err(LoadError::InvalidInfo {
                path,
                reason: format!("plugin {} names no backend id, or an empty one", info.name),
            });
        }
        let version = match semver::Version::parse(&info.version) {
            Ok(version) => version,
            Err(err) => {
                let reason = format!(
                    "plugin {} has version '{}', which is not semver: {err}",
                    info.name, info.version
                );
                return Err(LoadError::InvalidInfo { path, reason });
            }
        };
        for wire in &info.wire_formats {
            if let Err(err) = semver::VersionReq::parse(&wire.versions) {
                let reason = format!(
                    "plugin {} reads wire format {} versions '{}', which is not a semver range: {err}",
                    info.name, wire.format, wire.versions
                );
                return Err(LoadError::InvalidInfo { path, reason });
            }
        }
        Ok(Plugin {
            inner: Arc::new(PluginInner {
                path,
                module,
                info,
                version,
                abi_version: negotiated.version,
                plugin_range: plugin,
            }),
        })
    }

    /// The metadata, read at load time.
    pub fn info(&self) -> &PluginInfo {
        &self.inner.info
    }

    /// The plugin version, parsed (checked to be semver at load time).
    pub fn version(&self) -> &semver::Version {
        &self.inner.version
    }

    /// The negotiated ABI version.
    pub fn abi_version(&self) -> u32 {
        self.inner.abi_version
    }

    /// The ABI versions the plugin speaks.
    pub fn abi_range(&self) -> AbiRange {
        self.inner.plugin_range
    }

    /// The file it was loaded from; `None` when embedded.
    pub fn path(&self) -> Option<&Path> {
        self.inner.path.as_deref()
    }

    /// `Delegate::is_available`. A poisoned plugin is not available.
    pub fn is_available(&self) -> bool {
        matches!((self.inner.module.is_available())(), RResult::ROk(true))
    }

    /// The message of the panic that poisoned the plugin, if one did.
    pub fn poisoned(&self) -> Option<String> {
        // Guarded entry: present since ABI 1, read through its accessor so an older table answers `None`.
        let entry = self.inner.module.poison_message()?;
        entry().into_option().map(|s| s.into_string())
    }

    /// The header-only answer about `blob`.
    pub fn compatibility(&self, blob: &[u8]) -> Result<Compatibility, DelegateError> {
        (self.inner.module.compatibility())(RSlice::from_slice(blob))
            .into_result()
            .map(Compatibility::from)
            .map_err(RError::into_delegate)
    }

    /// Prepares a blob; the blob is lent to the plugin for the call only (no copy).
    pub fn init(&self, ctx: &InitContext<'_>) -> Result<Instance, DelegateError> {
        let compile: Vec<RSpec<'_>> = ctx.compile_specs.iter().map(spec).collect();
        let runtime: Vec<RSpec<'_>> = ctx.runtime_specs.iter().map(spec).collect();
        let handle = (self.inner.module.init())(
            RSlice::from_slice(ctx.blob),
            RSlice::from_slice(&compile),
            RSlice::from_slice(&runtime),
        )
        .into_result()
        .map_err(RError::into_delegate)?;
        Ok(Instance { module: self.inner.module, handle, plugin: self.clone() })
    }

    /// `Delegate::set_option`.
    pub fn set_option(&self, key: &str, value: OptionValue) -> Result<(), DelegateError> {
        (self.inner.module.set_option())(RStr::from_str(key), ROptionValue::from(value))
            .into_result()
            .map_err(RError::into_delegate)
    }

    /// `Delegate::get_option`.
    pub fn get_option(&self, key: &str) -> Result<OptionValue, DelegateError> {
        (self.inner.module.get_option())(RStr::from_str(key))
            .into_result()
            .map(OptionValue::from)
            .map_err(RError::into_delegate)
    }
}

fn spec<'a>(s: &crate::delegate::Spec<'a>) -> RSpec<'a> {
    RSpec { key: RStr::from_str(s.key), value: RSlice::from_slice(s.value) }
}

/// One initialised delegate handle. Dropping it calls the plugin's `destroy`.
pub struct Instance {
    module: PluginModuleRef,
    handle: RawHandle,
    plugin: Plugin,
}

// SAFETY: the handle is the plugin's `Box<D::Handle>` with `D::Handle: Send` (required by `Delegate`), and
// `Instance` hands it to the plugin only through `&mut self` (execute) or by value (drop), so moving the
// instance to another thread moves exclusive ownership of the handle.
unsafe impl Send for Instance {}

impl fmt::Debug for Instance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Instance")
            .field("plugin", &self.plugin.info().name)
            .field("handle", &self.handle)
            .finish()
    }
}

impl Instance {
    /// Runs one call with `args` and the caller's `stream`; returns the plugin's copy counters.
    ///
    /// Allocates nothing on success.
    #[inline]
    pub fn execute(
        &mut self,
        args: &mut ArgList<'_>,
        stream: Option<CudaStream>,
    ) -> Result<ExecStats, DelegateError> {
        let mut stats = ExecStats::default();
        let stream = stream.map_or(std::ptr::null_mut(), |s| s.0);
        match (self.module.execute())(self.handle, RSlice::from_slice(&args.args), stream, &mut stats) {
            RResult::ROk(()) => Ok(stats),
            RResult::RErr(err) => Err(err.into_delegate()),
        }
    }

    /// The plugin this instance belongs to.
    pub fn plugin(&self) -> &Plugin {
        &self.plugin
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        if let RResult::RErr(err) = (self.module.destroy())(self.handle) {
            tracing::warn!(plugin = %self.plugin.info().name, "destroy failed: {}", err.into_delegate());
        }
    }
}

/// Why an [`ArgList`] refused an argument.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ArgError {
    /// More dimensions than a [`TensorArg`] carries.
    #[error("argument {index}: rank {rank} exceeds the maximum {max}", max = MAX_RANK)]
    RankTooLarge {
        /// Position the argument would take.
        index: usize,
        /// Its rank.
        rank: usize,
    },
    /// A negative extent, or a product that overflows.
    #[error("argument {index}: shape {shape:?} has a negative extent or overflows")]
    BadShape {
        /// Position the argument would take.
        index: usize,
        /// The shape.
        shape: Vec<i64>,
    },
    /// Buffer size differs from `dtype size × number of elements`.
    #[error("argument {index}: {dtype}{shape:?} needs {expected} bytes, the buffer has {found}")]
    SizeMismatch {
        /// Position the argument would take.
        index: usize,
        /// Element type.
        dtype: DTypeCode,
        /// Shape.
        shape: Vec<i64>,
        /// `dtype size × numel`.
        expected: u64,
        /// Buffer length.
        found: u64,
    },
    /// A Rust slice is host memory; device memory goes through [`ArgList::push_raw`].
    #[error(
        "argument {index}: a borrowed slice cannot be {memory} memory; use push_raw for device pointers"
    )]
    NotHostVisible {
        /// Position the argument would take.
        index: usize,
        /// The kind asked for.
        memory: MemoryKind,
    },
    /// The slot is from another list, from before [`ArgList::clear`], or not an inout argument.
    #[error("argument {index}: slot {slot} is not an inout argument of this list ({why})")]
    BadSlot {
        /// Position the argument would take.
        index: usize,
        /// The slot's position.
        slot: usize,
        /// Which check failed.
        why: &'static str,
    },
}

impl et_error::HasErrorCode for ArgError {
    fn error_code(&self) -> ErrorCode {
        ErrorCode::InvalidArgument
    }
}

/// A handle to an argument of an [`ArgList`], used to alias an output onto an inout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    list: u64,
    generation: u64,
    index: usize,
}

impl Slot {
    /// Position of the argument in the call.
    pub fn index(self) -> usize {
        self.index
    }
}

/// The arguments of one `execute`, tied to the borrows of the caller memory they describe.
///
/// Built safely: inputs borrow `&'a [u8]`, outputs and inouts `&'a mut [u8]`, so nothing else can touch a
/// written buffer while the list lives. [`ArgList::push_output_in_place`] makes an output share an inout's
/// storage (zero-copy aliasing), the one sharing the ABI allows. [`ArgList::clear`] keeps capacity and
/// [`ArgList::recycle`] also releases the borrows, so a decode loop reuses one list without allocating.
pub struct ArgList<'a> {
    args: Vec<TensorArg>,
    id: u64,
    generation: u64,
    _borrows: PhantomData<&'a mut [u8]>,
}

impl fmt::Debug for ArgList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.args.iter()).finish()
    }
}

impl Default for ArgList<'_> {
    fn default() -> Self {
        ArgList::new()
    }
}

impl<'a> ArgList<'a> {
    /// An empty list.
    pub fn new() -> ArgList<'a> {
        ArgList::with_capacity(0)
    }

    /// An empty list with room for `capacity` arguments.
    pub fn with_capacity(capacity: usize) -> ArgList<'a> {
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        ArgList {
            args: Vec::with_capacity(capacity),
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            generation: 0,
            _borrows: PhantomData,
        }
    }

    /// Number of arguments.
    pub fn len(&self) -> usize {
        self.args.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.args.is_empty()
    }

    /// The arguments as they cross.
    pub fn as_slice(&self) -> &[TensorArg] {
        &self.args
    }

    /// Removes every argument, keeping capacity. Slots handed out before are refused afterwards.
    pub fn clear(&mut self) {
        self.args.clear();
        self.generation += 1;
    }

    /// Empties the list and releases its borrows, keeping its capacity, so the next step can borrow the
    /// same buffers again (a list's lifetime is fixed, so [`ArgList::clear`] alone cannot do that):
    ///
    /// ```
    /// # use delegate_abi::{host::ArgList, DTypeCode, MemoryKind};
    /// let mut cache = vec![0u8; 16];
    /// let mut spare: ArgList<'static> = ArgList::with_capacity(8);
    /// for _step in 0..3 {
    ///     let mut args = spare.recycle();
    ///     args.push_inout(&mut cache, DTypeCode::F32, &[4], MemoryKind::Host)?;
    ///     // instance.execute(&mut args, None)?;
    ///     spare = args.recycle();
    /// }
    /// # Ok::<(), delegate_abi::host::ArgError>(())
    /// ```
    pub fn recycle<'b>(mut self) -> ArgList<'b> {
        self.clear();
        ArgList {
            args: std::mem::take(&mut self.args),
            id: self.id,
            generation: self.generation,
            _borrows: PhantomData,
        }
    }

    fn slot(&self, index: usize) -> Slot {
        Slot { list: self.id, generation: self.generation, index }
    }

    fn describe(
        &self,
        dtype: DTypeCode,
        shape: &[i64],
        memory: MemoryKind,
        data: *mut std::ffi::c_void,
        nbytes: usize,
    ) -> Result<TensorArg, ArgError> {
        let index = self.args.len();
        let mut arg = TensorArg::describe(dtype, shape, memory)
            .ok_or(ArgError::RankTooLarge { index, rank: shape.len() })?;
        let numel = arg.numel().ok_or_else(|| ArgError::BadShape { index, shape: shape.to_vec() })?;
        let expected = numel
            .checked_mul(dtype.size_bytes() as u64)
            .ok_or_else(|| ArgError::BadShape { index, shape: shape.to_vec() })?;
        if expected != nbytes as u64 {
            return Err(ArgError::SizeMismatch {
                index,
                dtype,
                shape: shape.to_vec(),
                expected,
                found: nbytes as u64,
            });
        }
        arg.data = data;
        arg.nbytes = nbytes as u64;
        Ok(arg)
    }

    fn host_memory(&self, memory: MemoryKind) -> Result<(), ArgError> {
        if memory.is_host_visible() {
            Ok(())
        } else {
            Err(ArgError::NotHostVisible { index: self.args.len(), memory })
        }
    }

    fn push(&mut self, arg: TensorArg) -> Slot {
        let index = self.args.len();
        self.args.push(arg);
        self.slot(index)
    }

    /// A read-only input.
    pub fn push_input(
        &mut self,
        data: &'a [u8],
        dtype: DTypeCode,
        shape: &[i64],
        memory: MemoryKind,
    ) -> Result<(), ArgError> {
        self.host_memory(memory)?;
        let arg = self.describe(dtype, shape, memory, data.as_ptr().cast_mut().cast(), data.len())?;
        self.push(arg);
        Ok(())
    }

    /// A writable input: caller-owned state (a KV cache) that the delegate reads and updates in place.
    pub fn push_inout(
        &mut self,
        data: &'a mut [u8],
        dtype: DTypeCode,
        shape: &[i64],
        memory: MemoryKind,
    ) -> Result<Slot, ArgError> {
        self.host_memory(memory)?;
        let mut arg = self.describe(dtype, shape, memory, data.as_mut_ptr().cast(), data.len())?;
        arg.flags |= ARG_WRITABLE | ARG_INOUT;
        Ok(self.push(arg))
    }

    /// An output the delegate writes.
    pub fn push_output(
        &mut self,
        data: &'a mut [u8],
        dtype: DTypeCode,
        shape: &[i64],
        memory: MemoryKind,
    ) -> Result<(), ArgError> {
        self.host_memory(memory)?;
        let mut arg = self.describe(dtype, shape, memory, data.as_mut_ptr().cast(), data.len())?;
        arg.flags |= ARG_WRITABLE;
        self.push(arg);
        Ok(())
    }

    /// An output that is the same storage as the inout at `slot` (zero-copy aliasing): same address and
    /// size; `dtype × shape` must cover exactly that size.
    pub fn push_output_in_place(
        &mut self,
        slot: Slot,
        dtype: DTypeCode,
        shape: &[i64],
    ) -> Result<(), ArgError> {
        let index = self.args.len();
        let bad = |why| ArgError::BadSlot { index, slot: slot.index, why };
        if slot.list != self.id {
            return Err(bad("it belongs to another list"));
        }
        if slot.generation != self.generation {
            return Err(bad("the list was cleared since"));
        }
        let target = *self.args.get(slot.index).ok_or_else(|| bad("out of range"))?;
        if target.flags & ARG_INOUT == 0 {
            return Err(bad("it was not pushed with push_inout"));
        }
        let mut arg = self.describe(dtype, shape, target.memory, target.data, target.nbytes as usize)?;
        arg.device_id = target.device_id;
        arg.flags |= ARG_WRITABLE;
        self.push(arg);
        Ok(())
    }

    /// Pushes a raw argument as is, after the same rank and size checks (device memory, FFI callers). The
    /// slot serves [`ArgList::push_output_in_place`] when the arg is flagged [`ARG_INOUT`].
    ///
    /// # Safety
    /// For as long as this list lives (`'a`): host-visible memory at `arg.data` must be valid for reads of
    /// `arg.nbytes` bytes, and for writes when [`ARG_WRITABLE`] is set, with nothing else writing it; a
    /// writable arg may share storage with another arg of the list only at the same address and size; device
    /// memory must be a live allocation of `arg.nbytes` bytes on `arg.device_id`.
    pub unsafe fn push_raw(&mut self, arg: TensorArg) -> Result<Slot, ArgError> {
        let nbytes = usize::try_from(arg.nbytes).unwrap_or(usize::MAX);
        let mut checked = self.describe(arg.dtype, arg.dims(), arg.memory, arg.data, nbytes)?;
        checked.device_id = arg.device_id;
        checked.flags = arg.flags & (ARG_WRITABLE | ARG_INOUT);
        if checked.flags & ARG_INOUT != 0 {
            checked.flags |= ARG_WRITABLE;
        }
        Ok(self.push(checked))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use abi_stable::sabi_types::VersionNumber;
    use abi_stable::std_types::RBoxError;

    fn assert_send_sync<T: Send + Sync>() {}
    fn assert_send<T: Send>() {}

    #[test]
    fn plugin_is_send_sync_and_instance_is_send() {
        assert_send_sync::<Plugin>();
        assert_send::<Instance>();
    }

    #[test]
    fn root_version_mismatch_names_both_versions_in_one_line() {
        let err = LibraryError::IncompatibleVersionNumber {
            library_name: "delegate_plugin",
            expected_version: VersionNumber { major: 1, minor: 0, patch: 0 },
            actual_version: VersionNumber { major: 2, minor: 1, patch: 0 },
        };
        let err = map_library_error(Path::new("/p/libx.so"), err, None);
        assert_eq!(err.to_string(), "plugin root interface is 2.1.0, host expects 1.0.0");
        assert_eq!(err.path(), Some(Path::new("/p/libx.so")));
    }

    #[test]
    fn a_layout_report_is_summarised_in_one_line_with_both_crate_versions() {
        let report = "\n\nSome layout error\n\n  Error:Mismatched fields\n    expected: 9 fields\n    found: 8 fields\n";
        let err = LibraryError::AbiInstability(RBoxError::from_fmt(&report));
        let err = map_library_error(Path::new("/p/libx.so"), err, Some("delegate-abi 0.2.0".into()));
        let text = err.to_string();
        assert_eq!(
            text,
            format!(
                "plugin root module layout is incompatible: plugin built with delegate-abi 0.2.0, host with \
                 delegate-abi {} (Error:Mismatched fields)",
                env!("CARGO_PKG_VERSION")
            )
        );
        assert!(!text.contains('\n'));
    }

    #[test]
    fn the_host_layout_is_attributed_to_this_crate() {
        assert_eq!(host_abi_crate(), format!("delegate-abi {}", env!("CARGO_PKG_VERSION")));
    }

    #[test]
    fn one_line_keeps_the_first_non_empty_line_and_caps_its_length() {
        assert_eq!(one_line("\n  first  \nsecond"), "first");
        assert_eq!(one_line(""), "no details");
        assert_eq!(one_line(&"x".repeat(300)).chars().count(), 201);
    }
}
