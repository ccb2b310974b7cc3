//! The sampler and stop-checker functions of `include/kv_delegate.h`: thin wrappers over
//! [`crate::generation`]. Every pointer is checked (null, a length no array has) before it is read, every
//! call catches a panic (reported as ExecuTorch's `Internal`), and every refusal is ExecuTorch's code with a
//! one-line message for `kvd_last_error`. With `crate::ffi`, the crate's only `unsafe` code: the exports, the
//! caller's arrays and strings read during the call, the handles the caller owns between `_new` and `_free`.
#![allow(unsafe_code)]

use std::ffi::{c_char, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use et_error::{ErrorCode, HasErrorCode};
use sampling::{Params, Sampler};
use text_gen::StopChecker;

use crate::generation::{self, GenerationError};
use crate::registration;

/// `kvd_sampler`: a checked sampler, owned by the caller between `kvd_sampler_new` and `kvd_sampler_free`.
pub struct KvdSampler(Sampler);

/// `kvd_stop_checker`: one reply's stop rules and state.
pub struct KvdStopChecker(StopChecker);

/// Runs `call`, recording its failure's message for `kvd_last_error`; a panic is `Internal`.
fn guarded(function: &str, call: impl FnOnce() -> Result<(), GenerationError>) -> u32 {
    match catch_unwind(AssertUnwindSafe(|| call().map_err(|err| (err.to_string(), err.error_code())))) {
        Ok(Ok(())) => ErrorCode::Ok.as_u32(),
        Ok(Err((message, code))) => {
            registration::record(message);
            code.as_u32()
        }
        Err(_) => {
            registration::record(format!("{function}: the library panicked (a bug)"));
            ErrorCode::Internal.as_u32()
        }
    }
}

fn null(function: &'static str, argument: &'static str, why: &str) -> GenerationError {
    GenerationError::Null { function, argument, why: why.to_owned() }
}

/// The `len` values at `data` (`argument` and `len_name` name them in errors): null is allowed only with a
/// length of 0.
///
/// # Safety
/// `data` is null, or readable for `len` values of `T` that nothing writes during the call.
unsafe fn array<'a, T>(
    function: &'static str,
    argument: &'static str,
    len_name: &'static str,
    data: *const T,
    len: usize,
) -> Result<&'a [T], GenerationError> {
    if len == 0 {
        return Ok(&[]);
    }
    if data.is_null() {
        return Err(null(function, argument, &format!(" but {len_name} is {len}")));
    }
    if len.checked_mul(std::mem::size_of::<T>()).is_none_or(|bytes| isize::try_from(bytes).is_err()) {
        return Err(GenerationError::Length { function, argument: len_name, len });
    }
    // SAFETY: `data` is not null and, as the caller promises, readable for `len` values of `T` that nothing
    // writes during the call; `len * size_of::<T>() <= isize::MAX` was checked; the slice does not outlive
    // the call (the caller's `'a` is this call).
    Ok(unsafe { std::slice::from_raw_parts(data, len) })
}

/// `kvd_error kvd_sampler_new(float temperature, uint32_t top_k, float top_p, float min_p, float
/// repetition_penalty, uint64_t seed, kvd_sampler** out)`: a sampler in `*out` (see `kv_delegate.h`).
///
/// # Safety
/// `out` is null (refused) or writable for one pointer.
#[no_mangle]
pub unsafe extern "C" fn kvd_sampler_new(
    temperature: f32,
    top_k: u32,
    top_p: f32,
    min_p: f32,
    repetition_penalty: f32,
    seed: u64,
    out: *mut *mut KvdSampler,
) -> u32 {
    guarded("kvd_sampler_new", || {
        if out.is_null() {
            return Err(null("kvd_sampler_new", "out", ": pass where to put the sampler"));
        }
        let top_k = usize::try_from(top_k).unwrap_or(usize::MAX);
        let params = Params { temperature, top_k, top_p, min_p, repetition_penalty, seed };
        let sampler = Box::into_raw(Box::new(KvdSampler(generation::sampler(params)?)));
        // SAFETY: `out` is not null and the caller promises it is writable for one pointer.
        unsafe { out.write(sampler) };
        Ok(())
    })
}

/// `kvd_error kvd_sampler_sample(const kvd_sampler* sampler, const float* logits, size_t vocab, const int64_t*
/// history, size_t history_len, uint64_t step, int64_t* token)`: the token for generated token `step`.
///
/// # Safety
/// `sampler` is null or a live handle of `kvd_sampler_new`; `logits` and `history` are null or readable for
/// `vocab` and `history_len` values; `token` is null or writable for one `int64_t`.
#[no_mangle]
pub unsafe extern "C" fn kvd_sampler_sample(
    sampler: *const KvdSampler,
    logits: *const f32,
    vocab: usize,
    history: *const i64,
    history_len: usize,
    step: u64,
    token: *mut i64,
) -> u32 {
    const F: &str = "kvd_sampler_sample";
    guarded(F, || {
        if sampler.is_null() {
            return Err(null(F, "sampler", ": pass a sampler of kvd_sampler_new"));
        }
        if token.is_null() {
            return Err(null(F, "token", ": pass where to put the token"));
        }
        // SAFETY: as the caller promises (the function's contract), checked for null and length here.
        let logits = unsafe { array(F, "logits", "vocab", logits, vocab)? };
        // SAFETY: as for `logits`.
        let history = unsafe { array(F, "history", "history_len", history, history_len)? };
        // SAFETY: `sampler` is not null and the caller promises it is a live handle of `kvd_sampler_new`.
        let sampler = unsafe { &(*sampler).0 };
        let picked = generation::sample(sampler, logits, history, step)?;
        // SAFETY: `token` is not null and the caller promises it is writable for one `int64_t`.
        unsafe { token.write(picked) };
        Ok(())
    })
}

