//! Issue 44, items 2 to 5: the cache file as a careless user and a hostile file author meet it. A save that
//! fails part-way (a file-size limit, a process killed) leaves the previous file whole; a save never writes
//! through a symbolic link (its target is not created either) nor blocks on a FIFO; a restore never blocks on
//! a FIFO, never reads a device or a file larger than the program's caches can be, refuses a header past its
//! bound before parsing it, refuses a tensor that is no buffer of the program, and names a sequence axis that
//! differs. Hostile files are written here, byte by byte.

#![cfg(target_os = "linux")]

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};

use et_error::{ErrorCode, HasErrorCode};
use host_runtime::program::{Error, Program};
use rustix::fs::{Mode as FileMode, OFlags};
use safetensors::tensor::TensorView;
use safetensors::SafeTensors;
use tempfile::TempDir;

#[path = "support/cache_program.rs"]
mod cache_program;
use cache_program::{config, export, fresh_run, load};

/// A program run for 8 steps in `dir` (its caches hold positions 0..12), the tokens it was fed, and the path
/// of a cache file in `dir/caches` (a directory of its own, so a test can list what a save left there).
fn run_in(dir: &Path) -> (Program, Vec<i64>, PathBuf) {
    let mut program = load(&export(dir, &config()));
    let (fed, _) = fresh_run(&mut program);
    std::fs::create_dir(dir.join("caches")).expect("mkdir");
    (program, fed, dir.join("caches/cache.safetensors"))
}

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn mkfifo(path: &Path) {
    let made = Command::new("mkfifo").arg(path).status().expect("mkfifo runs");
    assert!(made.success(), "mkfifo {}", path.display());
}

/// Runs `act` while another thread keeps opening the FIFO at `fifo` with `flags` (non-blocking): an open of
/// the other end that would block `act` forever is freed by it, so `act` returns either way, and a test of
/// code that blocks fails instead of hanging.
fn with_fifo_partner<T>(fifo: &Path, flags: OFlags, act: impl FnOnce() -> T) -> T {
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                drop(rustix::fs::open(fifo, flags | OFlags::NONBLOCK | OFlags::CLOEXEC, FileMode::empty()));
                std::thread::yield_now();
            }
        });
        let result = act();
        done.store(true, Ordering::Relaxed);
        result
    })
}

/// `err`'s message, checked to be one line.
fn one_line(err: &Error) -> String {
    let message = err.to_string();
    assert!(!message.contains('\n'), "one line: {message}");
    message
}

// --- Item 2: a save that fails part-way leaves the previous file whole. ---

/// The environment variable that makes a test binary run the child half of
/// [`save_under_a_file_size_limit`]: the directory the parent prepared.
const CHILD_DIR: &str = "HOST_RUNTIME_CACHE_FILE_CHILD_DIR";

/// The parent saves position 4 to a cache file, then runs `test` again in a child process (this test binary,
/// through `sh`, with SIGXFSZ ignored when `ignore_signal`) that saves position 12 over it under a file-size
/// limit (RLIMIT_FSIZE) of the old file's size: the save's writes stop part-way. Returns, in the parent, the
/// directory, the old file's bytes, the child's output and the cache file's path.
fn save_under_a_file_size_limit(
    test: &str,
    ignore_signal: bool,
) -> Option<(TempDir, Vec<u8>, Output, PathBuf)> {
    if let Some(dir) = std::env::var_os(CHILD_DIR) {
        let dir = PathBuf::from(dir);
        let mut program = load(&dir.join("program.toml"));
        let (fed, _) = fresh_run(&mut program);
        let file = dir.join("caches/cache.safetensors");
        let limit = std::fs::metadata(&file).expect("the old file").len();
        let keep = rustix::process::getrlimit(rustix::process::Resource::Fsize);
        let limited = rustix::process::Rlimit { current: Some(limit), maximum: keep.maximum };
        rustix::process::setrlimit(rustix::process::Resource::Fsize, limited).expect("setrlimit");
        let err = program.save_cache(&file, 12, &fed).expect_err("the file-size limit stops the save");
        println!("the save failed: {err}");
        assert_eq!(err.error_code(), ErrorCode::AccessFailed, "{err}");
        assert!(one_line(&err).contains(": cannot be written: "), "{err}");
        return None;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let (program, fed, file) = run_in(dir.path());
    program.save_cache(&file, 4, &fed[..4]).expect("saves");
    let old = std::fs::read(&file).expect("read");
    let script = if ignore_signal { "trap '' XFSZ; exec \"$0\" \"$@\"" } else { "exec \"$0\" \"$@\"" };
    let output = Command::new("sh")
        .args(["-c", script])
        .arg(std::env::current_exe().expect("this test binary"))
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_DIR, dir.path())
        .output()
        .expect("the child runs");
    Some((dir, old, output, file))
}

/// The previous file at `file` is whole (`old`, byte for byte) and restores into a new program.
fn assert_restores_whole(file: &Path, old: &[u8]) {
    assert!(std::fs::read(file).expect("read") == old, "the previous file is whole");
    let mut program = load(&file.parent().and_then(Path::parent).expect("dir").join("program.toml"));
    assert_eq!(program.restore_cache(file).expect("the previous file restores").position, 4);
}

