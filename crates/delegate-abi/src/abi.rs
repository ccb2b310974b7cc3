//! The wire level of the ABI: `#[repr(C)]` tables and values that cross the plugin boundary.
//!
//! Plugin authors and hosts never touch these directly: [`crate::export_delegate!`] writes the plugin side
//! and [`crate::host`] drives them. They are public so the layout is documented and checkable.
//!
//! # Shape
//!
//! ```text
//! LibHeader (abi_stable's permanent symbol, layout-checked)
//!  └─ DelegateRoot            prefix type, PERMANENT: only `negotiate`
//!      └─ negotiate(HostOffer) -> Negotiated { version, plugin_range, module }
//!                                  └─ PluginModule   prefix type, append-only
//!                                      ├─ info() -> PluginInfoRecord (prefix type, append-only; the
//!                                      │    capabilities appended after 0.1.0 are guarded)
//!                                      ├─ is_available, compatibility, init
//!                                      ├─ execute, destroy (unsafe: they take a RawHandle and raw memory)
//!                                      ├─ set_option, get_option
//!                                      ├─ poison_message (guarded: added after the last prefix field)
//!                                      └─ keeps_sequence_state (guarded, appended after 0.1.0: unsafe,
//!                                           per instance; an older table answers through the capability)
//! ```
//!
//! # Evolution rules
//!
//! - `DelegateRoot` never changes. [`ROOT_INTERFACE_VERSION`] stays `1.0.0` forever; the ABI version that
//!   matters is the one agreed by [`negotiate`].
//! - Every prefix type only grows at the end. A field after `#[sabi(last_prefix_field)]` is read through an
//!   accessor returning `Option`, and the host additionally guards it by the negotiated version (or, for a
//!   field appended within a version, takes `None` as the field's documented default).
//! - abi_stable's own layout check refuses a library whose prefix types have fewer fields than the host's
//!   ("too many fields"); the host's loader (`host::root`) accepts such an older plugin when its layout is
//!   exactly a prefix of the host's, so appending really keeps old plugins loading. Release 0.1.0's plugins
//!   (`fixtures/releases/0.1.0`) are loaded by the tests to prove it.
//! - A change that cannot be expressed by appending bumps [`ABI_VERSION_MAX`]; a plugin or host that still
//!   speaks the older version keeps negotiating it.
//! - Entries whose arguments carry a precondition the type system cannot (a live [`RawHandle`], caller
//!   memory) are `unsafe extern "C" fn`s with a `# Safety` section; the host wraps them safely in
//!   [`crate::host`]. Whether an entry is `unsafe` is not part of the C ABI, but abi_stable's layout check
//!   compares it (`FnQualifierMismatch`): making an entry `unsafe` or safe is a layout change like any other.
//! - Values the other side writes are never Rust enums with invalid bit patterns: codes cross as integer
//!   newtypes ([`crate::RawDType`], [`crate::RawMemoryKind`]) and are decoded with `TryFrom`; a new entry
//!   answers a yes or no as a `u8` (`keeps_sequence_state`). Where a field of [`PluginInfoRecord`] already
//!   has such a type (its `bool`s, the `ROption` tag of `in_place_memory_kinds`), the host reads the byte
//!   the plugin wrote as an integer before anything reads the field at its type, and refuses a plugin whose
//!   byte is out of range ([`RecordError`]): a plugin written in another language may write any byte.
//! - abi_stable checks the layout of every type reachable from the root (tables, [`TensorArg`],
//!   [`ExecStats`], ...) before the handshake. Never change such a type in place: add a new type and a new,
//!   appended table entry that uses it (e.g. `execute_v2`), guarded by the negotiated version. ABI version
//!   0 is never used (it means "not negotiated").

use std::ffi::c_void;
use std::fmt;

use abi_stable::library::RootModule;
use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::sabi_types::VersionStrings;
use abi_stable::std_types::{ROption, RResult, RSlice, RStr, RString};
use abi_stable::StableAbi;

use crate::capabilities::Capabilities;
use crate::delegate::{
    Compatibility, DelegateError, ErrorCode, ExecStats, OptionValue, PluginInfo, WireFormatSupport,
};
use crate::tensor::{MemoryKind, RawMemoryKind, TensorArg};