/// `void kvd_sampler_free(kvd_sampler* sampler)`: frees a sampler; null does nothing.
///
/// # Safety
/// `sampler` is null or a live handle of `kvd_sampler_new`, not used again.
#[no_mangle]
pub unsafe extern "C" fn kvd_sampler_free(sampler: *mut KvdSampler) {
    if !sampler.is_null() {
        // SAFETY: the caller promises a live handle of `kvd_sampler_new` (a `Box::into_raw`), freed once.
        drop(unsafe { Box::from_raw(sampler) });
    }
}

/// `kvd_error kvd_stop_checker_new(const int64_t* eos, size_t eos_len, const char* const* stops, size_t
/// stops_len, uint64_t max_new_tokens, kvd_stop_checker** out)`: a stop checker for one reply in `*out`.
///
/// # Safety
/// `eos` is null or readable for `eos_len` values; `stops` is null or readable for `stops_len` pointers, each
/// null (refused) or a NUL-terminated string; `out` is null (refused) or writable for one pointer.
#[no_mangle]
pub unsafe extern "C" fn kvd_stop_checker_new(
    eos: *const i64,
    eos_len: usize,
    stops: *const *const c_char,
    stops_len: usize,
    max_new_tokens: u64,
    out: *mut *mut KvdStopChecker,
) -> u32 {
    const F: &str = "kvd_stop_checker_new";
    guarded(F, || {
        if out.is_null() {
            return Err(null(F, "out", ": pass where to put the stop checker"));
        }
        // SAFETY: as the caller promises, checked for null and length here.
        let eos = unsafe { array(F, "eos", "eos_len", eos, eos_len)? };
        // SAFETY: as for `eos`.
        let stops = unsafe { array(F, "stops", "stops_len", stops, stops_len)? };
        let mut texts = Vec::with_capacity(stops.len());
        for (i, &stop) in stops.iter().enumerate() {
            if stop.is_null() {
                return Err(GenerationError::Null {
                    function: F,
                    argument: "a stop string",
                    why: format!(" (stops[{i}])"),
                });
            }
            // SAFETY: not null, and the caller promises a NUL-terminated string alive during the call.
            let text = unsafe { CStr::from_ptr(stop) };
            let text = text
                .to_str()
                .map_err(|_| GenerationError::NotUtf8 { function: F, argument: format!("stops[{i}]") })?;
            texts.push(text.to_owned());
        }
        let checker =
            Box::into_raw(Box::new(KvdStopChecker(generation::stop_checker(eos, texts, max_new_tokens))));
        // SAFETY: `out` is not null and the caller promises it is writable for one pointer.
        unsafe { out.write(checker) };
        Ok(())
    })
}

/// `kvd_error kvd_stop_checker_push(kvd_stop_checker* checker, int64_t token, const char* text, size_t
/// text_len, int32_t* stop)`: adds a generated token and the text it added to the reply; `*stop` is a
/// `KVD_STOP_*` value.
///
/// # Safety
/// `checker` is null or a live handle of `kvd_stop_checker_new` no other thread uses during the call; `text`
/// is null or readable for `text_len` bytes; `stop` is null (refused) or writable for one `int32_t`.
#[no_mangle]
pub unsafe extern "C" fn kvd_stop_checker_push(
    checker: *mut KvdStopChecker,
    token: i64,
    text: *const c_char,
    text_len: usize,
    stop: *mut i32,
) -> u32 {
    const F: &str = "kvd_stop_checker_push";
    guarded(F, || {
        if checker.is_null() {
            return Err(null(F, "checker", ": pass a stop checker of kvd_stop_checker_new"));
        }
        if stop.is_null() {
            return Err(null(F, "stop", ": pass where to put the stop reason"));
        }
        // SAFETY: as the caller promises, checked for null and length here.
        let bytes = unsafe { array(F, "text", "text_len", text.cast::<u8>(), text_len)? };
        let text = std::str::from_utf8(bytes)
            .map_err(|_| GenerationError::NotUtf8 { function: F, argument: "text".to_owned() })?;
        // SAFETY: not null; the caller promises a live handle no other thread uses during the call.
        let checker = unsafe { &mut (*checker).0 };
        let code = generation::stop_code(checker.push(token, text));
        // SAFETY: `stop` is not null and the caller promises it is writable for one `int32_t`.
        unsafe { stop.write(code) };
        Ok(())
    })
}

/// `void kvd_stop_checker_free(kvd_stop_checker* checker)`: frees a stop checker; null does nothing.
///
/// # Safety
/// `checker` is null or a live handle of `kvd_stop_checker_new`, not used again.
#[no_mangle]
pub unsafe extern "C" fn kvd_stop_checker_free(checker: *mut KvdStopChecker) {
    if !checker.is_null() {
        // SAFETY: the caller promises a live handle of `kvd_stop_checker_new` (a `Box::into_raw`), freed once.
        drop(unsafe { Box::from_raw(checker) });
    }
}
