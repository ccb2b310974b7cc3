//! [`MemoryKind`]: where a tensor's bytes live, in a program manifest, an allocation, the residency gate and
//! a plugin's arguments alike.

use std::fmt;

/// Where a tensor's bytes live.
///
/// The discriminants are stable numbers (the plugin ABI sends them as one byte, through its own `repr(C)`
/// mirror); a new kind is appended, never renumbered.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemoryKind {
    /// Ordinary (pageable) host memory (`"host"`).
    Host = 0,
    /// CUDA device memory (`cudaMalloc`, `"device"`): the host cannot dereference it.
    Device = 1,
    /// CUDA managed (unified) memory (`cudaMallocManaged`, `"managed"`): one address valid on host and device.
    Managed = 2,
    /// Pinned (page-locked) host memory (`cudaMallocHost`, `"pinned"`): host memory the device can read by
    /// DMA, still host memory on a discrete GPU.
    Pinned = 3,
}

impl MemoryKind {
    /// Every kind, in numeric order.
    pub const ALL: [MemoryKind; 4] =
        [MemoryKind::Host, MemoryKind::Device, MemoryKind::Managed, MemoryKind::Pinned];

    /// alias-validate 0.2's name of [`MemoryKind::Pinned`] (`Residency::PinnedHost`), kept one release so
    /// that sources naming it keep building; use [`MemoryKind::Pinned`].
    #[doc(hidden)]
    #[allow(non_upper_case_globals)]
    #[deprecated(note = "name `MemoryKind::Pinned`")]
    pub const PinnedHost: MemoryKind = MemoryKind::Pinned;

    /// Whether the host may dereference it (every kind but [`MemoryKind::Device`]).
    pub const fn is_host_visible(self) -> bool {
        matches!(self, MemoryKind::Host | MemoryKind::Managed | MemoryKind::Pinned)
    }

    /// `"host"`, `"device"`, `"managed"` or `"pinned"`: the spelling of a program manifest's `memory` key,
    /// a plugin manifest and every message.
    pub const fn name(self) -> &'static str {
        match self {
            MemoryKind::Host => "host",
            MemoryKind::Device => "device",
            MemoryKind::Managed => "managed",
            MemoryKind::Pinned => "pinned",
        }
    }

    /// Parses a [`MemoryKind::name`]; `None` for anything else.
    pub fn from_name(name: &str) -> Option<MemoryKind> {
        Self::ALL.into_iter().find(|kind| kind.name() == name)
    }
}

impl fmt::Display for MemoryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_keep_their_numbers_and_names() {
        let numbered: Vec<(u8, &str)> = MemoryKind::ALL.into_iter().map(|k| (k as u8, k.name())).collect();
        assert_eq!(numbered, [(0, "host"), (1, "device"), (2, "managed"), (3, "pinned")]);
        for kind in MemoryKind::ALL {
            assert_eq!(MemoryKind::from_name(kind.name()), Some(kind));
            assert_eq!(kind.to_string(), kind.name());
        }
        assert_eq!(MemoryKind::from_name("pinned host"), None);
        #[allow(deprecated)]
        let former = MemoryKind::PinnedHost;
        assert_eq!(former, MemoryKind::Pinned);
    }
}
