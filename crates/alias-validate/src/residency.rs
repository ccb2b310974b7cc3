//! The per-call residency gate for aliased inputs, as a pure function.
//!
//! An output aliased onto an input is written *in place* into the storage bound to that input. That only
//! reaches the caller when the pointer the engine binds is the caller's own storage. Two delegate paths bind
//! something else: an ordinary host input is staged into a delegate-owned device buffer, and a zero-byte
//! input is bound to a scratch allocation. For an aliased input either path would make the engine write
//! where the caller never reads, silently losing the update (UPSTREAM.md section 3). Delegates therefore call
//! [`check_aliased_input`] for every aliased input of every call, *before* deciding on staging or the
//! zero-byte path.
//!
//! ```
//! use alias_validate::residency::{check_aliased_input, Residency};
//!
//! assert!(check_aliased_input("k_cache", Residency::Device, 4096, false).is_ok());
//! assert!(check_aliased_input("k_cache", Residency::Managed, 4096, false).is_ok());
//! // Host memory is refused on a discrete GPU, accepted on an integrated one (one physical memory).
//! assert!(check_aliased_input("k_cache", Residency::Host, 4096, false).is_err());
//! assert!(check_aliased_input("k_cache", Residency::Host, 4096, true).is_ok());
//! // Zero bytes is refused everywhere.
//! assert!(check_aliased_input("k_cache", Residency::Device, 0, false).is_err());
//! ```

use std::fmt;

use crate::Error;

/// Where a tensor's storage lives, as the delegate learns it per call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Residency {
    /// Pageable host memory.
    Host,
    /// Page-locked host memory (`cudaMallocHost`): DMA-readable, but still host memory on a discrete GPU.
    PinnedHost,
    /// Device memory (`cudaMalloc`).
    Device,
    /// Managed (unified) memory (`cudaMallocManaged`), one address valid on host and device.
    Managed,
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

/// Checks one aliased input of one call: its storage must be device or managed memory (or any host memory
/// when `integrated_gpu`), and it must have `nbytes > 0`.
///
/// Call it before any host-staging or zero-byte path. Residency is checked first, then size.
///
/// # Errors
///
/// [`Error::AliasedInputNotOnDevice`] or [`Error::AliasedInputEmpty`], both
/// [`et_error::ErrorCode::InvalidArgument`] with upstream's message
/// `aliased input '<name>' must be on GPU or unified memory`.
pub fn check_aliased_input(
    name: &str,
    residency: Residency,
    nbytes: u64,
    integrated_gpu: bool,
) -> Result<(), Error> {
    if !residency.is_engine_writable(integrated_gpu) {
        return Err(Error::AliasedInputNotOnDevice { name: name.to_owned(), residency });
    }
    if nbytes == 0 {
        return Err(Error::AliasedInputEmpty { name: name.to_owned() });
    }
    Ok(())
}