/// Oldest ABI interface version this build of `delegate-abi` speaks.
pub const ABI_VERSION_MIN: u32 = 1;
/// Newest ABI interface version this build of `delegate-abi` speaks.
pub const ABI_VERSION_MAX: u32 = 1;

/// The version string abi_stable checks on the root module. It is permanent: versioning happens in
/// [`negotiate`], never by changing this.
pub const ROOT_INTERFACE_VERSION: &str = "1.0.0";

/// An inclusive range of ABI interface versions one side speaks.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, StableAbi)]
pub struct AbiRange {
    /// Oldest version spoken.
    pub min: u32,
    /// Newest version spoken.
    pub max: u32,
}

impl AbiRange {
    /// What this build speaks: [`ABI_VERSION_MIN`]`..=`[`ABI_VERSION_MAX`].
    pub const CURRENT: AbiRange = AbiRange { min: ABI_VERSION_MIN, max: ABI_VERSION_MAX };

    /// A range `min..=max`.
    pub const fn new(min: u32, max: u32) -> AbiRange {
        AbiRange { min, max }
    }

    /// Whether `version` lies in the range.
    pub const fn contains(self, version: u32) -> bool {
        self.min <= version && version <= self.max
    }

    /// Whether `min <= max`.
    pub const fn is_valid(self) -> bool {
        self.min <= self.max
    }
}

impl fmt::Display for AbiRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}..={}", self.min, self.max)
    }
}

/// Why two ABI ranges have no version in common.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("plugin speaks ABI {plugin}, host {host}")]
pub struct VersionMismatch {
    /// What the plugin speaks.
    pub plugin: AbiRange,
    /// What the host offered.
    pub host: AbiRange,
}

/// The handshake rule, shared by both sides: the newest version both speak.
///
/// The plugin runs it on the host's offer and answers the result; the host checks the answer lies in its own
/// offer. An empty (inverted) range on either side has no version in common with anything.
///
/// ```
/// use delegate_abi::abi::{negotiate, AbiRange};
///
/// // A new plugin that still speaks 1 talks to an old host that speaks only 1.
/// assert_eq!(negotiate(AbiRange::new(1, 1), AbiRange::new(1, 2)), Ok(1));
/// // A plugin that dropped 1 cannot talk to it.
/// let err = negotiate(AbiRange::new(1, 1), AbiRange::new(2, 3)).unwrap_err();
/// assert_eq!(err.to_string(), "plugin speaks ABI 2..=3, host 1..=1");
/// ```
pub fn negotiate(host: AbiRange, plugin: AbiRange) -> Result<u32, VersionMismatch> {
    let low = host.min.max(plugin.min);
    let high = host.max.min(plugin.max);
    if host.is_valid() && plugin.is_valid() && low <= high {
        Ok(high)
    } else {
        Err(VersionMismatch { plugin, host })
    }
}

/// Log callback the host offers: `(level, target, message)`, level as [`LogLevel`] numbers.
pub type LogFn = extern "C" fn(level: u8, target: RStr<'_>, message: RStr<'_>);
/// Filter callback the host offers: whether `(level, target)` would be recorded.
pub type LogEnabledFn = extern "C" fn(level: u8, target: RStr<'_>) -> bool;

/// Log levels on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum LogLevel {
    /// `tracing::Level::ERROR`.
    Error = 1,
    /// `tracing::Level::WARN`.
    Warn = 2,
    /// `tracing::Level::INFO`.
    Info = 3,
    /// `tracing::Level::DEBUG`.
    Debug = 4,
    /// `tracing::Level::TRACE`.
    Trace = 5,
}

impl LogLevel {
    /// From a `tracing` level.
    pub fn from_tracing(level: &tracing::Level) -> LogLevel {
        match *level {
            tracing::Level::ERROR => LogLevel::Error,
            tracing::Level::WARN => LogLevel::Warn,
            tracing::Level::INFO => LogLevel::Info,
            tracing::Level::DEBUG => LogLevel::Debug,
            tracing::Level::TRACE => LogLevel::Trace,
        }
    }

    /// To a `tracing` level; unknown numbers become `TRACE`.
    pub fn to_tracing(code: u8) -> tracing::Level {
        match code {
            1 => tracing::Level::ERROR,
            2 => tracing::Level::WARN,
            3 => tracing::Level::INFO,
            4 => tracing::Level::DEBUG,
            _ => tracing::Level::TRACE,
        }
    }
}

