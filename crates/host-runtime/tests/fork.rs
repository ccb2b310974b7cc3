//! Forking a sequence through the library API: two branches from one prefix, decoded in turn through the same
//! delegate instances, each give the tokens of a fresh run on its own prefix and continuation; the fork copies
//! the prefix's rows only (the bytes reported), never reads the rows past it, and is refused past the position,
//! at an unknown position, on torn caches, and for a plugin that does not state it serves any sequence.
//!
//! The GPU tests (`#[ignore]`d) run the same with pinned and managed caches (the reference delegate reads
//! host-visible memory); `fork_device.rs` runs device caches through a GPU delegate.

use std::path::{Path, PathBuf};

use delegate_abi::host::HostConfig;
use et_error::{ErrorCode, HasErrorCode};
use host_runtime::generate::{continue_from, generate};
use host_runtime::manifest::Manifest;
use host_runtime::plugins::{Discovery, Registry};
use host_runtime::program::{Caches, Error, Mode, Program};

#[path = "support/kv_pte.rs"]
mod kv_pte;

#[path = "support/in_place_blob.rs"]
mod in_place_blob;

#[path = "support/unstated.rs"]
mod unstated;

/// The tiny example with heads of 8: caches `[2, 16, 8]` f32 (2 heads, 16 positions, 8 values a row).
fn config() -> kv_example::Config {
    kv_example::Config { head_dim: 8, ..kv_example::Config::tiny() }
}

fn export(dir: &Path, memory: &str) -> PathBuf {
    kv_example::export::reference(&config(), dir).expect("export");
    let text = std::fs::read_to_string(dir.join("program.toml")).expect("manifest");
    let path = dir.join(format!("{memory}.toml"));
    std::fs::write(&path, text.replace("memory = \"host\"", &format!("memory = \"{memory}\"")))
        .expect("write");
    path
}

fn registry() -> Registry {
    Registry::discover(Discovery::new())
        .with_embedded(reference_delegate::delegate_root(), &HostConfig::default())
}

fn load(path: &Path) -> Program {
    Program::load(Manifest::load(path).expect("manifest"), &registry(), Mode::ZeroCopy).expect("loads")
}

const PREFIX: u64 = 6;

/// The prompt (4 tokens) and 4 decode steps: the tokens fed at positions 0..8, and the 5 generated.
fn prefix_run(program: &mut Program) -> (Vec<i64>, Vec<i64>) {
    let generation = generate(program, 4, |_, _| Ok(())).expect("generates");
    let fed = config().prompt.iter().chain(&generation.tokens[..4]).copied().collect();
    (fed, generation.tokens)
}

/// A fresh program fed `fed[..PREFIX]` (prompt and 2 decode steps), then `token` at `PREFIX` and `steps`
/// more: the tokens after `token`.
fn fresh_branch(path: &Path, token: i64, steps: usize) -> Vec<i64> {
    let mut program = load(path);
    generate(&mut program, 2, |_, _| Ok(())).expect("generates");
    assert_eq!(program.position(), Some(PREFIX));
    continue_from(&mut program, PREFIX, &[token], steps).expect("continues")
}

/// Each branch from its position and token, one token at a time, swapping caches between the branches.
fn interleave(program: &mut Program, mut a: (u64, i64), mut b: (u64, i64), steps: usize) -> [Vec<i64>; 2] {
    let mut fork = program.fork(PREFIX).expect("forks").caches;
    let mut out = [Vec::new(), Vec::new()];
    for _ in 0..steps {
        for (branch, (position, token)) in [&mut a, &mut b].into_iter().enumerate() {
            if branch == 1 {
                program.swap_caches(&mut fork).expect("swaps in branch b");
            }
            let next = continue_from(program, *position, &[*token], 0).expect("continues")[0];
            out[branch].push(next);
            (*position, *token) = (*position + 1, next);
            if branch == 1 {
                program.swap_caches(&mut fork).expect("swaps branch a back");
            }
        }
    }
    out
}

