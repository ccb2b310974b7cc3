//! The per-call residency gate for aliased inputs, as a pure function.
//!
//! An output aliased onto an input is written *in place* into the storage bound to that input. That only
//! reaches the caller when the pointer the engine binds is the caller's own storage. Two delegate paths bind
//! something else: an ordinary host input is staged into a delegate-owned device buffer, and a zero-byte
//! input is bound to a scratch allocation. For an aliased input either path would make the engine write
//! where the caller never reads, silently losing the update (UPSTREAM.md section 3).
//!
//! A delegate therefore says once, at init, which memory its engine reads and writes *directly*
//! ([`DirectAccess`]: a discrete GPU, an integrated GPU, the CPU, or a set of its own), and calls
//! [`DirectAccess::check`] for every aliased input of every call, *before* deciding on staging or the
//! zero-byte path.
//!
//! ```
//! use alias_validate::residency::{DirectAccess, MemoryKind};
//!
//! let gpu = DirectAccess::DISCRETE_GPU;
//! assert!(gpu.check("k_cache", MemoryKind::Device, 4096).is_ok());
//! assert!(gpu.check("k_cache", MemoryKind::Managed, 4096).is_ok());
//! // Host memory is refused on a discrete GPU (upstream's message), accepted on an integrated one.
//! let err = gpu.check("k_cache", MemoryKind::Host, 4096).unwrap_err();
//! assert!(err.to_string().starts_with("aliased input 'k_cache' must be on GPU or unified memory"));
//! assert!(DirectAccess::INTEGRATED_GPU.check("k_cache", MemoryKind::Host, 4096).is_ok());
//! // A delegate computing on the CPU updates host-visible memory in place, not device memory.
//! assert!(DirectAccess::CPU.check("k_cache", MemoryKind::Pinned, 4096).is_ok());
//! assert!(DirectAccess::CPU.check("k_cache", MemoryKind::Device, 4096).is_err());
//! // Zero bytes is refused everywhere.
//! assert!(DirectAccess::INTEGRATED_GPU.check("k_cache", MemoryKind::Device, 0).is_err());
//! ```

use std::fmt;

pub use et_error::MemoryKind;

use crate::Error;

/// Where a tensor's storage lives, as the delegate learns it per call: the workspace's one memory-kind
/// vocabulary, [`MemoryKind`]. The former name, kept one release so that sources naming it keep building;
/// name [`MemoryKind`] (and [`MemoryKind::Pinned`] for the former `Residency::PinnedHost`).
#[deprecated(note = "name `MemoryKind` (et-error's, re-exported here)")]
pub type Residency = MemoryKind;

/// The memory an engine reads and writes directly, so that an in-place update there lands in the caller's
/// own storage. A delegate decides it once (from what it runs on) and gates every aliased input with
/// [`DirectAccess::check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DirectAccess {
    /// Indexed by [`MemoryKind`]'s number (like [`MemoryKind::ALL`]).
    kinds: [bool; 4],
}

impl DirectAccess {
    /// A discrete GPU: device and managed memory. Host memory (pinned or not) would be staged.
    pub const DISCRETE_GPU: DirectAccess = DirectAccess::of(&[MemoryKind::Device, MemoryKind::Managed]);

    /// An integrated GPU: host and device share one physical memory, so every kind is written in place.
    pub const INTEGRATED_GPU: DirectAccess = DirectAccess::of(&MemoryKind::ALL);

    /// An engine that computes on the CPU: host-visible memory (host, managed, pinned). Device memory
    /// cannot be dereferenced there.
    pub const CPU: DirectAccess =
        DirectAccess::of(&[MemoryKind::Host, MemoryKind::Managed, MemoryKind::Pinned]);

    /// Exactly `kinds`.
    pub const fn of(kinds: &[MemoryKind]) -> DirectAccess {
        let mut set = [false; 4];
        let mut i = 0;
        while i < kinds.len() {
            set[kinds[i] as usize] = true;
            i += 1;
        }
        DirectAccess { kinds: set }
    }

