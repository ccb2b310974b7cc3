//! Issue 44, items 6, 10 and 11 (its second half): what a careless user or a hostile file author hands
//! `delegate-host run`: step counts past the caches or past any integer, a program that does not state how
//! many positions its caches hold, and FIFOs, devices and links where `--input` and `--output-dir` expect
//! regular files. Every command runs with a deadline: one that blocks fails its test instead of hanging it.

#[path = "../../host-runtime/tests/support/kv_pte.rs"]
mod kv_pte;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{one_line_error, stdout_json};

/// The binary without `DELEGATE_PLUGIN_PATH`, so the embedded reference delegate serves.
fn host() -> Command {
    let mut cmd = common::host();
    cmd.env_remove("DELEGATE_PLUGIN_PATH");
    cmd
}

/// Runs `cmd` to the end, killed after 60 s: a command that blocks (on a FIFO) fails the test, naming `what`.
fn run_bounded(cmd: &mut Command, what: &str) -> Output {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("delegate-host starts");
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            child.kill().expect("kill");
            panic!("{what}: delegate-host ran for more than 60 s (blocked)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

/// `run PROGRAM ARGS...`, bounded; its one error line.
fn run_error(program: &Path, args: &[&str]) -> String {
    let out = run_bounded(host().arg("run").arg(program).args(args), &format!("run {args:?}"));
    one_line_error(&out)
}

/// kv-example's tiny decoder (16 positions, a prompt of 4) for the reference backend, its manifest written
/// without `max_positions`: the directory (kept alive by the caller) and the manifest.
fn unstated_positions() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    kv_example::export::reference(&kv_example::Config::tiny(), dir.path()).expect("export");
    let program = dir.path().join("program.toml");
    let text = std::fs::read_to_string(&program).expect("manifest");
    let unstated: String =
        text.lines().filter(|l| !l.starts_with("max_positions")).map(|l| format!("{l}\n")).collect();
    assert_ne!(unstated, text, "the export states max_positions");
    std::fs::write(&program, unstated).expect("write");
    (dir, program)
}

/// [`unstated_positions`] with one more buffer, `[1, 8]`: the buffers then disagree on their second to last
/// dimension and do not tell how many positions the caches hold.
fn untold_positions() -> (tempfile::TempDir, PathBuf) {
    let (dir, program) = unstated_positions();
    let text = std::fs::read_to_string(&program).expect("manifest");
    std::fs::write(&program, format!("{text}\n[buffers.state]\ndtype = \"f32\"\nshape = [1, 8]\n"))
        .expect("write");
    (dir, program)
}

/// What a plain run of `program` with `--steps steps` gives, with `--prompt-cache` (once its file holds the
/// prompt, so the saved prefix is reused) and with `--branch`: three error lines.
fn three_ways(program: &Path, steps: &str) -> [String; 3] {
    let cache = program.with_file_name("cache.safetensors");
    if !cache.exists() {
        let first = run_bounded(
            host().arg("run").arg(program).args(["--steps", "1", "--prompt-cache"]).arg(&cache),
            "a first run with a prompt cache",
        );
        assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    }
    let cache = cache.to_str().expect("a UTF-8 path");
    [
        run_error(program, &["--steps", steps]),
        run_error(program, &["--steps", steps, "--prompt-cache", cache]),
        run_error(program, &["--steps", steps, "--branch", "1,7,9"]),
    ]
}

// ---------------------------------------------------------------------------------------------------------
// Item 6: steps past the caches, or past any integer.

#[test]
fn steps_past_the_caches_or_past_any_integer_are_one_line_before_anything_runs() {
    let (_dir, program) = unstated_positions();
    for steps in ["13", "1099511627776", "18446744073709551615"] {
        for line in three_ways(&program, steps) {
            assert_eq!(
                line,
                format!(
                    "error: {steps} decode steps do not fit: the caches hold 16 positions and the prompt takes 4, \
                     so at most 12 decode steps [InvalidArgument]"
                ),
                "--steps {steps}"
            );
        }
    }
}

#[test]
fn steps_are_never_reserved_ahead_when_the_caches_do_not_tell_their_length() {
    // Nothing tells the host how many positions there are: the plugin's own check stops the run where its
    // caches end, and nothing was allocated for the steps ahead (a reservation of 2^40 tokens aborted).
    let (_dir, program) = untold_positions();
    for line in three_ways(&program, "1099511627776") {
        assert!(line.contains("index 16") && line.ends_with("[InvalidArgument]"), "{line}");
    }
    // Past every position an i64 input holds: refused before anything runs.
    for line in three_ways(&program, "18446744073709551615") {
        assert!(
            line.contains(
                "18446744073709551615 decode steps from position 4 run past position 9223372036854775807"
            ) && line.ends_with("[InvalidArgument]"),
            "{line}"
        );
    }
}

// ---------------------------------------------------------------------------------------------------------
// Item 11 (second half): without `[generate] max_positions`, the caches' length.

#[test]
fn a_manifest_without_max_positions_holds_what_its_caches_hold() {
    let (_dir, program) = unstated_positions();
    // By default as many decode steps as the 16 rows of its caches hold after the prompt of 4 (not 15,
    // which ran into the plugin's own refusal at position 16).
    let out = run_bounded(host().arg("run").arg(&program).arg("--json"), "a default run");
    let report = stdout_json(&out);
    assert_eq!(report["tokens"].as_array().map(Vec::len), Some(13), "{report}");
    // A position past them is refused before anything runs, naming how many there are.
    let line = run_error(&program, &["--steps", "3", "--position", "14"]);
    assert!(line.contains("from position 14 do not fit: the caches hold 16 positions"), "{line}");
}

#[test]
fn a_pte_without_max_seq_len_is_held_to_its_caches_rows() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = common::without_compile_specs(kv_pte::spec(false), &dir.path().join("no_max_seq_len.pte"));
    let cfg = kv_pte::config();
    let most = cfg.max_len - cfg.prompt_len();
    let line = run_error(&path, &["--prompt", "1,7,3,12", "--steps", &(most + 1).to_string()]);
    assert_eq!(
        line,
        format!(
            "error: {} decode steps do not fit: the caches hold {} positions and the prompt takes 4, so at most \
             {most} decode steps [InvalidArgument]",
            most + 1,
            cfg.max_len
        )
    );
}

