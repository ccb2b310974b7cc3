//! No storage is shared with another process on this target (worker processes are Linux only): the
//! fallback of `shared.rs`.

use std::ptr::NonNull;

/// Heap memory has no file.
pub(super) type File = ();

/// What heap memory holds for its file.
pub(super) const NO_FILE: File = ();

/// Never unmaps: no storage is a mapping here.
///
/// # Safety
/// None needed; the signature is `shared.rs`'s.
pub(super) unsafe fn unmap(_ptr: NonNull<u8>, _len: usize, _file: &File) -> bool {
    false
}
