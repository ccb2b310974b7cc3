//! A plugin written in another language writes its info record's bytes itself: where Rust has a `bool` it
//! may write any byte, and any tag where Rust has an `ROption`. The host reads those fields as integers and
//! refuses such a plugin at load in one line naming the plugin and the field (reading the byte as a `bool`
//! would be undefined behaviour); the bytes 0 and 1 read as a Rust plugin's do.

use abi_stable::prefix_type::{PrefixRefTrait, PrefixTypeTrait};
use abi_stable::std_types::{RResult, RSlice, RStr};
use delegate_abi::abi::{
    DelegateRoot, DelegateRootRef, HostOfferRef, Negotiated, PluginInfoRecordRef, PluginModule,
    PluginModuleRef, Refusal,
};
use delegate_abi::host::{LoadError, Plugin};
use delegate_abi::testing::{self, Fixture};
use delegate_abi::{Capabilities, ErrorCode, MemoryKind, PluginInfo, RawMemoryKind};

/// The record as a plugin in another language declares it.
// The derive's accessors (unused: the host reads the record through its own type) and their casts.
#[allow(dead_code, clippy::unnecessary_cast)]
mod wire {
    use abi_stable::std_types::{RSlice, RStr};
    use abi_stable::StableAbi;
    use delegate_abi::abi::RWireFormat;
    use delegate_abi::RawMemoryKind;

    /// `ROption<RSlice<RawMemoryKind>>` as a C plugin declares it: its `#[repr(u8)]` tag, then the `RSome`
    /// payload.
    #[repr(C)]
    #[derive(Clone, Copy, StableAbi)]
    pub struct ForeignOption {
        pub tag: u8,
        pub kinds: RSlice<'static, RawMemoryKind>,
    }

    /// `PluginInfoRecord` as a C plugin declares it: `uint8_t` where Rust has `bool`.
    #[repr(C)]
    #[derive(StableAbi)]
    #[sabi(kind(Prefix(prefix_ref = ForeignRecordRef)))]
    pub struct ForeignRecord {
        pub name: RStr<'static>,
        pub version: RStr<'static>,
        pub backends: RSlice<'static, RStr<'static>>,
        pub wire_formats: RSlice<'static, RWireFormat>,
        pub memory_kinds: RSlice<'static, RawMemoryKind>,
        #[sabi(last_prefix_field)]
        pub binds_aliases_in_place: u8,
        pub in_place_memory_kinds: ForeignOption,
        pub caller_stream: u8,
        pub cuda_graph_capturable: u8,
        pub device_positions: u8,
        pub rewind_fork_without_reinit: u8,
        pub max_positions: u64,
    }
}

use wire::{ForeignOption, ForeignRecord};

static BACKENDS: [RStr<'static>; 1] = [RStr::from_str("ForeignBackend")];

/// `[host]`, leaked as a record's slices are.
fn host_only() -> RSlice<'static, RawMemoryKind> {
    RSlice::from_slice(Box::leak(Box::new([RawMemoryKind::from(MemoryKind::Host)])))
}

/// The record case `CASE` writes: 0 valid bytes, 1 a `bool` of 2, 2 an `ROption` tag of 2, 3 a prefix `bool`
/// of 255.
fn record(case: u8) -> ForeignRecord {
    let byte = |field_case: u8, valid: u8| {
        if case == field_case {
            [0, 2, 2, 255][usize::from(case)]
        } else {
            valid
        }
    };
    ForeignRecord {
        name: RStr::from_str("foreign"),
        version: RStr::from_str("0.1.0"),
        backends: RSlice::from_slice(&BACKENDS),
        wire_formats: RSlice::from_slice(&[]),
        memory_kinds: host_only(),
        binds_aliases_in_place: byte(3, 1),
        in_place_memory_kinds: ForeignOption { tag: byte(2, 0), kinds: host_only() },
        caller_stream: byte(1, 1),
        cuda_graph_capturable: 0,
        device_positions: 1,
        rewind_fork_without_reinit: 1,
        max_positions: 7,
    }
}

extern "C" fn foreign_info<const CASE: u8>() -> PluginInfoRecordRef {
    let foreign = record(CASE).leak_into_prefix();
    // SAFETY: `ForeignRecord` is `PluginInfoRecord` declared as a plugin in another language declares it, field
    // for field of the same size, alignment and offset (`u8` for `bool`, the tag and payload of the
    // `#[repr(u8)]` `ROption`), so its leaked prefix is what such a plugin hands the host; the host reads its
    // `bool` bytes and the tag as integers before reading a field at its Rust type (the behaviour under test).
    PluginInfoRecordRef::from_prefix_ref(unsafe { foreign.0.cast() })
}

