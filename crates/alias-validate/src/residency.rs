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
//! use alias_validate::residency::{DirectAccess, Residency};
//!
//! let gpu = DirectAccess::DISCRETE_GPU;
//! assert!(gpu.check("k_cache", Residency::Device, 4096).is_ok());
//! assert!(gpu.check("k_cache", Residency::Managed, 4096).is_ok());
//! // Host memory is refused on a discrete GPU (upstream's message), accepted on an integrated one.
//! let err = gpu.check("k_cache", Residency::Host, 4096).unwrap_err();
//! assert!(err.to_string().starts_with("aliased input 'k_cache' must be on GPU or unified memory"));
//! assert!(DirectAccess::INTEGRATED_GPU.check("k_cache", Residency::Host, 4096).is_ok());
//! // A delegate computing on the CPU updates host-visible memory in place, not device memory.
//! assert!(DirectAccess::CPU.check("k_cache", Residency::PinnedHost, 4096).is_ok());
//! assert!(DirectAccess::CPU.check("k_cache", Residency::Device, 4096).is_err());
//! // Zero bytes is refused everywhere.
//! assert!(DirectAccess::INTEGRATED_GPU.check("k_cache", Residency::Device, 0).is_err());
//! ```

use std::fmt;

use crate::Error;

/// Where a tensor's storage lives, as the delegate learns it per call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Residency {
    /// Pageable host memory.
    Host = 0,
    /// Page-locked host memory (`cudaMallocHost`): DMA-readable, but still host memory on a discrete GPU.
    PinnedHost = 1,
    /// Device memory (`cudaMalloc`).
    Device = 2,
    /// Managed (unified) memory (`cudaMallocManaged`), one address valid on host and device.
    Managed = 3,
}

impl Residency {
    /// Every residency.
    pub const ALL: [Residency; 4] =
        [Residency::Host, Residency::PinnedHost, Residency::Device, Residency::Managed];

    /// `"host"`, `"pinned host"`, `"device"` or `"managed"`.
    pub const fn name(self) -> &'static str {
        match self {
            Residency::Host => "host",
            Residency::PinnedHost => "pinned host",
            Residency::Device => "device",
            Residency::Managed => "managed",
        }
    }

    /// Whether an engine can update storage of this residency in place, so that the caller sees the update.
    ///
    /// Device and managed memory always qualify; host memory (pinned or not) only on an integrated GPU, where
    /// host and device share one physical memory.
    pub const fn is_engine_writable(self, integrated_gpu: bool) -> bool {
        match self {
            Residency::Device | Residency::Managed => true,
            Residency::Host | Residency::PinnedHost => integrated_gpu,
        }
    }
}

impl fmt::Display for Residency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl From<delegate_abi::MemoryKind> for Residency {
    fn from(memory: delegate_abi::MemoryKind) -> Residency {
        match memory {
            delegate_abi::MemoryKind::Host => Residency::Host,
            delegate_abi::MemoryKind::Pinned => Residency::PinnedHost,
            delegate_abi::MemoryKind::Device => Residency::Device,
            delegate_abi::MemoryKind::Managed => Residency::Managed,
        }
    }
}

/// The memory an engine reads and writes directly, so that an in-place update there lands in the caller's
/// own storage. A delegate decides it once (from what it runs on) and gates every aliased input with
/// [`DirectAccess::check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DirectAccess {
    /// Indexed like [`Residency::ALL`].
    kinds: [bool; 4],
}

impl DirectAccess {
    /// A discrete GPU: device and managed memory. Host memory (pinned or not) would be staged.
    pub const DISCRETE_GPU: DirectAccess = DirectAccess::of(&[Residency::Device, Residency::Managed]);

    /// An integrated GPU: host and device share one physical memory, so every kind is written in place.
    pub const INTEGRATED_GPU: DirectAccess = DirectAccess::of(&Residency::ALL);

    /// An engine that computes on the CPU: host-visible memory (host, pinned host, managed). Device memory
    /// cannot be dereferenced there.
    pub const CPU: DirectAccess =
        DirectAccess::of(&[Residency::Host, Residency::PinnedHost, Residency::Managed]);

    /// Exactly `kinds`.
    pub const fn of(kinds: &[Residency]) -> DirectAccess {
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

    /// Whether an in-place update of `residency` memory reaches the caller.
    pub const fn includes(self, residency: Residency) -> bool {
        self.kinds[residency as usize]
    }

    /// Checks one aliased input of one call: its storage must be memory this engine writes directly, and it
    /// must have `nbytes > 0`. Call it before any host-staging or zero-byte path. Residency is checked first,
    /// then size.
    ///
    /// # Errors
    /// All [`et_error::ErrorCode::InvalidArgument`]: [`Error::AliasedInputNotOnDevice`] (upstream's message
    /// `aliased input '<name>' must be on GPU or unified memory`) when a GPU engine gets memory it would
    /// stage, [`Error::AliasedInputNotDirect`] when another engine (e.g. a CPU one) gets memory it cannot
    /// write, [`Error::AliasedInputEmpty`] for zero bytes.
    pub fn check(self, name: &str, residency: Residency, nbytes: u64) -> Result<(), Error> {
        if !self.includes(residency) {
            return Err(if self.includes(Residency::Device) {
                Error::AliasedInputNotOnDevice { name: name.to_owned(), residency }
            } else {
                Error::AliasedInputNotDirect { name: name.to_owned(), residency, direct: self }
            });
        }
        if nbytes == 0 {
            return Err(Error::AliasedInputEmpty { name: name.to_owned() });
        }
        Ok(())
    }
}

impl fmt::Display for DirectAccess {
    /// The kinds, e.g. `host, pinned host or managed`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> =
            Residency::ALL.into_iter().filter(|&r| self.includes(r)).map(Residency::name).collect();
        match names.split_last() {
            None => f.write_str("no memory"),
            Some((last, [])) => f.write_str(last),
            Some((last, rest)) => write!(f, "{} or {last}", rest.join(", ")),
        }
    }
}

#[cfg(test)]
mod tests {
    use delegate_abi::MemoryKind;

    use super::*;

    #[test]
    fn memory_kinds_map_to_the_residency_of_the_same_memory() {
        let mapped: Vec<Residency> = MemoryKind::ALL.into_iter().map(Residency::from).collect();
        assert_eq!(mapped, [Residency::Host, Residency::Device, Residency::Managed, Residency::PinnedHost]);
    }

    #[test]
    fn a_cpu_engine_refuses_device_memory_naming_what_it_writes() {
        let err = DirectAccess::CPU
            .check("v_cache", Residency::Device, 64)
            .expect_err("device memory is not host-visible");
        assert_eq!(
            err.to_string(),
            "aliased input 'v_cache' must be in memory this delegate updates in place (host, pinned host or \
             managed); it is in device memory, so the update would not reach the caller: allocate it as host, \
             pinned host or managed memory"
        );
        assert_eq!(et_error::HasErrorCode::error_code(&err), et_error::ErrorCode::InvalidArgument);
    }

    #[test]
    fn the_gpu_sets_are_the_ones_upstream_checks() {
        for residency in Residency::ALL {
            assert_eq!(DirectAccess::DISCRETE_GPU.includes(residency), residency.is_engine_writable(false));
            assert_eq!(DirectAccess::INTEGRATED_GPU.includes(residency), residency.is_engine_writable(true));
        }
        assert_eq!(DirectAccess::of(&[]).to_string(), "no memory");
        assert_eq!(DirectAccess::DISCRETE_GPU.to_string(), "device or managed");
    }
}