// ---------------------------------------------------------------------------------------------------------
// Item 10: FIFOs, devices and links in place of `--input` and `--output-dir` files.

/// Makes a FIFO at `path`.
#[cfg(unix)]
fn mkfifo(path: &Path) {
    use rustix::fs::{FileType, Mode, CWD};
    rustix::fs::mknodat(CWD, path, FileType::Fifo, Mode::RUSR | Mode::WUSR, 0).expect("mkfifo");
}

/// Whether `path` is (still) a FIFO.
#[cfg(unix)]
fn is_fifo(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_fifo())
}

#[cfg(unix)]
#[test]
fn an_input_that_is_a_fifo_or_a_device_is_refused_without_blocking() {
    let (dir, program) = unstated_positions();
    let fifo = dir.path().join("tokens.npy");
    mkfifo(&fifo);
    // Opening a FIFO with no writer blocks: the command must end by itself, naming it.
    let input = format!("tokens={}", fifo.display());
    let line = run_error(&program, &["--method", "decode", "--input", &input]);
    assert_eq!(line, format!("error: --input {input}: not a regular file (it is a FIFO) [AccessFailed]"));
    // A device would stream without end.
    let line = run_error(&program, &["--method", "decode", "--input", "tokens=/dev/zero"]);
    assert_eq!(
        line,
        "error: --input tokens=/dev/zero: not a regular file (it is a character device) [AccessFailed]"
    );
}

