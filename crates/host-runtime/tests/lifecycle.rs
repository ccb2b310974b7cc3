//! The cache lifecycle through the library API: rewind, then decode, equals the fresh run; caches saved,
//! restored into a new program and decoded equal the original run; a file from another program is refused in
//! one line naming the difference; a restore clears the torn mark, a rewind does not.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use delegate_abi::host::HostConfig;
use et_error::{ErrorCode, HasErrorCode};
use host_runtime::generate::{continue_from, generate};
use host_runtime::manifest::Manifest;
use host_runtime::plugins::{Discovery, Registry};
use host_runtime::program::{Error, Mode, Program};

#[path = "support/kv_pte.rs"]
mod kv_pte;

#[path = "support/cache_program.rs"]
mod cache_program;
use cache_program::{config, export, fresh_run, load};

#[path = "support/in_place_blob.rs"]
mod in_place_blob;

#[test]
fn rewind_then_decode_equals_the_fresh_run_from_that_position() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut program = load(&export(dir.path(), &config()));
    let (fed, tokens) = fresh_run(&mut program);
    // The caches now hold positions 0..12; back to 6, the token there fed again: the fresh run's tokens.
    program.rewind(6).expect("rewinds");
    let again = continue_from(&mut program, 6, &fed[6..7], 3).expect("continues");
    assert_eq!(again, tokens[3..7], "tokens after a rewind to 6 are the fresh run's from 6");
    // A rejected continuation: another token at 6, then back to 6 and the original one decodes as before.
    continue_from(&mut program, 6, &[(fed[6] + 1) % 64], 4).expect("another continuation");
    program.rewind(6).expect("rewinds");
    assert_eq!(continue_from(&mut program, 6, &fed[6..7], 5).expect("continues"), tokens[3..9]);
    let past = program.rewind(17).expect_err("past the caches");
    assert_eq!(past.error_code(), ErrorCode::InvalidArgument, "{past}");
}

#[test]
fn saved_caches_restored_into_a_new_program_decode_as_the_original() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = export(dir.path(), &config());
    let mut original = load(&path);
    let (fed, tokens) = fresh_run(&mut original);
    let file = dir.path().join("cache.safetensors");
    original.save_cache(&file, 6, &fed[..6]).expect("saves");

    let mut restored = load(&path);
    let saved = restored.restore_cache(&file).expect("restores");
    assert_eq!((saved.position, saved.tokens.as_slice()), (6, &fed[..6]));
    // Positions 6.. were not saved: the restored cache holds zeros there, the original its later steps.
    let row = |program: &Program| program.buffer("k_cache_0").expect("buffer")[6 * 8 * 4..7 * 8 * 4].to_vec();
    assert!(row(&restored).iter().all(|&b| b == 0) && row(&original).iter().any(|&b| b != 0));
    let continued = continue_from(&mut restored, saved.position, &fed[6..7], 5).expect("continues");
    assert_eq!(continued, tokens[3..9], "the restored program decodes as the original did");
}

fn refusal(saved_from: &kv_example::Config, restored_into: &kv_example::Config) -> Error {
    let dir = tempfile::tempdir().expect("temp dir");
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::create_dir_all(&a).and_then(|()| std::fs::create_dir_all(&b)).expect("dirs");
    let mut original = load(&export(&a, saved_from));
    generate(&mut original, 2, |_, _| Ok(())).expect("generates");
    let file = dir.path().join("cache.safetensors");
    original.save_cache(&file, 5, &[]).expect("saves");
    let mut other = load(&export(&b, restored_into));
    let err = other.restore_cache(&file).expect_err("another program");
    assert_eq!(err.error_code(), ErrorCode::InvalidArgument, "{err}");
    assert!(!err.to_string().contains('\n'), "one line: {err}");
    err
}

#[test]
fn a_cache_from_a_changed_blob_or_other_shapes_is_refused_naming_the_difference() {
    let tiny = config();
    let reseeded = kv_example::Config { seed: tiny.seed + 1, ..tiny.clone() };
    let err = refusal(&tiny, &reseeded).to_string();
    assert!(
        err.contains("saved from another program: the blob of method '") && err.contains("differs (sha256"),
        "{err}"
    );
    let longer = kv_example::Config { max_len: 32, ..tiny.clone() };
    let err = refusal(&tiny, &longer).to_string();
    assert!(
        err.contains("buffer 'k_cache_0' is f32 [2, 16, 8] in the file, f32 [2, 32, 8] in the program"),
        "{err}"
    );
}