#[test]
fn a_save_that_fails_part_way_leaves_the_previous_file_whole_and_no_temporary_file() {
    let test = "a_save_that_fails_part_way_leaves_the_previous_file_whole_and_no_temporary_file";
    let Some((_dir, old, child, file)) = save_under_a_file_size_limit(test, true) else { return };
    let said =
        format!("{}{}", String::from_utf8_lossy(&child.stdout), String::from_utf8_lossy(&child.stderr));
    assert!(child.status.success(), "the child's save failed as it should: {said}");
    assert!(said.contains("File too large"), "{said}");
    assert_restores_whole(&file, &old);
    assert_eq!(names(file.parent().expect("dir")), ["cache.safetensors"], "no temporary file left");
}

#[test]
fn a_save_killed_part_way_leaves_the_previous_file_whole() {
    let test = "a_save_killed_part_way_leaves_the_previous_file_whole";
    let Some((_dir, old, child, file)) = save_under_a_file_size_limit(test, false) else { return };
    let said =
        format!("{}{}", String::from_utf8_lossy(&child.stdout), String::from_utf8_lossy(&child.stderr));
    let xfsz = rustix::process::Signal::XFSZ.as_raw();
    assert_eq!(child.status.signal(), Some(xfsz), "killed by SIGXFSZ mid-save: {said}");
    assert_restores_whole(&file, &old);
}

// --- Item 3: the save path is never followed, never blocks. ---

#[test]
fn a_symbolic_link_swapped_in_before_a_save_is_refused_and_its_target_untouched() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (mut program, fed, file) = run_in(dir.path());
    program.save_cache(&file, 4, &fed[..4]).expect("saves");
    program.restore_cache(&file).expect("restores");
    // Between the restore and the next save, the file becomes a link to another file.
    let precious = dir.path().join("precious");
    std::fs::write(&precious, b"not a cache").expect("write");
    std::fs::remove_file(&file).expect("rm");
    std::os::unix::fs::symlink(&precious, &file).expect("symlink");
    let err = program.save_cache(&file, 6, &fed[..6]).expect_err("a link is refused");
    assert_eq!(err.error_code(), ErrorCode::AccessFailed, "{err}");
    assert_eq!(
        one_line(&err),
        format!(
            "cache file {}: cannot be written: it is a symbolic link to {}, which a save does not follow; save \
             to the file it names, or remove the link",
            file.display(),
            precious.display()
        )
    );
    assert_eq!(std::fs::read(&precious).expect("read"), b"not a cache", "the link's target is untouched");
    assert_eq!(names(file.parent().expect("dir")), ["cache.safetensors"], "no temporary file left");
}

#[test]
fn a_dangling_symbolic_link_is_refused_and_its_target_not_created() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (program, fed, file) = run_in(dir.path());
    let target = dir.path().join("created-by-the-save");
    std::os::unix::fs::symlink(&target, &file).expect("symlink");
    let err = program.save_cache(&file, 4, &fed[..4]).expect_err("a dangling link is refused");
    assert!(one_line(&err).contains("cannot be written: it is a symbolic link to "), "{err}");
    assert!(!target.exists(), "the link's target was created");
}

#[test]
fn a_fifo_at_the_save_path_is_refused_without_blocking() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (program, fed, file) = run_in(dir.path());
    mkfifo(&file);
    let err = with_fifo_partner(&file, OFlags::RDONLY, || program.save_cache(&file, 4, &fed[..4]))
        .expect_err("a FIFO is refused");
    assert_eq!(err.error_code(), ErrorCode::AccessFailed, "{err}");
    assert_eq!(
        one_line(&err),
        format!("cache file {}: cannot be written: not a regular file (it is a FIFO)", file.display())
    );
}

// --- Item 4: a restore reads only a regular file, no larger than the program's caches can be. ---

#[test]
fn a_fifo_or_a_device_is_refused_at_restore_without_reading() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (mut program, _, file) = run_in(dir.path());
    mkfifo(&file);
    // The FIFO first: were it opened blocking, its partner would free the open, and the test would fail on
    // the message before /dev/zero is read without end.
    let err = with_fifo_partner(&file, OFlags::WRONLY, || program.restore_cache(&file)).expect_err("refused");
    assert_eq!(err.error_code(), ErrorCode::AccessFailed, "{err}");
    assert_eq!(
        one_line(&err),
        format!("cache file {}: cannot be read: not a regular file (it is a FIFO)", file.display())
    );
    let err = program.restore_cache(Path::new("/dev/zero")).expect_err("refused");
    assert_eq!(
        one_line(&err),
        "cache file /dev/zero: cannot be read: not a regular file (it is a character device)"
    );
}

/// The `N` of `... more than the N bytes ...` in `message`.
fn most(message: &str) -> u64 {
    let (_, rest) = message.split_once("more than the ").expect("names the bound");
    rest.split(' ').next().and_then(|n| n.parse().ok()).expect("a number")
}