/// What the host offers in the handshake. Prefix type: fields may be appended.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = HostOfferRef)))]
pub struct HostOffer {
    /// ABI versions the host speaks.
    pub abi: AbiRange,
    /// Whether the plugin should forward its `tracing` records through `log`; `false` for a plugin linked
    /// into the host (it shares the host's `tracing`).
    pub forward_logs: bool,
    /// Where plugin logs go: `(level, target, message)`, level as [`LogLevel`] numbers.
    pub log: extern "C" fn(level: u8, target: RStr<'_>, message: RStr<'_>),
    /// Asked before formatting a plugin log record: whether `(level, target)` would be recorded.
    #[sabi(last_prefix_field)]
    pub log_enabled: extern "C" fn(level: u8, target: RStr<'_>) -> bool,
}

/// The plugin's answer when it accepts the handshake.
#[repr(C)]
#[derive(StableAbi)]
pub struct Negotiated {
    /// The version the plugin will use; in both ranges.
    pub version: u32,
    /// What the plugin speaks.
    pub plugin_range: AbiRange,
    /// The plugin's tables for that version.
    pub module: PluginModuleRef,
}

/// The plugin's answer when it refuses the handshake.
#[repr(C)]
#[derive(StableAbi)]
pub struct Refusal {
    /// What the plugin speaks.
    pub plugin_range: AbiRange,
    /// Why, for a person.
    pub message: RString,
}

/// The permanent root module: the only thing reached through the exported symbol.
///
/// Never add, remove or change fields: everything versioned hangs off [`Negotiated::module`].
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = DelegateRootRef)))]
#[sabi(missing_field(panic))]
pub struct DelegateRoot {
    /// The handshake (see [`negotiate`]).
    #[sabi(last_prefix_field)]
    pub negotiate: extern "C" fn(offer: HostOfferRef) -> RResult<Negotiated, Refusal>,
}

impl RootModule for DelegateRootRef {
    abi_stable::declare_root_module_statics! {DelegateRootRef}
    const BASE_NAME: &'static str = "delegate_plugin";
    const NAME: &'static str = "delegate_plugin";
    const VERSION_STRINGS: VersionStrings = VersionStrings::new(ROOT_INTERFACE_VERSION);
}

/// An error as it crosses: ExecuTorch code and a message freed by the side that allocated it.
#[repr(C)]
#[derive(Debug, StableAbi)]
pub struct RError {
    /// ExecuTorch code ([`ErrorCode::as_u32`]).
    pub code: u32,
    /// What was wrong.
    pub message: RString,
}

impl RError {
    /// Crosses a [`DelegateError`].
    pub fn from_delegate(err: DelegateError) -> RError {
        RError { code: err.code.as_u32(), message: RString::from(err.message) }
    }

    /// Back to a [`DelegateError`]. A plugin that reports an error with code `Ok` is reported as `Internal`.
    pub fn into_delegate(self) -> DelegateError {
        let code = match ErrorCode::from_u32(self.code) {
            ErrorCode::Ok => ErrorCode::Internal,
            code => code,
        };
        DelegateError::new(code, self.message.into_string())
    }
}

/// [`Compatibility`] as it crosses.
#[repr(u8)]
#[derive(Debug, StableAbi)]
pub enum RCompatibility {
    /// [`Compatibility::Supported`].
    Supported,
    /// [`Compatibility::RebuildRecommended`], with the reason.
    RebuildRecommended(RString),
    /// [`Compatibility::Unsupported`], with the reason.
    Unsupported(RString),
}

impl From<Compatibility> for RCompatibility {
    fn from(value: Compatibility) -> RCompatibility {
        match value {
            Compatibility::Supported => RCompatibility::Supported,
            Compatibility::RebuildRecommended { reason } => RCompatibility::RebuildRecommended(reason.into()),
            Compatibility::Unsupported { reason } => RCompatibility::Unsupported(reason.into()),
        }
    }
}

impl From<RCompatibility> for Compatibility {
    fn from(value: RCompatibility) -> Compatibility {
        match value {
            RCompatibility::Supported => Compatibility::Supported,
            RCompatibility::RebuildRecommended(reason) => {
                Compatibility::RebuildRecommended { reason: reason.into_string() }
            }
            RCompatibility::Unsupported(reason) => {
                Compatibility::Unsupported { reason: reason.into_string() }
            }
        }
    }
}