#[test]
fn the_cache_file_is_plain_safetensors_with_the_documented_metadata() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut program = load(&export(dir.path(), &config()));
    let (fed, _) = fresh_run(&mut program);
    let file = dir.path().join("cache.safetensors");
    program.save_cache(&file, 6, &fed[..6]).expect("saves");
    let (bytes, n, header) = safetensors_header(&file);
    let meta = &header["__metadata__"];
    assert_eq!(meta["format"], "kv-delegate-cache");
    assert_eq!(meta["format_version"], "1");
    assert_eq!(meta["position"], "6");
    let tokens: Vec<i64> = serde_json::from_str(meta["tokens"].as_str().expect("string")).expect("tokens");
    assert_eq!(tokens, fed[..6]);
    let buffers: serde_json::Value =
        serde_json::from_str(meta["buffers"].as_str().expect("string")).expect("json");
    assert_eq!(buffers["k_cache_0"]["sequence_axis"], 1);
    let blobs: serde_json::Value =
        serde_json::from_str(meta["blobs"].as_str().expect("string")).expect("json");
    assert_eq!(blobs["decode/0"].as_str().map(str::len), Some(64), "a SHA-256 per call: {blobs}");
    let k = &header["k_cache_0"];
    assert_eq!((k["dtype"].as_str(), &k["shape"]), (Some("F32"), &serde_json::json!([2, 6, 8])));
    let [start, end] = [0, 1].map(|i| k["data_offsets"][i].as_u64().expect("offset") as usize);
    let data = &bytes[8 + n + start..8 + n + end];
    // Head 0's six rows are the cache's first six rows, byte for byte.
    let cache = program.buffer("k_cache_0").expect("buffer");
    assert_eq!(&data[..6 * 8 * 4], &cache[..6 * 8 * 4]);
    assert_eq!(&data[6 * 8 * 4..], &cache[16 * 8 * 4..22 * 8 * 4], "head 1's rows follow");
}

#[path = "support/half_writer.rs"]
mod half_writer;

#[test]
fn a_restore_ends_a_torn_state_and_a_rewind_does_not() {
    let dir = tempfile::tempdir().expect("temp dir");
    let registry = Registry::discover(Discovery::new())
        .with_embedded(half_writer::delegate_root(), &HostConfig::default());
    let manifest = in_place_blob::program(dir.path(), "HalfBackend", &[("step", "cache")]);
    let mut program = Program::load(Manifest::load(&manifest).expect("manifest"), &registry, Mode::ZeroCopy)
        .expect("loads");
    program.execute("step").expect("runs");
    // No [generate]: no sequence axis is known, the whole buffer is saved.
    let file = dir.path().join("cache.safetensors");
    program.save_cache(&file, 1, &[]).expect("saves");
    let tear = |program: &mut Program| {
        half_writer::FAIL.store(true, Ordering::SeqCst);
        program.execute("step").expect_err("fails halfway");
        half_writer::FAIL.store(false, Ordering::SeqCst);
        assert_eq!(program.torn_buffers(), ["cache"]);
        assert!(matches!(program.execute("step"), Err(Error::TornBuffers { .. })));
    };
    tear(&mut program);
    program.rewind(0).expect("rewinds");
    assert_eq!(program.torn_buffers(), ["cache"], "a failed run may have written any row: still torn");
    assert!(matches!(program.execute("step"), Err(Error::TornBuffers { .. })));
    assert_eq!(program.restore_cache(&file).expect("restores").position, 1);
    assert!(program.torn_buffers().is_empty(), "a restore clears the torn mark");
    let cache = program.buffer("cache").expect("buffer");
    assert_eq!(cache.as_ref(), 1.0f32.to_le_bytes().repeat(4), "the saved cache, whole");
    program.execute("step").expect("runs again");
}