fn branches_decode_as_fresh_runs(memory: &str) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = export(dir.path(), memory);
    let mut program = load(&path);
    let (fed, tokens) = prefix_run(&mut program);
    assert_eq!(program.position(), Some(8));
    // Branch a goes on from 8; branch b, forked at 6, feeds another token at 6 than a did.
    let other = (fed[6] + 1) % config().vocab as i64;
    let fresh_a = fresh_branch(&path, fed[6], 7);
    assert_eq!(fresh_a[..2], tokens[3..5], "the fresh run of a's prefix is a's own");
    let fresh_b = fresh_branch(&path, other, 4);
    assert_ne!(fresh_a[..5], fresh_b[..], "the branches differ, so a mix-up shows");
    let [a, b] = interleave(&mut program, (8, tokens[4]), (PREFIX, other), 5);
    assert_eq!(a, fresh_a[2..7], "branch a, decoded in turn with b, gives its fresh run's tokens");
    assert_eq!(b, fresh_b[..5], "branch b, decoded in turn with a, gives its fresh run's tokens");
    assert_eq!(program.position(), Some(13), "branch a's caches are the program's again");
}

#[test]
fn two_branches_from_one_prefix_decode_in_turn_as_their_fresh_runs() {
    branches_decode_as_fresh_runs("host");
}

#[test]
fn the_fork_copies_the_prefix_rows_of_every_head_of_every_cache_and_nothing_else() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut program = load(&export(dir.path(), "host"));
    prefix_run(&mut program);
    let names: Vec<String> = program.manifest().buffers.keys().cloned().collect();
    assert!(names.len() >= 2, "{names:?}");
    let fork = program.fork(PREFIX).expect("forks");
    let (heads, dh, elem) = (2, 8, 4);
    assert_eq!(fork.bytes_copied, PREFIX * heads * dh * elem * names.len() as u64);
    assert_eq!(fork.caches.position(), Some(PREFIX));
    let original: Vec<Vec<u8>> = names.iter().map(|n| program.buffer(n).expect("buffer").to_vec()).collect();
    let mut caches = fork.caches;
    program.swap_caches(&mut caches).expect("swaps");
    assert_eq!(program.position(), Some(PREFIX));
    let (row, block) = (dh as usize * 4, 16 * dh as usize * 4);
    for (name, original) in names.iter().zip(&original) {
        let forked = program.buffer(name).expect("buffer");
        for head in 0..heads as usize {
            let (start, prefix) = (head * block, head * block + PREFIX as usize * row);
            assert_eq!(forked[start..prefix], original[start..prefix], "{name} head {head}: the prefix");
            assert!(
                original[prefix..start + block].iter().any(|&b| b != 0),
                "{name}: rows past 6 were written"
            );
            assert!(forked[prefix..start + block].iter().all(|&b| b == 0), "{name} head {head}: not copied");
        }
    }
}

/// Overwrites rows `from..` of every head of every cache with NaN (0xFF bytes).
fn poison_rows_from(program: &mut Program, from: usize) {
    let names: Vec<String> = program.manifest().buffers.keys().cloned().collect();
    let (row, block) = (8 * 4, 16 * 8 * 4);
    for name in names {
        let mut bytes = program.buffer(&name).expect("buffer").to_vec();
        for head in bytes.chunks_exact_mut(block) {
            head[from * row..].fill(0xFF);
        }
        program.write_buffer(&name, &bytes).expect("writes");
    }
}

/// Caches of `program` full of NaN (0xFF bytes), swapped in and out to write them.
fn nan_caches(program: &mut Program) -> Caches {
    let mut caches = program.new_caches().expect("allocates");
    program.swap_caches(&mut caches).expect("swaps in");
    poison_rows_from(program, 0);
    program.swap_caches(&mut caches).expect("swaps out");
    caches
}