#[cfg(unix)]
#[test]
fn an_npy_header_larger_than_any_tensor_needs_is_refused_before_it_is_allocated() {
    let (dir, program) = unstated_positions();
    // A version 2 preamble stating a header of almost 4 GiB, and then little.
    let path = dir.path().join("huge_header.npy");
    let mut bytes = b"\x93NUMPY\x02\x00".to_vec();
    bytes.extend_from_slice(&0xffff_fff0u32.to_le_bytes());
    bytes.extend_from_slice(b"{'descr': '<i8', ");
    std::fs::write(&path, bytes).expect("write");
    // Within 256 MiB of address space, as a small container gives: allocating the header would abort.
    let input = format!("tokens={}", path.display());
    let script = "ulimit -v 262144 && exec \"$@\"";
    let mut cmd = Command::new("sh");
    cmd.args(["-c", script, "sh"]).arg(host().get_program()).arg("run").arg(&program);
    cmd.args(["--method", "decode", "--input", &input]).env_remove("DELEGATE_PLUGIN_PATH");
    let line = one_line_error(&run_bounded(&mut cmd, "a 4 GiB .npy header"));
    assert_eq!(
        line,
        format!(
            "error: --input {input}: its .npy header is 4294967280 bytes, more than the 65536 this host reads \
             [AccessFailed]"
        )
    );
}

#[cfg(unix)]
#[test]
fn an_output_dir_holding_a_fifo_or_a_link_is_refused_before_the_run_and_left_as_it_was() {
    let (dir, program) = unstated_positions();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).expect("mkdir");
    let out_arg = out.to_str().expect("a UTF-8 path");

    // A FIFO at an output's file name: writing it would block until a reader comes.
    let fifo = out.join("output.decode.logits.npy");
    mkfifo(&fifo);
    for args in
        [&["--method", "decode", "--output-dir", out_arg][..], &["--steps", "2", "--output-dir", out_arg]]
    {
        let line = run_error(&program, args);
        assert_eq!(
            line,
            format!(
                "error: cannot write {}: not a regular file (it is a FIFO) [AccessFailed]",
                fifo.display()
            ),
            "{args:?}"
        );
        assert!(is_fifo(&fifo), "the FIFO is left as it was");
    }
    std::fs::remove_file(&fifo).expect("remove");

    // A symbolic link at a buffer's file name, leading to another file: never written through.
    let victim = dir.path().join("victim");
    std::fs::write(&victim, b"keep me").expect("write");
    let link = out.join("buffer.k_cache_0.npy");
    std::os::unix::fs::symlink(&victim, &link).expect("symlink");
    let line = run_error(&program, &["--steps", "2", "--output-dir", out_arg]);
    assert_eq!(
        line,
        format!(
            "error: cannot write {}: not a regular file (it is a symbolic link) [AccessFailed]",
            link.display()
        )
    );
    assert_eq!(std::fs::read(&victim).expect("read"), b"keep me");
    assert!(std::fs::symlink_metadata(&link).expect("the link").file_type().is_symlink());

    // Nothing in the way: every file is written, and an existing regular file is replaced whole.
    std::fs::remove_file(&link).expect("remove");
    std::fs::write(out.join("output.prefill.logits.npy"), b"old").expect("write");
    let ran =
        run_bounded(host().arg("run").arg(&program).args(["--steps", "2", "--output-dir", out_arg]), "run");
    assert!(ran.status.success(), "{}", String::from_utf8_lossy(&ran.stderr));
    let logits = std::fs::read(out.join("output.prefill.logits.npy")).expect("written");
    assert!(logits.starts_with(b"\x93NUMPY") && logits.len() > 4 * 64 * 4, "{} bytes", logits.len());
    let names: Vec<String> = std::fs::read_dir(&out)
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 6, "4 outputs and 2 buffers, no temporary file left: {names:?}");
}
