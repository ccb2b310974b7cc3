//! `kvd_check_program` called as a C program calls it (same symbol, raw pointer and length): every committed
//! program passes; the hostile fixture (a DelegateCall output in the program's constant data) is
//! `InvalidProgram` with one line naming the method, the call, the argument and why; null, empty, short and
//! garbage bytes are refused with a code and a line, never a panic. No registration is needed.

use std::ffi::c_void;
use std::path::{Path, PathBuf};

use kv_delegate::{kvd_check_program, kvd_last_error};

const INVALID_PROGRAM: u32 = 0x23;
const INVALID_ARGUMENT: u32 = 0x12;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/executorch")
}

/// `kvd_check_program(data, len)` and the calling thread's message after it (`kvd_last_error` into a buffer
/// large enough, so it is forgotten and cannot leak into the next call).
fn check_raw(data: *const c_void, len: usize) -> (u32, String) {
    // SAFETY: every caller passes null or a pointer to `len` readable bytes it owns for the call.
    let code = unsafe { kvd_check_program(data, len) };
    let mut buf = vec![0u8; 4096];
    // SAFETY: `buf` is writable for its length.
    let n = unsafe { kvd_last_error(buf.as_mut_ptr().cast(), buf.len()) };
    assert!(n < buf.len(), "a message of {n} bytes does not fit the test's buffer");
    (code, String::from_utf8(buf[..n].to_vec()).expect("a UTF-8 message"))
}

fn check(bytes: &[u8]) -> (u32, String) {
    check_raw(bytes.as_ptr().cast(), bytes.len())
}

/// Every `.pte` under `dir` (not below it).
fn programs_in(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "pte"))
        .collect();
    found.sort();
    found
}

/// A refusal is one line that starts with the function's name.
fn assert_one_line(message: &str) {
    assert!(message.starts_with("kvd_check_program: "), "{message}");
    assert_eq!(message.lines().count(), 1, "{message}");
}

#[test]
fn every_committed_program_passes() {
    let root = fixtures();
    let programs: Vec<PathBuf> =
        ["", "outside", "real"].iter().flat_map(|sub| programs_in(&root.join(sub))).collect();
    assert!(programs.len() >= 6, "the committed programs: {programs:?}");
    for path in programs {
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(check(&bytes), (0, String::new()), "{}", path.display());
    }
}

#[test]
fn a_delegate_output_in_the_programs_constant_data_is_invalid_program_naming_it() {
    // Before the check a C++ application loaded it and the delegate wrote its new K cache into the program's
    // read-only mapping (SIGSEGV); ExecuTorch alone cannot tell.
    let path = fixtures().join("hostile/kv_out_in_constant.pte");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let (code, message) = check(&bytes);
    assert_eq!(code, INVALID_PROGRAM, "{message}");
    assert_one_line(&message);
    for part in [
        "method 'forward'",
        "chains[0].instructions[0] (DelegateCall to ReferenceBackend)",
        "argument 4 ('k_cache_out_0', value 4) is an output the delegate writes",
        "not planned memory: it is constant data of the program (data_buffer_idx 1, no allocation_info)",
    ] {
        assert!(message.contains(part), "{part:?} missing from: {message}");
    }
}

#[test]
fn null_empty_short_and_garbage_bytes_are_refused_with_a_code_and_a_line() {
    let (code, message) = check_raw(std::ptr::null(), 64);
    assert_eq!(code, INVALID_ARGUMENT, "{message}");
    assert_one_line(&message);
    assert!(message.contains("data is NULL but len is 64"), "{message}");
    // NULL with 0 is C's empty buffer: no program.
    let (code, message) = check_raw(std::ptr::null(), 0);
    assert_eq!(code, INVALID_PROGRAM, "{message}");
    assert!(message.contains("the 0 bytes are not a readable program"), "{message}");

    let good = std::fs::read(fixtures().join("buffers_2m_planned.pte")).expect("a committed program");
    let garbage: Vec<u8> = (0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let mut flipped = good.clone();
    flipped[4..8].copy_from_slice(b"XXXX"); // the file identifier
    for (what, bytes) in [
        ("empty", &good[..0]),
        ("3 bytes", &good[..3]),
        ("the first half", &good[..good.len() / 2]),
        ("garbage", &garbage[..]),
        ("another identifier", &flipped[..]),
    ] {
        let (code, message) = check(bytes);
        assert_ne!(code, 0, "{what}: accepted");
        assert!(code == INVALID_PROGRAM || code == 0x10, "{what}: code {code:#x}: {message}");
        assert_one_line(&message);
        assert!(
            message.contains(&format!("the {} bytes are not a readable program: ", bytes.len())),
            "{what}: {message}"
        );
    }
    // The whole program still passes, and a success leaves no message.
    assert_eq!(check(&good), (0, String::new()));
}