/// A real table (an embedded test delegate's), its `info` entry replaced by the foreign record of `CASE`.
extern "C" fn negotiate<const CASE: u8>(offer: HostOfferRef) -> RResult<Negotiated, Refusal> {
    let real = (helper::delegate_root().negotiate())(offer);
    let RResult::ROk(Negotiated { version, plugin_range, module }) = real else { return real };
    let module: PluginModuleRef = PluginModule {
        info: foreign_info::<CASE>,
        is_available: module.is_available(),
        compatibility: module.compatibility(),
        init: module.init(),
        execute: module.execute(),
        destroy: module.destroy(),
        set_option: module.set_option(),
        get_option: module.get_option(),
        poison_message: module.poison_message().expect("this build's table"),
        keeps_sequence_state: module.keeps_sequence_state().expect("this build's table"),
    }
    .leak_into_prefix();
    RResult::ROk(Negotiated { version, plugin_range, module })
}

fn root<const CASE: u8>() -> DelegateRootRef {
    DelegateRoot { negotiate: negotiate::<CASE> }.leak_into_prefix()
}

/// The delegate whose entries the foreign tables borrow.
pub struct Helper;
impl Fixture for Helper {
    fn info() -> PluginInfo {
        testing::info("helper", "HelperBackend")
    }
}

mod helper {
    delegate_abi::export_delegate!(@embedded delegate_abi::testing::Scripted<super::Helper>);
}

#[test]
fn the_bytes_0_and_1_read_as_a_rust_plugins() {
    let plugin = Plugin::embedded(root::<0>()).expect("a foreign record of valid bytes loads");
    let info = plugin.info();
    assert_eq!(info.name, "foreign");
    assert!(info.binds_aliases_in_place);
    let expected = Capabilities::default()
        .with_in_place_memory_kinds([MemoryKind::Host])
        .with_caller_stream(true)
        .with_cuda_graph_capturable(false)
        .with_device_positions(true)
        .with_rewind_fork_without_reinit(true)
        .with_max_positions(7);
    assert_eq!(info.capabilities, expected);
}

fn refusal<const CASE: u8>() -> LoadError {
    Plugin::embedded(root::<CASE>()).expect_err("refused at load")
}

#[test]
fn a_bool_of_2_is_refused_in_one_line_naming_the_plugin_and_the_field() {
    let err = refusal::<1>();
    assert!(matches!(err, LoadError::InvalidInfo { path: None, .. }), "{err:?}");
    assert_eq!(et_error::HasErrorCode::error_code(&err), ErrorCode::InvalidProgram);
    assert_eq!(
        err.to_string(),
        "plugin metadata is invalid: plugin foreign writes 2 into its info record's field `caller_stream`, which \
         takes a bool: 0 or 1"
    );
}

#[test]
fn an_unknown_roption_tag_is_refused() {
    assert_eq!(
        refusal::<2>().to_string(),
        "plugin metadata is invalid: plugin foreign writes 2 into its info record's field \
         `in_place_memory_kinds`, which takes an ROption tag: 0 (RSome) or 1 (RNone)"
    );
}

#[test]
fn a_prefix_bool_is_read_as_an_integer_too() {
    assert_eq!(
        refusal::<3>().to_string(),
        "plugin metadata is invalid: plugin foreign writes 255 into its info record's field \
         `binds_aliases_in_place`, which takes a bool: 0 or 1"
    );
}

/// The one-release shim for callers of the old `to_info`: a record the host refuses reads as its defaults
/// there (never as an invalid `bool`), while its names and lists are kept.
#[test]
#[allow(deprecated)]
fn the_deprecated_to_info_reads_an_out_of_range_byte_as_the_default() {
    let info = foreign_info::<1>().to_info();
    assert_eq!(
        (info.name.as_str(), info.backends.as_slice()),
        ("foreign", ["ForeignBackend".to_owned()].as_slice())
    );
    assert!(!info.binds_aliases_in_place);
    assert_eq!(info.capabilities, Capabilities::default().with_max_positions(7));
    assert!(foreign_info::<0>().to_info().capabilities.caller_stream, "valid bytes read as they are");
}