#[test]
fn rows_past_the_prefix_in_the_forks_caches_are_never_read() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = export(dir.path(), "host");
    let mut program = load(&path);
    let (fed, _) = prefix_run(&mut program);
    let other = (fed[6] + 1) % config().vocab as i64;
    let fresh_b = fresh_branch(&path, other, 4);
    // The fork's caches are NaN before the prefix is copied in: rows 6.. stay NaN.
    let mut fork = nan_caches(&mut program);
    let names: Vec<String> = program.manifest().buffers.keys().cloned().collect();
    let bytes = program.fork_into(PREFIX, &mut fork).expect("forks into them");
    assert_eq!(bytes, PREFIX * 2 * 8 * 4 * names.len() as u64);
    program.swap_caches(&mut fork).expect("swaps");
    assert!(program.buffer(&names[0]).expect("buffer")[PREFIX as usize * 32..][..32]
        .iter()
        .all(|&b| b == 0xFF));
    assert_eq!(continue_from(&mut program, PREFIX, &[other], 4).expect("continues"), fresh_b);
    // The poison is seen where it is read: the same branch with NaN in row 5 decodes other tokens.
    program.swap_caches(&mut fork).expect("swaps back");
    program.fork_into(PREFIX, &mut fork).expect("forks again");
    program.swap_caches(&mut fork).expect("swaps");
    poison_rows_from(&mut program, PREFIX as usize - 1);
    assert_ne!(continue_from(&mut program, PREFIX, &[other], 4).expect("continues"), fresh_b);
}

#[test]
fn a_pte_programs_square_caches_fork_along_their_second_to_last_axis() {
    // Caches [2, 16, 16]: two axes as long as the positions, the rows are the second-to-last.
    let dir = tempfile::tempdir().expect("temp dir");
    let pte = dir.path().join("kv.pte");
    std::fs::write(&pte, kv_pte::bytes(true)).expect("write the program");
    let registry = registry();
    let prompt = kv_pte::config().prompt;
    let load = || host_runtime::pte::load(&pte, &registry, Mode::ZeroCopy, Some(&prompt)).expect("loads");
    let mut program = load();
    let tokens = generate(&mut program, 4, |_, _| Ok(())).expect("generates").tokens;
    let fed: Vec<i64> = prompt.iter().chain(&tokens[..4]).copied().collect();
    let mut fresh = load();
    generate(&mut fresh, 2, |_, _| Ok(())).expect("generates");
    let expected = continue_from(&mut fresh, PREFIX, &fed[6..7], 4).expect("continues");
    let fork = program.fork(PREFIX).expect("forks");
    assert_eq!(fork.bytes_copied, PREFIX * 2 * 16 * 4 * program.manifest().buffers.len() as u64);
    let mut caches = fork.caches;
    program.swap_caches(&mut caches).expect("swaps");
    poison_rows_from_square(&mut program);
    assert_eq!(continue_from(&mut program, PREFIX, &fed[6..7], 4).expect("continues"), expected);
}

/// NaN in rows 6.. of every head of the `[2, 16, 16]` caches.
fn poison_rows_from_square(program: &mut Program) {
    let names: Vec<String> = program.manifest().buffers.keys().cloned().collect();
    for name in names {
        let mut bytes = program.buffer(&name).expect("buffer").to_vec();
        for head in bytes.chunks_exact_mut(16 * 16 * 4) {
            head[PREFIX as usize * 16 * 4..].fill(0xFF);
        }
        program.write_buffer(&name, &bytes).expect("writes");
    }
}

#[test]
fn a_fork_past_the_position_or_at_an_unknown_position_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut program = load(&export(dir.path(), "host"));
    assert_eq!(program.position(), Some(0), "a loaded program holds no position");
    assert_eq!(program.fork(0).expect("an empty prefix").bytes_copied, 0);
    prefix_run(&mut program);
    let err = program.fork(9).expect_err("past the position");
    assert!(matches!(err, Error::ForkPastPosition { prefix: 9, position: 8 }), "{err:?}");
    assert_eq!(err.error_code(), ErrorCode::InvalidArgument);
    assert_eq!(err.to_string(), "cannot fork the first 9 positions: the caches hold 8");
    program.fork(8).expect("the whole of it");
    // A method run directly: the host cannot tell how many rows it wrote.
    let g = program.manifest().generate.clone().expect("a generator");
    program.execute(&g.decode).expect("runs");
    assert_eq!(program.position(), None);
    let err = program.fork(1).expect_err("unknown position");
    assert!(matches!(err, Error::PositionUnknown), "{err:?}");
    assert_eq!(err.error_code(), ErrorCode::InvalidState);
    program.rewind(5).expect("declares the position");
    program.fork(5).expect("forks after the rewind");
}