/// [`OptionValue`] as it crosses.
#[repr(u8)]
#[derive(Debug, StableAbi)]
pub enum ROptionValue {
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A string.
    Str(RString),
}

impl From<OptionValue> for ROptionValue {
    fn from(value: OptionValue) -> ROptionValue {
        match value {
            OptionValue::Bool(b) => ROptionValue::Bool(b),
            OptionValue::Int(i) => ROptionValue::Int(i),
            OptionValue::Str(s) => ROptionValue::Str(s.into()),
        }
    }
}

impl From<ROptionValue> for OptionValue {
    fn from(value: ROptionValue) -> OptionValue {
        match value {
            ROptionValue::Bool(b) => OptionValue::Bool(b),
            ROptionValue::Int(i) => OptionValue::Int(i),
            ROptionValue::Str(s) => OptionValue::Str(s.into_string()),
        }
    }
}

/// A compile or runtime spec as it crosses, borrowed for the call.
#[repr(C)]
#[derive(Debug, Clone, Copy, StableAbi)]
pub struct RSpec<'a> {
    /// The key.
    pub key: RStr<'a>,
    /// The value's bytes.
    pub value: RSlice<'a, u8>,
}

/// An opaque delegate handle: the plugin's boxed `Delegate::Handle`.
///
/// Its pointer is private: only the plugin glue makes one (in `init`) and only the plugin glue turns one back
/// into a handle (in the `unsafe` entries `execute` and `destroy`), so safe code cannot forge a handle that
/// an entry would dereference.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, StableAbi)]
pub struct RawHandle(*mut c_void);

impl RawHandle {
    /// Wraps the plugin's boxed handle.
    pub(crate) fn new(ptr: *mut c_void) -> RawHandle {
        RawHandle(ptr)
    }

    /// The pointer, for the plugin glue to turn back into its box.
    pub(crate) fn as_ptr(self) -> *mut c_void {
        self.0
    }
}

/// One blob wire format as it crosses.
#[repr(C)]
#[derive(Debug, Clone, Copy, StableAbi)]
pub struct RWireFormat {
    /// Format name.
    pub format: RStr<'static>,
    /// Semver requirement over its versions.
    pub versions: RStr<'static>,
}

fn leak_str(s: String) -> RStr<'static> {
    RStr::from_str(Box::leak(s.into_boxed_str()))
}

fn leak_slice<T>(v: Vec<T>) -> RSlice<'static, T> {
    RSlice::from_slice(Box::leak(v.into_boxed_slice()))
}

/// [`PluginInfo`] as it crosses: built once by the plugin and never freed (so every field is a `'static`
/// borrow of plugin memory). Prefix type: append-only.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = PluginInfoRecordRef)))]
pub struct PluginInfoRecord {
    /// Plugin name.
    pub name: RStr<'static>,
    /// Plugin version.
    pub version: RStr<'static>,
    /// Backend ids.
    pub backends: RSlice<'static, RStr<'static>>,
    /// Wire formats.
    pub wire_formats: RSlice<'static, RWireFormat>,
    /// Memory kinds, as they cross (a host skips codes it does not know).
    pub memory_kinds: RSlice<'static, RawMemoryKind>,
    /// Zero-copy aliasing.
    #[sabi(last_prefix_field)]
    pub binds_aliases_in_place: bool,
    // Appended after release 0.1.0: a plugin built before them lacks them, their accessors answer `None`
    // and the host reads `Capabilities::default()`'s value (see `crate::capabilities`). Only ever append.
    /// [`Capabilities::in_place_memory_kinds`]: `RNone` when not stated.
    pub in_place_memory_kinds: ROption<RSlice<'static, RawMemoryKind>>,
    /// [`Capabilities::caller_stream`].
    pub caller_stream: bool,
    /// [`Capabilities::cuda_graph_capturable`].
    pub cuda_graph_capturable: bool,
    /// [`Capabilities::device_positions`].
    pub device_positions: bool,
    /// [`Capabilities::rewind_fork_without_reinit`].
    pub rewind_fork_without_reinit: bool,
    /// [`Capabilities::max_positions`]; `0` for no limit.
    pub max_positions: u64,
}

