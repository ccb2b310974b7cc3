//! The sampler and stop-checker functions called as a C program calls them (same symbols, raw pointers and
//! lengths): a sampler gives `sampling::Sampler`'s tokens (greedy is the argmax, a seed reproduces), a stop
//! checker ends at each rule, and every bad pointer, length, parameter or string is ExecuTorch's
//! `InvalidArgument` with one line naming the function and the argument, never a panic or a write.

use std::ffi::{c_char, CString};
use std::ptr::{null, null_mut};

use kv_delegate::{
    kvd_last_error, kvd_sampler_free, kvd_sampler_new, kvd_sampler_sample, kvd_stop_checker_free,
    kvd_stop_checker_new, kvd_stop_checker_push, KvdSampler, KvdStopChecker,
};
use sampling::{Params, Sampler};

const OK: u32 = 0;
const INVALID_ARGUMENT: u32 = 0x12;
const LOGITS: [f32; 6] = [0.5, 2.0, -1.0, 1.5, 2.0, 0.0];

/// The calling thread's last message (read whole, so it is forgotten).
fn message() -> String {
    let mut buf = vec![0u8; 4096];
    // SAFETY: `buf` is writable for its length.
    let n = unsafe { kvd_last_error(buf.as_mut_ptr().cast(), buf.len()) };
    String::from_utf8(buf[..n.min(buf.len())].to_vec()).expect("a UTF-8 message")
}

fn new_sampler(p: Params) -> Result<*mut KvdSampler, (u32, String)> {
    let mut out = null_mut();
    let top_k = u32::try_from(p.top_k).expect("a small top-k");
    // SAFETY: `out` is writable for one pointer.
    let code = unsafe {
        kvd_sampler_new(p.temperature, top_k, p.top_p, p.min_p, p.repetition_penalty, p.seed, &mut out)
    };
    if code == OK {
        Ok(out)
    } else {
        assert!(out.is_null(), "nothing is written on a refusal");
        Err((code, message()))
    }
}

fn sample(sampler: *const KvdSampler, logits: &[f32], history: &[i64], step: u64) -> i64 {
    let mut token = -1;
    // SAFETY: a live sampler; the slices are readable for their lengths; `token` is writable.
    let code = unsafe {
        kvd_sampler_sample(
            sampler,
            logits.as_ptr(),
            logits.len(),
            history.as_ptr(),
            history.len(),
            step,
            &mut token,
        )
    };
    assert_eq!(code, OK, "{}", message());
    token
}

#[test]
fn a_sampler_picks_the_rust_samplers_tokens_and_greedy_is_the_argmax() {
    let greedy = new_sampler(Params::default()).expect("a greedy sampler");
    assert_eq!(sample(greedy, &LOGITS, &[], 0), 1, "the first largest logit");
    let params = Params {
        temperature: 0.9,
        top_k: 4,
        top_p: 0.95,
        repetition_penalty: 1.3,
        seed: 11,
        ..Params::default()
    };
    let sampler = new_sampler(params).expect("a sampler");
    let rust = Sampler::new(params).expect("valid params");
    let history = [1i64, 4];
    let drawn: Vec<i64> = (0..64).map(|step| sample(sampler, &LOGITS, &history, step)).collect();
    let expected: Vec<i64> = (0..64).map(|step| rust.pick(&LOGITS, &history, step) as i64).collect();
    assert_eq!(drawn, expected);
    assert!(drawn.iter().collect::<std::collections::BTreeSet<_>>().len() > 1, "it samples: {drawn:?}");
    // SAFETY: handles of kvd_sampler_new, freed once; null is allowed.
    unsafe {
        kvd_sampler_free(greedy);
        kvd_sampler_free(sampler);
        kvd_sampler_free(null_mut());
    }
}

#[test]
fn bad_sampler_arguments_are_invalid_argument_naming_them() {
    let (code, line) = new_sampler(Params { top_p: 0.0, ..Params::default() }).expect_err("top_p 0");
    assert_eq!((code, line.as_str()), (INVALID_ARGUMENT, "kvd_sampler_new: --top-p 0: must be in (0, 1]"));
    let (code, line) = new_sampler(Params { temperature: f32::NAN, ..Params::default() }).expect_err("NaN");
    assert!(code == INVALID_ARGUMENT && line.contains("--temperature NaN"), "{line}");
    // SAFETY: a null `out` is refused before anything is written.
    let code = unsafe { kvd_sampler_new(0.0, 0, 1.0, 0.0, 1.0, 0, null_mut()) };
    assert_eq!(
        (code, message()),
        (INVALID_ARGUMENT, "kvd_sampler_new: out is NULL: pass where to put the sampler".into())
    );

    let sampler = new_sampler(Params::default()).expect("a sampler");
    let mut token = -1;
    let cases: [(*const KvdSampler, *const f32, usize, *const i64, usize, *mut i64, &str); 6] = [
        (null(), LOGITS.as_ptr(), 6, null(), 0, &mut token, "sampler is NULL"),
        (sampler, LOGITS.as_ptr(), 6, null(), 0, null_mut(), "token is NULL"),
        (sampler, null(), 6, null(), 0, &mut token, "logits is NULL but vocab is 6"),
        (sampler, LOGITS.as_ptr(), 0, null(), 0, &mut token, "vocab is 0"),
        (sampler, LOGITS.as_ptr(), 6, null(), 2, &mut token, "history is NULL but history_len is 2"),
        (
            sampler,
            LOGITS.as_ptr(),
            usize::MAX,
            null(),
            0,
            &mut token,
            "vocab 18446744073709551615 is larger than any array",
        ),
    ];
    for (s, logits, vocab, history, history_len, out, expected) in cases {
        // SAFETY: every pointer is null or valid for its length; the function refuses the bad ones before
        // reading (the huge vocab is refused by its size, never read).
        let code = unsafe { kvd_sampler_sample(s, logits, vocab, history, history_len, 0, out) };
        let line = message();
        assert_eq!(code, INVALID_ARGUMENT, "{expected}");
        assert!(line.starts_with("kvd_sampler_sample: ") && line.contains(expected), "{line}");
        assert!(!line.contains('\n'), "{line}");
    }
    assert_eq!(token, -1, "nothing written on a refusal");
    // SAFETY: a handle of kvd_sampler_new, freed once.
    unsafe { kvd_sampler_free(sampler) };
}

