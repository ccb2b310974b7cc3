//! The C functions of `include/kv_delegate.h`, exported unmangled from the static and the shared library: thin
//! wrappers over [`crate::registration`] and [`crate::check`]; the three that run code that could panic catch it
//! (a panic must not unwind into C), `kvd_register_backends` and `kvd_check_program` as ExecuTorch's `Internal`.
//! This module is the crate's only `unsafe` code: the `#[no_mangle]` exports, the caller's buffer in
//! `kvd_last_error` and the caller's program bytes in `kvd_check_program`.
//!
//! `#[no_mangle]` is sound here because each name is defined once in the process: the header reserves the
//! `kvd_` prefix, and the bridge's C++ shim, linked into the same libraries, defines other `kvd_` names
//! (`kvd_register_backend`, `kvd_module_*`, ...), none of these six.
#![allow(unsafe_code)]

use std::ffi::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};

use et_error::{ErrorCode, HasErrorCode};

use crate::check::{self, CheckError};
use crate::registration;

/// `kvd_error kvd_register_backends(void)`: registers our backends in ExecuTorch's registry once per process;
/// 0 (`Error::Ok`) or ExecuTorch's code, whose message [`kvd_last_error`] gives.
#[no_mangle]
pub extern "C" fn kvd_register_backends() -> u32 {
    match catch_unwind(registration::register) {
        Ok(code) => code.as_u32(),
        Err(_) => {
            registration::record("kvd_register_backends: the library panicked (a bug)".to_owned());
            ErrorCode::Internal.as_u32()
        }
    }
}

/// `kvd_error kvd_check_program(const void* data, size_t len)`: 0 (`Error::Ok`) when the `len` bytes at `data`
/// are a program ExecuTorch may load with our delegates ([`check::check_program`]), else ExecuTorch's code
/// (`InvalidProgram` for bytes that are no program or a program whose delegate would write outside planned
/// memory, `InvalidArgument` for a null `data` with a non-zero `len`), whose one-line message [`kvd_last_error`]
/// gives. The bytes are only read, during the call.
///
/// # Safety
/// `data` is null, or readable for `len` bytes that nothing writes during the call.
#[no_mangle]
pub unsafe extern "C" fn kvd_check_program(data: *const std::ffi::c_void, len: usize) -> u32 {
    let check = || {
        if data.is_null() {
            // `(NULL, 0)` is C's empty buffer (an empty `std::vector`'s `data()`): no program either way.
            return if len == 0 { check::check_program(&[]) } else { Err(CheckError::NoData { len }) };
        }
        if isize::try_from(len).is_err() {
            return Err(CheckError::Length { len });
        }
        // SAFETY: `data` is not null, the caller promises it is readable for `len` bytes that nothing writes
        // while this call reads them, and `len <= isize::MAX`; the slice does not outlive the call.
        let bytes = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) };
        check::check_program(bytes)
    };
    // The message is made inside the guard too: nothing of the check unwinds into C.
    let checked = catch_unwind(|| match check() {
        Ok(()) => ErrorCode::Ok,
        Err(err) => {
            registration::record(format!("kvd_check_program: {err}"));
            err.error_code()
        }
    });
    match checked {
        Ok(code) => code.as_u32(),
        Err(_) => {
            registration::record("kvd_check_program: the library panicked (a bug)".to_owned());
            ErrorCode::Internal.as_u32()
        }
    }
}

/// `size_t kvd_backend_count(void)`: how many backend ids [`kvd_register_backends`] registered.
#[no_mangle]
pub extern "C" fn kvd_backend_count() -> usize {
    registration::registered().len()
}

/// `const char* kvd_backend_name(size_t index)`: the `index`-th id registered (NUL-terminated, alive for the
/// process, since registration happens once), or null past the end.
#[no_mangle]
pub extern "C" fn kvd_backend_name(index: usize) -> *const c_char {
    registration::registered().get(index).map_or(std::ptr::null(), |id| id.as_ptr())
}

/// `const char* kvd_version(void)`: this library's version, NUL-terminated, static.
#[no_mangle]
pub extern "C" fn kvd_version() -> *const c_char {
    registration::VERSION.as_ptr()
}

/// `size_t kvd_last_error(char* buf, size_t cap)`: copies the calling thread's last failure message into `buf`
/// (at most `cap - 1` bytes and a NUL; nothing when `buf` is null or `cap` is 0) and returns its whole length,
/// 0 when there was none. A message copied whole is forgotten, so an older message is never taken for a later
/// failure's; one cut short or only measured stays for a call with a larger buffer.
///
/// # Safety
/// `buf` is null, or writable for `cap` bytes.
#[no_mangle]
pub unsafe extern "C" fn kvd_last_error(buf: *mut c_char, cap: usize) -> usize {
    let Ok(message) = catch_unwind(AssertUnwindSafe(registration::last_error)) else { return 0 };
    let Some(message) = message else { return 0 };
    let bytes = message.as_bytes();
    if !buf.is_null() && cap > 0 {
        let len = bytes.len().min(cap - 1);
        // SAFETY: the caller promises `buf` is writable for `cap` bytes (it is not null here); `len + 1 <= cap`,
        // and `bytes` is this function's own string, so the ranges do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), buf, len);
            *buf.add(len) = 0;
        }
        if len == bytes.len() {
            registration::forget_last_error();
        }
    }
    bytes.len()
}