    /// The GPU set for a device that is integrated (`true`) or discrete (`false`).
    pub const fn gpu(integrated: bool) -> DirectAccess {
        if integrated {
            DirectAccess::INTEGRATED_GPU
        } else {
            DirectAccess::DISCRETE_GPU
        }
    }

    /// Whether an in-place update of `memory` reaches the caller.
    pub const fn includes(self, memory: MemoryKind) -> bool {
        self.kinds[memory as usize]
    }

    /// Checks one aliased input of one call: its storage must be memory this engine writes directly, and it
    /// must have `nbytes > 0`. Call it before any host-staging or zero-byte path. The memory kind is checked
    /// first, then size.
    ///
    /// # Errors
    /// All [`et_error::ErrorCode::InvalidArgument`]: [`Error::AliasedInputNotOnDevice`] (upstream's message
    /// `aliased input '<name>' must be on GPU or unified memory`) when a GPU engine gets memory it would
    /// stage, [`Error::AliasedInputNotDirect`] when another engine (e.g. a CPU one) gets memory it cannot
    /// write, [`Error::AliasedInputEmpty`] for zero bytes.
    pub fn check(self, name: &str, memory: MemoryKind, nbytes: u64) -> Result<(), Error> {
        if !self.includes(memory) {
            return Err(if self.includes(MemoryKind::Device) {
                Error::AliasedInputNotOnDevice { name: name.to_owned(), residency: memory }
            } else {
                Error::AliasedInputNotDirect { name: name.to_owned(), residency: memory, direct: self }
            });
        }
        if nbytes == 0 {
            return Err(Error::AliasedInputEmpty { name: name.to_owned() });
        }
        Ok(())
    }
}

impl fmt::Display for DirectAccess {
    /// The kinds, e.g. `host, managed or pinned`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> =
            MemoryKind::ALL.into_iter().filter(|&r| self.includes(r)).map(MemoryKind::name).collect();
        match names.split_last() {
            None => f.write_str("no memory"),
            Some((last, [])) => f.write_str(last),
            Some((last, rest)) => write!(f, "{} or {last}", rest.join(", ")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpu_engine_refuses_device_memory_naming_what_it_writes() {
        let err = DirectAccess::CPU
            .check("v_cache", MemoryKind::Device, 64)
            .expect_err("device memory is not host-visible");
        assert_eq!(
            err.to_string(),
            "aliased input 'v_cache' must be in memory this delegate updates in place (host, managed or \
             pinned); it is in device memory, so the update would not reach the caller: allocate it as host, \
             managed or pinned memory"
        );
        assert_eq!(et_error::HasErrorCode::error_code(&err), et_error::ErrorCode::InvalidArgument);
    }

    #[test]
    fn the_gpu_sets_are_the_ones_upstream_checks() {
        // Device and managed memory always; host memory (pinned or not) only where host and device share one
        // physical memory.
        for memory in MemoryKind::ALL {
            let on_device = matches!(memory, MemoryKind::Device | MemoryKind::Managed);
            assert_eq!(DirectAccess::DISCRETE_GPU.includes(memory), on_device, "{memory}");
            assert!(DirectAccess::INTEGRATED_GPU.includes(memory), "{memory}");
            assert_eq!(DirectAccess::gpu(false), DirectAccess::DISCRETE_GPU);
        }
        assert_eq!(DirectAccess::of(&[]).to_string(), "no memory");
        assert_eq!(DirectAccess::DISCRETE_GPU.to_string(), "device or managed");
    }

    #[test]
    #[allow(deprecated)]
    fn the_former_residency_names_still_build() {
        let pinned: Residency = Residency::PinnedHost;
        assert_eq!(pinned, MemoryKind::Pinned);
        assert!(DirectAccess::CPU.check("k_cache", Residency::PinnedHost, 8).is_ok());
    }
}