impl PluginInfoRecord {
    /// From the safe form, leaking its strings (called once per plugin).
    pub fn from_info(info: PluginInfo) -> PluginInfoRecord {
        PluginInfoRecord {
            name: leak_str(info.name),
            version: leak_str(info.version),
            backends: leak_slice(info.backends.into_iter().map(leak_str).collect()),
            wire_formats: leak_slice(
                info.wire_formats
                    .into_iter()
                    .map(|w| RWireFormat { format: leak_str(w.format), versions: leak_str(w.versions) })
                    .collect(),
            ),
            memory_kinds: leak_slice(info.memory_kinds.into_iter().map(RawMemoryKind::from).collect()),
            binds_aliases_in_place: info.binds_aliases_in_place,
            in_place_memory_kinds: match info.capabilities.in_place_memory_kinds {
                Some(kinds) => {
                    ROption::RSome(leak_slice(kinds.into_iter().map(RawMemoryKind::from).collect()))
                }
                None => ROption::RNone,
            },
            caller_stream: info.capabilities.caller_stream,
            cuda_graph_capturable: info.capabilities.cuda_graph_capturable,
            device_positions: info.capabilities.device_positions,
            rewind_fork_without_reinit: info.capabilities.rewind_fork_without_reinit,
            max_positions: info.capabilities.max_positions,
        }
    }
}

/// The tag [`ROption::RSome`] has in memory: `ROption` is `#[repr(u8)]` with `RSome` declared first (its layout,
/// discriminants included, is part of what abi_stable's layout check compares).
const ROPTION_SOME: u8 = 0;
/// The tag of [`ROption::RNone`], declared second.
const ROPTION_NONE: u8 = 1;

/// A byte of a plugin's [`PluginInfoRecord`] that its field's Rust type does not allow: a `bool` other than 0
/// or 1, an `ROption` tag other than `RSome`'s or `RNone`'s. A plugin written in another language may write
/// any byte; the host reads these fields as integers first and refuses such a plugin at load (reading the
/// byte as the field's type would be undefined behaviour).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("plugin {plugin} writes {byte} into its info record's field `{field}`, which takes {takes}")]
pub struct RecordError {
    /// The name the plugin gives itself.
    pub plugin: String,
    /// The field, as `PluginInfoRecord` names it.
    pub field: &'static str,
    /// The byte found.
    pub byte: u8,
    /// What the field takes, in words.
    pub takes: &'static str,
}

/// The byte the plugin wrote first into `$record`'s field `$field` of [`PluginInfoRecord`]
/// ([`PluginInfoRecordRef::raw_byte`]), the field's name and offset taken from the one field named.
macro_rules! raw_field {
    ($record:expr, $field:ident) => {
        $record.raw_byte(stringify!($field), std::mem::offset_of!(PluginInfoRecord, $field))
    };
}

/// `$record`'s `bool` field `$field`, read as an integer ([`PluginInfoRecordRef::flag`]).
macro_rules! flag {
    ($record:expr, $field:ident) => {
        $record.flag(stringify!($field), raw_field!($record, $field))
    };
}

impl PluginInfoRecordRef {
    /// To the safe form (copies the strings into host allocations). A memory-kind code this build does not
    /// know (from a newer plugin) is skipped with a warning: the host never passes memory of that kind.
    ///
    /// # Errors
    /// [`RecordError`] when a `bool` field holds a byte other than 0 or 1, or the tag of
    /// `in_place_memory_kinds` is neither `RSome`'s nor `RNone`'s.
    pub fn try_to_info(self) -> Result<PluginInfo, RecordError> {
        // A prefix field: every plugin's record has it.
        let binds_aliases_in_place = flag!(self, binds_aliases_in_place)?.unwrap_or_default();
        Ok(self.info_with(binds_aliases_in_place, self.capabilities()?))
    }

