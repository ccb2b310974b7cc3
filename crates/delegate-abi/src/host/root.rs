//! The root module of a plugin library, layout-checked so that the ABI can grow in both directions.
//!
//! abi_stable's own check ([`LibHeader::init_root_module`]) accepts a library whose prefix types have as many
//! fields as the host's or more (a plugin built after the host: the host never reads what it does not know),
//! but refuses one with fewer: a plugin built before a field was appended (`too many fields: expected N,
//! found M`). That is the "old plugin, new host" case this ABI promises (STABILITY.md), so a library refused
//! that way is checked once more with the roles swapped: the plugin's layout as the interface, the host's as
//! the implementation. That passes only when every type is the same except that the host's prefix types have
//! fields appended after the plugin's; then the plugin's root module is taken without abi_stable's check.
//!
//! Why that is sound: a prefix type's appended fields are read only through accessors that answer `None`
//! unless the record's own field-accessibility bits (written by the plugin that built it, next to the record)
//! say the field exists, so a host never reads past an old plugin's record; the tables the host builds and
//! hands over (`HostOffer`) are read by the old plugin through its own, shorter view. Every other difference
//! (a changed type, a removed or renamed field, a different prefix) fails both checks and is reported as
//! abi_stable's first one.

use abi_stable::abi_stability::check_layout_compatibility;
use abi_stable::library::{LibHeader, LibraryError};
use abi_stable::StableAbi;

use crate::abi::DelegateRootRef;

/// The library's root module: abi_stable's checked one, or, for a library built before fields this host
/// knows were appended, the one whose layout is a prefix of the host's (see the module docs).
pub(super) fn init_root(header: &LibHeader) -> Result<DelegateRootRef, LibraryError> {
    match header.init_root_module::<DelegateRootRef>() {
        Err(LibraryError::AbiInstability(report)) => {
            if !is_older_prefix(header) {
                return Err(LibraryError::AbiInstability(report));
            }
            // SAFETY: the library's root-module layout was just checked against this host's with the roles
            // swapped: it equals this host's except for fields appended to prefix types, which are read
            // only through accessors guarded by the record's own field-accessibility bits (module docs).
            unsafe { header.init_root_module_with_unchecked_layout::<DelegateRootRef>() }
        }
        other => other,
    }
}

/// Whether the library's root-module layout is this host's with fewer fields appended to its prefix types.
fn is_older_prefix(header: &LibHeader) -> bool {
    header.layout().is_some_and(|plugin| {
        check_layout_compatibility(plugin, <DelegateRootRef as StableAbi>::LAYOUT).is_ok()
    })
}