#[test]
fn a_file_larger_than_the_program_allows_is_refused_unread_naming_both_sizes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (mut program, _, file) = run_in(dir.path());
    // A header as long as its length says, 98 MB of it (sparse: nothing is written but the length).
    let hostile = std::fs::File::create(&file).expect("create");
    std::io::Write::write_all(&mut &hostile, &98_000_000u64.to_le_bytes()).expect("write");
    hostile.set_len(8 + 98_000_000).expect("set_len");
    let err = program.restore_cache(&file).expect_err("too large");
    assert_eq!(err.error_code(), ErrorCode::InvalidArgument, "{err}");
    let message = one_line(&err);
    assert!(
        message.starts_with(&format!("cache file {}: is 98000008 bytes, more than the ", file.display())),
        "{message}"
    );
    // The bound is the program's: its caches' full sizes (a few KiB), its header's metadata, 16 tokens of 21
    // bytes and 64 KiB for keys a later host adds.
    let bound = most(&message);
    assert!((64 * 1024..200 * 1024).contains(&bound), "{bound}");
}

#[test]
fn the_largest_file_a_program_saves_restores() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (mut program, _, file) = run_in(dir.path());
    // Every position, each token as long as a token can be written.
    let tokens = vec![i64::MIN; 16];
    program.save_cache(&file, 16, &tokens).expect("saves");
    let saved = program.restore_cache(&file).expect("restores");
    assert_eq!((saved.position, saved.tokens), (16, tokens));
}

// --- Item 5: hostile headers and tensors. ---

#[test]
fn a_header_past_its_bound_is_refused_before_it_is_parsed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (mut program, _, file) = run_in(dir.path());
    // A 98 MB header length in a file of 1 KiB: refused on the length, before a byte of JSON is looked at.
    let mut bytes = 98_000_000u64.to_le_bytes().to_vec();
    bytes.resize(1024, b' ');
    std::fs::write(&file, &bytes).expect("write");
    let err = program.restore_cache(&file).expect_err("refused");
    assert_eq!(err.error_code(), ErrorCode::InvalidArgument, "{err}");
    let message = one_line(&err);
    let expected = format!(
        "cache file {}: is not a cache file of this program: its header is 98000000 bytes, more than the ",
        file.display()
    );
    assert!(message.starts_with(&expected), "{message}");
    assert!(most(&message) < 200 * 1024, "{message}");
}

/// A cache file saved from `program` at `position`, rewritten with `edit` applied to its metadata and
/// `extra` tensors added.
fn rewritten(
    program: &Program,
    file: &Path,
    position: u64,
    edit: impl FnOnce(&mut std::collections::HashMap<String, String>),
    extra: &[(&str, TensorView<'_>)],
) {
    program.save_cache(file, position, &[]).expect("saves");
    let bytes = std::fs::read(file).expect("read");
    let (_, header) = SafeTensors::read_metadata(&bytes).expect("safetensors");
    let mut metadata = header.metadata().clone().expect("metadata");
    edit(&mut metadata);
    let saved = SafeTensors::deserialize(&bytes).expect("safetensors");
    let mut tensors = saved.tensors();
    tensors.extend(extra.iter().map(|(name, view)| (name.to_string(), view.clone())));
    let bytes = safetensors::serialize(tensors, Some(metadata)).expect("serialises");
    std::fs::write(file, bytes).expect("write");
}

#[test]
fn a_tensor_that_is_no_buffer_of_the_program_is_refused_naming_it_and_nothing_is_written() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (mut program, _, file) = run_in(dir.path());
    let stray = [0u8; 4];
    let view = TensorView::new(safetensors::Dtype::F32, vec![1], &stray).expect("view");
    rewritten(&program, &file, 4, |_| {}, &[("stray", view)]);
    let before = program.buffer("k_cache_0").expect("buffer").to_vec();
    let err = program.restore_cache(&file).expect_err("an extra tensor");
    assert_eq!(err.error_code(), ErrorCode::InvalidArgument, "{err}");
    assert_eq!(
        one_line(&err),
        format!(
            "cache file {}: was saved from another program: it holds a tensor 'stray', which is no buffer of \
             the program",
            file.display()
        )
    );
    assert_eq!(program.buffer("k_cache_0").expect("buffer").as_ref(), before, "nothing was restored");
}

#[test]
fn a_sequence_axis_that_differs_is_named() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (mut program, _, file) = run_in(dir.path());
    // Saved at every position, the tensors have the buffers' full shapes; the metadata then says no buffer
    // has a sequence axis, as a program without [generate] max_positions would have saved it.
    let no_axis = |metadata: &mut std::collections::HashMap<String, String>| {
        let buffers = metadata.get_mut("buffers").expect("buffers");
        *buffers = buffers.replace("\"sequence_axis\":1", "\"sequence_axis\":null");
    };
    rewritten(&program, &file, 16, no_axis, &[]);
    let err = program.restore_cache(&file).expect_err("another axis");
    assert_eq!(
        one_line(&err),
        format!(
            "cache file {}: was saved from another program: buffer 'k_cache_0' (f32 [2, 16, 8]) has sequence axis \
             none in the file, 1 in the program",
            file.display()
        )
    );
}