#[test]
fn a_torn_program_does_not_fork_until_reset() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut program = load(&export(dir.path(), "host"));
    prefix_run(&mut program);
    let g = program.manifest().generate.clone().expect("a generator");
    // A position past the caches: the delegate refuses the call, which tears what the method writes.
    program.write_input(&g.decode, &g.position_input, &100i64.to_le_bytes()).expect("writes");
    program.execute(&g.decode).expect_err("refused by the delegate");
    assert!(!program.torn_buffers().is_empty());
    program.rewind(4).expect("rewinds");
    let err = program.fork(4).expect_err("torn");
    assert!(matches!(err, Error::TornFork { .. }), "{err:?}");
    assert_eq!(err.error_code(), ErrorCode::InvalidState);
    assert!(err.to_string().starts_with("cannot fork buffers 'k_cache_0', "), "{err}");
    assert!(err.to_string().contains("method 'decode', call 0"), "{err}");
    program.reset().expect("resets");
    program.fork(0).expect("forks after the reset");
}

#[test]
fn a_torn_fork_stays_torn_when_swapped_out_and_in() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut program = load(&export(dir.path(), "host"));
    prefix_run(&mut program);
    let mut fork = program.fork(PREFIX).expect("forks").caches;
    program.swap_caches(&mut fork).expect("swaps in the fork");
    let g = program.manifest().generate.clone().expect("a generator");
    program.write_input(&g.decode, &g.position_input, &100i64.to_le_bytes()).expect("writes");
    program.execute(&g.decode).expect_err("refused by the delegate");
    program.swap_caches(&mut fork).expect("swaps the original back");
    assert!(program.torn_buffers().is_empty(), "the torn caches left with the fork");
    assert_eq!(program.position(), Some(8));
    program.swap_caches(&mut fork).expect("swaps the fork in again");
    assert!(matches!(program.execute(&g.decode), Err(Error::TornBuffers { .. })));
}

#[test]
fn caches_forked_from_another_program_are_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = export(dir.path(), "host");
    let (mut a, b) = (load(&path), load(&path));
    let mut caches = b.fork(0).expect("forks").caches;
    let err = a.swap_caches(&mut caches).expect_err("another program's");
    assert_eq!(err.error_code(), ErrorCode::InvalidArgument);
    assert_eq!(err.to_string(), "the caches were forked from another program");
}

#[test]
fn a_plugin_that_does_not_state_it_serves_any_sequence_is_not_forked() {
    let dir = tempfile::tempdir().expect("temp dir");
    let registry =
        Registry::discover(Discovery::new()).with_embedded(unstated::delegate_root(), &HostConfig::default());
    let manifest = in_place_blob::program(dir.path(), "UnstatedBackend", &[("step", "cache")]);
    let program = Program::load(Manifest::load(&manifest).expect("manifest"), &registry, Mode::ZeroCopy)
        .expect("loads");
    let err = program.fork(0).expect_err("not forkable");
    assert_eq!(err.error_code(), ErrorCode::NotSupported);
    assert_eq!(
        err.to_string(),
        "the program cannot fork its caches: method 'step', call 0 (UnstatedBackend) is served by plugin \
         'unstated', whose instance says it keeps sequence state of its own (keeps_sequence_state), which a \
         forked sequence does not carry"
    );
    let err = program.new_caches().expect_err("not forkable either");
    assert!(matches!(err, Error::NotForkable { .. }), "{err}");
}

#[test]
#[ignore = "needs a GPU: cargo test -p host-runtime --test fork -- --ignored"]
fn pinned_caches_fork_as_host_caches_do() {
    branches_decode_as_fresh_runs("pinned");
}

#[test]
#[ignore = "needs a GPU: cargo test -p host-runtime --test fork -- --ignored"]
fn managed_caches_fork_as_host_caches_do() {
    branches_decode_as_fresh_runs("managed");
}