/// The tiny example (heads of 8) with every buffer, input and output in `memory`.
fn export_in(dir: &Path, memory: &str) -> PathBuf {
    let text = std::fs::read_to_string(export(dir, &config())).expect("manifest");
    let path = dir.join(format!("{memory}.toml"));
    std::fs::write(&path, text.replace("memory = \"host\"", &format!("memory = \"{memory}\"")))
        .expect("write");
    path
}

/// Rewind, save and restore with caches in CUDA `memory` (the reference delegate reads host-visible memory:
/// pinned and managed), against the host program's fresh run; a cache saved from host memory restores into
/// CUDA memory (the memory kind is no part of the identity).
fn cuda_memory_round_trip(memory: &str) {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut host = load(&export(dir.path(), &config()));
    let (fed, tokens) = fresh_run(&mut host);
    let from_host = dir.path().join("host.safetensors");
    host.save_cache(&from_host, 6, &fed[..6]).expect("saves");

    let mut program = load(&export_in(dir.path(), memory));
    let (cuda_fed, cuda_tokens) = fresh_run(&mut program);
    assert_eq!((cuda_fed.as_slice(), cuda_tokens.as_slice()), (fed.as_slice(), tokens.as_slice()));
    program.rewind(6).expect("rewinds");
    assert_eq!(continue_from(&mut program, 6, &fed[6..7], 3).expect("continues"), tokens[3..7]);
    let own = dir.path().join(format!("{memory}.safetensors"));
    program.save_cache(&own, 6, &fed[..6]).expect("saves");
    // The same tensor bytes (the header's metadata may list its keys in another order).
    let data = |path: &Path| {
        let bytes = std::fs::read(path).expect("read");
        bytes[8 + u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize..].to_vec()
    };
    assert_eq!(data(&own), data(&from_host), "the same caches");
    program.restore_cache(&from_host).expect("restores");
    assert_eq!(continue_from(&mut program, 6, &fed[6..7], 5).expect("continues"), tokens[3..9]);
}

#[test]
#[ignore = "needs a GPU: cargo test -p host-runtime --test lifecycle -- --ignored"]
fn pinned_caches_rewind_save_and_restore_as_host_caches_do() {
    cuda_memory_round_trip("pinned");
}

#[test]
#[ignore = "needs a GPU: cargo test -p host-runtime --test lifecycle -- --ignored"]
fn managed_caches_rewind_save_and_restore_as_host_caches_do() {
    cuda_memory_round_trip("managed");
}

/// A `.pte` program (its blobs are payloads inside the file, hashed there): its caches `[2, 16, 16]` have two
/// axes as long as the positions, so they are saved whole; restored into a new program they decode as the
/// original did.
#[test]
fn a_pte_programs_whole_caches_restore_into_a_new_program() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pte = dir.path().join("kv.pte");
    std::fs::write(&pte, kv_pte::bytes(true)).expect("write the program");
    let registry = Registry::discover(Discovery::new())
        .with_embedded(reference_delegate::delegate_root(), &HostConfig::default());
    let prompt = kv_example::Config::tiny().prompt;
    let load = || host_runtime::pte::load(&pte, &registry, Mode::ZeroCopy, Some(&prompt)).expect("loads");
    let mut original = load();
    let (fed, tokens) = fresh_run(&mut original);
    let file = dir.path().join("cache.safetensors");
    original.save_cache(&file, 6, &fed[..6]).expect("saves");
    let (_, _, header) = safetensors_header(&file);
    assert_eq!(header["k_cache_0"]["shape"], serde_json::json!([2, 16, 16]), "saved whole: {header}");

    let mut restored = load();
    assert_eq!(restored.restore_cache(&file).expect("restores").position, 6);
    assert_eq!(continue_from(&mut restored, 6, &fed[6..7], 5).expect("continues"), tokens[3..9]);
}

/// A safetensors file read as its spec says, with nothing of this project: a u64 LE header length, the JSON
/// header, then the data, each tensor at its offsets. The file's bytes, the header's length and the header.
fn safetensors_header(file: &Path) -> (Vec<u8>, usize, serde_json::Value) {
    let bytes = std::fs::read(file).expect("read");
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header = serde_json::from_slice(&bytes[8..8 + n]).expect("JSON header");
    (bytes, n, header)
}
