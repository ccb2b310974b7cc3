//! What every module shares: turning cudarc's results and panics into [`Error`]s.
//!
//! cudarc (with `dynamic-loading`) resolves each entry point on its first call and panics when the library
//! or the symbol is missing. Every call into cudarc therefore goes through [`guard`], which catches such a
//! panic and reports it as a typed error, and the library itself is probed before first use.

use std::panic::{catch_unwind, AssertUnwindSafe};

use cudarc::driver::DriverError;

use crate::error::Error;

/// `CUDA_ERROR_X (what it means)`.
pub(crate) fn describe(err: DriverError) -> String {
    match (err.error_name(), err.error_string()) {
        (Ok(name), Ok(text)) => format!("{} ({})", name.to_string_lossy(), text.to_string_lossy()),
        _ => format!("{:?}", err.0),
    }
}

/// The text of a caught panic.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "cudarc panicked".to_owned())
}

/// Runs `f`, turning a panic (a library or entry point cudarc could not load) into `unusable(message)`.
pub(crate) fn guard<T>(
    unusable: impl FnOnce(String) -> Error,
    f: impl FnOnce() -> Result<T, Error>,
) -> Result<T, Error> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(panic) => Err(unusable(panic_message(panic.as_ref()))),
    }
}

/// [`guard`] for a driver call on device `ordinal`: a driver error is [`Error::Driver`] naming `call`, a
/// panic [`Error::DriverUnusable`].
pub(crate) fn call<T>(
    call: &'static str,
    ordinal: i32,
    f: impl FnOnce() -> Result<T, DriverError>,
) -> Result<T, Error> {
    guard(
        |message| Error::DriverUnusable { reason: format!("{call}: {message}") },
        || f().map_err(|err| Error::Driver { call, ordinal, reason: describe(err) }),
    )
}

/// The library file names cudarc tries for `names`, deduplicated.
pub(crate) fn candidates(names: &[&str]) -> Vec<String> {
    let mut tried: Vec<String> =
        names.iter().flat_map(|name| cudarc::get_lib_name_candidates(name)).collect();
    tried.sort();
    tried.dedup();
    tried
}

/// Whether `libcuda` can be loaded.
pub(crate) fn driver_present() -> bool {
    // SAFETY: `is_culib_present` only `dlopen`s the driver's library names and drops what it opened; loading
    // libcuda runs its initialisers, which have no preconditions.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// [`Error::NoDriver`], naming what was tried.
pub(crate) fn no_driver() -> Error {
    let tried = candidates(&["cuda", "nvcuda"]);
    Error::NoDriver {
        reason: format!(
            "the driver library could not be loaded ({} names tried, libcuda.so.1 among them); install an \
             NVIDIA driver",
            tried.len()
        ),
    }
}
