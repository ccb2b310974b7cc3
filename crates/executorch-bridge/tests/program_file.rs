//! The program is read once and ExecuTorch loads exactly the bytes that were checked: a FIFO or a device in
//! the program's place is refused at once (it would block the read, or never end it), and a file swapped after
//! the checks cannot reach ExecuTorch, which never opens the path.

mod common;

use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use delegate_abi::DTypeCode;
use executorch_bridge::runner::{self, Input, Module};
use executorch_bridge::{BridgeError, PlannedMemory, ProgramFile};

/// How long et-run may take to refuse a file it must not read: far more than a refusal takes, far less than
/// a blocked open or an endless read would be allowed.
const LIMIT: Duration = Duration::from_secs(60);

/// `et-run PROGRAM`'s output, or a failure when it has not ended within [`LIMIT`] (then it is killed): it
/// is waited for on another thread, so nothing here sleeps.
fn et_run_within_limit(program: &std::path::Path) -> Output {
    let child = Command::new(env!("CARGO_BIN_EXE_et-run"))
        .arg(program)
        .args(["--plugin-dir".as_ref(), common::reference_only_dir().as_os_str()])
        .env_remove("DELEGATE_PLUGIN_PATH")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("et-run starts");
    let pid = child.id();
    let (done, ended) = mpsc::channel();
    std::thread::spawn(move || done.send(child.wait_with_output()));
    match ended.recv_timeout(LIMIT) {
        Ok(output) => output.expect("et-run's output"),
        Err(_) => {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            panic!("et-run {} did not end within {LIMIT:?}: it blocked or kept reading", program.display())
        }
    }
}

#[test]
fn et_run_refuses_a_fifo_and_a_device_in_place_of_the_program_at_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let fifo = dir.path().join("program.pte");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo runs");
    assert!(made.success());
    // A FIFO with no writer blocks a plain open until one comes; /dev/zero reads until memory runs out.
    for (path, what) in [(fifo.as_path(), "a FIFO"), ("/dev/zero".as_ref(), "a character device")] {
        let out = et_run_within_limit(path);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{}: {:?}: {stderr}", path.display(), out.status);
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
        assert_eq!(
            stderr.trim(),
            format!(
                "error: cannot read {}: not a regular file (it is {what}) [AccessFailed]",
                path.display()
            )
        );
    }
}

#[test]
fn a_program_file_is_refused_by_the_same_rule_in_the_api() {
    let err = ProgramFile::read("/dev/zero".as_ref()).expect_err("a device");
    assert!(matches!(&err, BridgeError::Io { path, .. } if path == "/dev/zero"), "{err:?}");
    assert_eq!(et_error::HasErrorCode::error_code(&err), et_error::ErrorCode::AccessFailed);
    let err = Module::open("/dev/zero".as_ref()).expect_err("a device");
    assert_eq!(err.to_string(), "cannot read /dev/zero: not a regular file (it is a character device)");
}

/// Feeds the prompt to `forward` one token per call and returns the greedy token after it (`t0`).
fn first_token(module: &mut Module) -> i64 {
    module.load_method("forward").expect("loads");
    let cfg = kv_example::Config::tiny();
    let mut logits = vec![0u8; 4 * cfg.vocab];
    for (position, token) in common::PROMPT.iter().enumerate() {
        let (token, position) = (token.to_le_bytes(), (position as i64).to_le_bytes());
        let inputs = [
            Input { data: &token, dtype: DTypeCode::I64, shape: &[1] },
            Input { data: &position, dtype: DTypeCode::I64, shape: &[1] },
        ];
        module.execute("forward", &inputs, &mut [&mut logits]).expect("runs");
    }
    let row: Vec<f32> =
        logits.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    kv_example::argmax(&row) as i64
}

#[test]
fn a_file_swapped_after_the_check_never_reaches_executorch() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cases = common::own_cases(dir.path());
    let case = cases.iter().find(|c| c.path.ends_with("buffers_1m_planned.pte")).expect("the planned 1m");
    let registry = common::dylib_registry();
    executorch_bridge::register(&registry).expect("registered");

    // Read once and checked, as et-run does.
    let file = ProgramFile::read(&case.path).expect("reads");
    runner::check_program(&case.path, file.bytes(), &registry.backends()).expect("passes the checks");
    // Then the path is swapped for a program the check refuses (its delegate would write a constant).
    let hostile = dir.path().join("hostile.pte");
    std::fs::write(&hostile, common::kv_output_in_constant_data(&kv_example::Config::tiny())).expect("write");
    std::fs::rename(&hostile, &case.path).expect("swap");
    let swapped = std::fs::read(&case.path).expect("the swapped file");
    assert!(matches!(
        runner::check_program(&case.path, &swapped, &registry.backends()),
        Err(BridgeError::UnplannedWrite { .. })
    ));

    // ExecuTorch loads the bytes that were checked, never the path: the program that passed runs.
    let mut module = Module::from_program(file, PlannedMemory::Host, &[]).expect("loads the checked bytes");
    assert_eq!(first_token(&mut module), case.tokens[0]);
}
