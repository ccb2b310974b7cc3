//! Fuzzes `pte_format::Program::parse`; see `oracle.rs` for the invariants.
#![no_main]

#[path = "../oracle.rs"]
mod oracle;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    oracle::check_pte(data);
});