    /// To the safe form, as [`PluginInfoRecordRef::try_to_info`], except that a record with an out-of-range
    /// byte is not refused: it is logged, and every `bool` and the in-place kinds read as their defaults
    /// (`false`, [`Capabilities::default`]). Kept for one release for callers written before
    /// [`RecordError`]; the host refuses such a plugin through `try_to_info`.
    #[deprecated(
        since = "0.2.0",
        note = "use try_to_info, which refuses a record holding an out-of-range byte"
    )]
    pub fn to_info(self) -> PluginInfo {
        self.try_to_info().unwrap_or_else(|err| {
            tracing::warn!("{err}; reading the plugin's flags as their defaults");
            let max_positions = self.max_positions().unwrap_or_default();
            self.info_with(false, Capabilities { max_positions, ..Capabilities::default() })
        })
    }

    /// The record's strings and lists, copied, with the flags and capabilities already read.
    fn info_with(self, binds_aliases_in_place: bool, capabilities: Capabilities) -> PluginInfo {
        PluginInfo {
            name: self.name().to_string(),
            version: self.version().to_string(),
            backends: self.backends().iter().map(|b| b.to_string()).collect(),
            wire_formats: self
                .wire_formats()
                .iter()
                .map(|w| WireFormatSupport { format: w.format.to_string(), versions: w.versions.to_string() })
                .collect(),
            memory_kinds: self.known_kinds(self.memory_kinds()),
            binds_aliases_in_place,
            capabilities,
        }
    }

    /// The appended capability fields; each one a plugin does not have (built before it) reads as
    /// [`Capabilities::default`]'s.
    fn capabilities(self) -> Result<Capabilities, RecordError> {
        let default = Capabilities::default();
        Ok(Capabilities {
            in_place_memory_kinds: self.in_place_kinds()?,
            caller_stream: flag!(self, caller_stream)?.unwrap_or(default.caller_stream),
            cuda_graph_capturable: flag!(self, cuda_graph_capturable)?
                .unwrap_or(default.cuda_graph_capturable),
            device_positions: flag!(self, device_positions)?.unwrap_or(default.device_positions),
            rewind_fork_without_reinit: flag!(self, rewind_fork_without_reinit)?
                .unwrap_or(default.rewind_fork_without_reinit),
            max_positions: self.max_positions().unwrap_or(default.max_positions),
        })
    }

    /// `in_place_memory_kinds`, its tag checked before the field is read: `None` when the plugin's record
    /// lacks it or states `RNone`.
    fn in_place_kinds(self) -> Result<Option<Vec<MemoryKind>>, RecordError> {
        match raw_field!(self, in_place_memory_kinds) {
            None | Some(ROPTION_NONE) => Ok(None),
            // The tag is `RSome`'s, so the field is a valid `ROption` and its accessor may read it.
            Some(ROPTION_SOME) => {
                let kinds = self.in_place_memory_kinds().and_then(ROption::into_option);
                Ok(kinds.map(|kinds| self.known_kinds(kinds)))
            }
            Some(byte) => Err(self.record_error(
                "in_place_memory_kinds",
                byte,
                "an ROption tag: 0 (RSome) or 1 (RNone)",
            )),
        }
    }

    /// A `bool` field's byte (`raw`, from [`raw_field!`]) as a `bool`: `None` when the record lacks the field.
    fn flag(self, field: &'static str, raw: Option<u8>) -> Result<Option<bool>, RecordError> {
        match raw {
            None => Ok(None),
            Some(0) => Ok(Some(false)),
            Some(1) => Ok(Some(true)),
            Some(byte) => Err(self.record_error(field, byte, "a bool: 0 or 1")),
        }
    }

    fn record_error(self, field: &'static str, byte: u8, takes: &'static str) -> RecordError {
        RecordError { plugin: self.name().to_string(), field, byte, takes }
    }

    /// The first byte of field `name` of the plugin's record, `offset` bytes into it, read as an integer:
    /// `None` when the plugin's record lacks the field (built before it was appended).
    fn raw_byte(self, name: &str, offset: usize) -> Option<u8> {
        let mut fields = <PluginInfoRecord as PrefixTypeTrait>::PT_LAYOUT.get_field_names();
        let index = fields.position(|field| field == name).expect("raw_field! names a field of the record");
        if !self.0.field_accessibility().at(index).is_accessible() {
            return None;
        }
        let record = self.0.to_raw_ptr();
        // SAFETY: `record` points to the record the plugin built and leaked (`leak_into_prefix`: abi_stable's
        // `WithMetadata_`, the metadata and then the whole `#[repr(C)]` record, never freed), so the place
        // `value` is in bounds. The plugin's own accessibility bits, just read, say its record has field
        // `name`; it lies `offset` bytes into the record (`offset_of!` of this build's `#[repr(C)]`
        // `PluginInfoRecord`, whose fields up to this one the layout check found equal to the plugin's). The
        // read is of a `u8`, valid for any byte, and nothing writes the record (it is immutable once leaked).
        Some(unsafe { std::ptr::addr_of!((*record).value).cast::<u8>().add(offset).read() })
    }

    /// The memory kinds this build knows among `raw`; an unknown code (from a newer plugin) is skipped with a
    /// warning.
    fn known_kinds(self, raw: RSlice<'static, RawMemoryKind>) -> Vec<MemoryKind> {
        raw.iter()
            .filter_map(|&raw| match MemoryKind::try_from(raw) {
                Ok(kind) => Some(kind),
                Err(err) => {
                    tracing::warn!(plugin = %self.name(), "skipping a memory kind: {err}");
                    None
                }
            })
            .collect()
    }
}