fn new_checker(eos: &[i64], stops: &[*const c_char], max: u64) -> Result<*mut KvdStopChecker, (u32, String)> {
    let mut out = null_mut();
    // SAFETY: the slices are readable for their lengths, each string NUL-terminated or null; `out` writable.
    let code =
        unsafe { kvd_stop_checker_new(eos.as_ptr(), eos.len(), stops.as_ptr(), stops.len(), max, &mut out) };
    if code == OK {
        Ok(out)
    } else {
        Err((code, message()))
    }
}

fn push(checker: *mut KvdStopChecker, token: i64, text: &[u8]) -> Result<i32, (u32, String)> {
    let mut stop = -1;
    // SAFETY: a live checker; `text` readable for its length; `stop` writable.
    let code = unsafe { kvd_stop_checker_push(checker, token, text.as_ptr().cast(), text.len(), &mut stop) };
    if code == OK {
        Ok(stop)
    } else {
        Err((code, message()))
    }
}

#[test]
fn a_stop_checker_ends_at_an_eos_id_a_stop_string_across_tokens_and_the_budget() {
    let end = CString::new("END").expect("a C string");
    let checker = new_checker(&[2, 7], &[end.as_ptr()], 0).expect("a checker");
    assert_eq!(push(checker, 5, "日本 E".as_bytes()), Ok(0));
    assert_eq!(push(checker, 5, b"N"), Ok(0));
    assert_eq!(push(checker, 5, b"D."), Ok(2), "KVD_STOP_STRING");
    let eos = new_checker(&[2, 7], &[], 3).expect("a checker");
    assert_eq!(push(eos, 7, b""), Ok(1), "KVD_STOP_EOS, the second id");
    let budget = new_checker(&[], &[], 2).expect("a checker");
    assert_eq!((push(budget, 5, b"a"), push(budget, 5, b"b")), (Ok(0), Ok(3)), "KVD_STOP_LENGTH");
    // SAFETY: handles of kvd_stop_checker_new, freed once; null is allowed.
    unsafe {
        kvd_stop_checker_free(checker);
        kvd_stop_checker_free(eos);
        kvd_stop_checker_free(budget);
        kvd_stop_checker_free(null_mut());
    }
}

#[test]
fn bad_stop_checker_arguments_are_invalid_argument_naming_them() {
    let bad_utf8 = [0xffu8, 0];
    let cases: [(&[*const c_char], &str); 2] = [
        (&[null()], "kvd_stop_checker_new: a stop string is NULL (stops[0])"),
        (&[bad_utf8.as_ptr().cast()], "kvd_stop_checker_new: stops[0] is not UTF-8 text"),
    ];
    for (stops, expected) in cases {
        assert_eq!(new_checker(&[], stops, 0).err(), Some((INVALID_ARGUMENT, expected.to_owned())));
    }
    let mut out = null_mut();
    // SAFETY: null arrays with lengths are refused before anything is read.
    let code = unsafe { kvd_stop_checker_new(null(), 3, null(), 0, 0, &mut out) };
    assert_eq!(
        (code, message()),
        (INVALID_ARGUMENT, "kvd_stop_checker_new: eos is NULL but eos_len is 3".into())
    );
    assert!(out.is_null());

    let checker = new_checker(&[], &[], 0).expect("a checker");
    assert_eq!(
        push(checker, 1, &[0xe6, 0x97]).err().map(|e| e.1),
        Some("kvd_stop_checker_push: text is not UTF-8 text".into())
    );
    let mut stop = -1;
    // SAFETY: null pointers are refused before anything is read or written.
    let codes = unsafe {
        [
            kvd_stop_checker_push(null_mut(), 1, null(), 0, &mut stop),
            kvd_stop_checker_push(checker, 1, null(), 4, &mut stop),
            kvd_stop_checker_push(checker, 1, null(), 0, null_mut()),
        ]
    };
    assert_eq!(codes, [INVALID_ARGUMENT; 3]);
    assert_eq!(stop, -1, "nothing written on a refusal");
    // SAFETY: a handle of kvd_stop_checker_new, freed once.
    unsafe { kvd_stop_checker_free(checker) };
}

#[test]
fn the_headers_stop_codes_are_what_push_reports() {
    let header = include_str!("../include/kv_delegate.h");
    for define in ["KVD_STOP_NONE 0", "KVD_STOP_EOS 1", "KVD_STOP_STRING 2", "KVD_STOP_LENGTH 3"] {
        assert!(header.contains(&format!("#define {define} ")), "{define}");
    }
}