/// The delegate function table for the negotiated version. Prefix type: append-only; entries after the
/// last prefix field are read as `Option` and guarded by the negotiated version.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = PluginModuleRef)))]
pub struct PluginModule {
    /// Metadata; never runs `Delegate::new`.
    pub info: extern "C" fn() -> PluginInfoRecordRef,
    /// `Delegate::availability`: `Ok(true)` when available, an error carrying the reason when not (`Ok(false)`
    /// means "not available" without a reason).
    pub is_available: extern "C" fn() -> RResult<bool, RError>,
    /// `Delegate::compatibility`.
    pub compatibility: extern "C" fn(blob: RSlice<'_, u8>) -> RResult<RCompatibility, RError>,
    /// `Delegate::init`; the blob is borrowed for the call only.
    pub init: extern "C" fn(
        blob: RSlice<'_, u8>,
        compile_specs: RSlice<'_, RSpec<'_>>,
        runtime_specs: RSlice<'_, RSpec<'_>>,
    ) -> RResult<RawHandle, RError>,
    /// `Delegate::execute`. `stream` is a `cudaStream_t` or null.
    ///
    /// # Safety
    /// `handle` is one this table's `init` returned and `destroy` has not consumed, used by no other call
    /// at the same time. `args` satisfies [`crate::ExecuteArgs::new`]'s contract for the whole call (memory
    /// valid, writable args exclusive, sharing only between an inout and its in-place output) except that
    /// its dtype and memory codes may be any byte: the entry checks them and answers `InvalidArgument`. A
    /// non-null `stream` is a CUDA stream valid until the work queued on it completes, and the caller obeys
    /// the completion rule of [`crate::Delegate::execute`]. `stats` is valid for writes.
    pub execute: unsafe extern "C" fn(
        handle: RawHandle,
        args: RSlice<'_, TensorArg>,
        stream: *mut c_void,
        stats: &mut ExecStats,
    ) -> RResult<(), RError>,
    /// `Delegate::destroy`; the handle is gone afterwards, even on error.
    ///
    /// # Safety
    /// `handle` is one this table's `init` returned, not destroyed before and not in use by another call;
    /// nothing uses it afterwards.
    pub destroy: unsafe extern "C" fn(handle: RawHandle) -> RResult<(), RError>,
    /// `Delegate::set_option`.
    pub set_option: extern "C" fn(key: RStr<'_>, value: ROptionValue) -> RResult<(), RError>,
    /// `Delegate::get_option`.
    #[sabi(last_prefix_field)]
    pub get_option: extern "C" fn(key: RStr<'_>) -> RResult<ROptionValue, RError>,
    /// Since ABI 1 (guarded): the message of the panic that poisoned the plugin, if one did.
    pub poison_message: extern "C" fn() -> ROption<RString>,
    // Appended after release 0.1.0, within ABI 1: a plugin built before it lacks it and its accessor answers
    // `None`; the host then takes the plugin-level capability (`host::Instance::sequence_state`).
    /// `Delegate::keeps_sequence_state` of one instance, as a byte: `0` when it keeps no sequence state of its
    /// own (a rewind, a restored cache or a fork of the caller's caches carries the whole sequence), `1` when
    /// it does. The host refuses any other byte.
    ///
    /// # Safety
    /// `handle` is one this table's `init` returned and `destroy` has not consumed, used by no other call
    /// at the same time.
    pub keeps_sequence_state: unsafe extern "C" fn(handle: RawHandle) -> RResult<u8, RError>,
}
