//! Isolated plugins (`--isolate`, or `"isolate": true` in a plugin's manifest): a plugin that aborts, hangs or
//! exits inside `execute` fails its call with one error line instead of taking the host down, and a
//! well-behaved one decodes to the same tokens with zero copies.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::{dylib, host, one_line_error, run, stdout_json, test_plugin_dir};

/// A plugin directory holding the built library `stem` and the manifest `delegate-host` writes for it.
fn plugin_dir(stem: &str, isolate: bool) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    let library = dir.path().join(dylib(stem));
    std::fs::copy(test_plugin_dir().join(dylib(stem)), &library).expect("copy the plugin");
    let mut cmd = host();
    cmd.arg("plugin-manifest").arg(&library);
    if isolate {
        cmd.arg("--isolate");
    }
    let out = run(&mut cmd);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    dir
}

/// The tiny example program (ReferenceBackend), in a temp dir.
fn example() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    kv_example::export::reference(&kv_example::Config::tiny(), dir.path()).expect("export");
    let program = dir.path().join("program.toml");
    (dir, program)
}

/// How long a run of the tiny example may take, whatever its plugin does: every call has a deadline of a few
/// seconds at most, so a host still running after this has ignored one.
const RUN_LIMIT: Duration = Duration::from_secs(60);

/// Runs `cmd` to the end, or kills it after `limit` and fails the test: a host that ignored its worker's
/// deadline makes the test fail, not hang.
fn run_within(cmd: &mut Command, limit: Duration) -> Output {
    run_within_to(cmd, Stdio::piped(), limit)
}

/// [`run_within`], its standard output going to `stdout` (read back when piped).
fn run_within_to(cmd: &mut Command, stdout: Stdio, limit: Duration) -> Output {
    let mut child = cmd.stdout(stdout).stderr(Stdio::piped()).spawn().expect("delegate-host starts");
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let give_up = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for delegate-host") {
            break status;
        }
        if Instant::now() >= give_up {
            let _ = child.kill();
            let _ = child.wait();
            panic!("delegate-host was still running after {limit:?} and was killed: a deadline was ignored");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let joined = |reader: std::thread::JoinHandle<Vec<u8>>| reader.join().expect("a pipe reader");
    Output { status, stdout: joined(stdout), stderr: joined(stderr) }
}

fn run_program(program: &Path, plugins: &Path, flags: &[&str], misbehave: Option<&str>) -> Output {
    run_within(&mut program_command(program, plugins, flags, misbehave), RUN_LIMIT)
}

fn program_command(program: &Path, plugins: &Path, flags: &[&str], misbehave: Option<&str>) -> Command {
    let mut cmd = host();
    cmd.arg("run")
        .arg(program)
        .arg("--plugin-dir")
        .arg(plugins)
        .args(flags)
        .env_remove("DELEGATE_PLUGIN_PATH");
    match misbehave {
        Some(value) => cmd.env("MISBEHAVE", value),
        None => cmd.env_remove("MISBEHAVE"),
    };
    cmd
}

fn tokens(json: &Value) -> Value {
    json["tokens"].clone()
}

#[test]
fn an_isolated_plugin_decodes_to_the_same_tokens_with_zero_copies() {
    let plugins = plugin_dir("reference_delegate_dylib", false);
    let (_dir, program) = example();
    let here = stdout_json(&run_program(&program, plugins.path(), &["--json"], None));
    let isolated = stdout_json(&run_program(&program, plugins.path(), &["--json", "--isolate"], None));
    assert!(tokens(&here).as_array().is_some_and(|t| t.len() > 2), "{here}");
    assert_eq!(tokens(&isolated), tokens(&here));
    assert_eq!(
        isolated["stats"]["mean_decode_bytes_copied_total"], 0,
        "the worker binds the caches in place"
    );
    let copy_back = stdout_json(&run_program(
        &program,
        plugins.path(),
        &["--json", "--isolate", "--mode", "copy-back"],
        None,
    ));
    assert_eq!(tokens(&copy_back), tokens(&here));
}

#[test]
fn a_plugin_that_aborts_hangs_or_exits_fails_its_call_in_one_line_when_isolated() {
    let plugins = plugin_dir("misbehave_delegate", false);
    let (_dir, program) = example();
    let flags = ["--isolate", "--deadline-ms", "300"];
    for (misbehave, says) in [
        ("abort", "the worker died during execute: killed by signal 6 (SIGABRT)"),
        ("exit", "the worker died during execute: exited with status 3"),
        ("hang", "the worker did not answer execute within its 300 ms deadline and was killed"),
    ] {
        let line = one_line_error(&run_program(&program, plugins.path(), &flags, Some(misbehave)));
        assert!(line.contains("plugin 'misbehave-delegate' (isolated"), "{misbehave}: {line}");
        assert!(line.contains(says), "{misbehave}: {line}");
        assert!(line.ends_with("[Internal]"), "{misbehave}: {line}");
    }
    // The same plugin in the host's own process takes the host with it: what isolation is for.
    let out = run_program(&program, plugins.path(), &[], Some("abort"));
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&out.status), Some(6), "{out:?}");
}

#[test]
fn a_manifest_that_asks_for_isolation_isolates_its_plugin_without_the_flag() {
    let plugins = plugin_dir("misbehave_delegate", true);
    let manifest: Value = serde_json::from_slice(
        &std::fs::read(plugins.path().join("libmisbehave_delegate.plugin.json")).expect("manifest"),
    )
    .expect("json");
    assert_eq!(manifest["isolate"], true);
    let (_dir, program) = example();
    let line = one_line_error(&run_program(&program, plugins.path(), &[], Some("abort")));
    assert!(line.contains("killed by signal 6 (SIGABRT)"), "{line}");
    // Behaving, it runs to the same tokens as the embedded reference delegate.
    let ok = stdout_json(&run_program(&program, plugins.path(), &["--json"], None));
    let embedded =
        stdout_json(&run(host().arg("run").arg(&program).arg("--json").env_remove("DELEGATE_PLUGIN_PATH")));
    assert_eq!(tokens(&ok), tokens(&embedded));
}

#[test]
fn the_worker_refuses_to_run_without_a_host() {
    let line = one_line_error(&run(host().arg("worker")));
    assert!(line.contains("descriptor 3 is not a socket"), "{line}");
}

/// The processes whose parent is `parent`, from `/proc`.
fn children_of(parent: u32) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        // `pid (comm) state ppid ...`: the command name may hold spaces and parentheses, the rest does not.
        let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        if after.split_whitespace().nth(1).and_then(|p| p.parse::<u32>().ok()) == Some(parent) {
            found.push(pid);
        }
    }
    found
}

/// Whether `pid` still runs (a zombie has ended: it waits only to be reaped by whoever adopted it).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with('Z')))
        .is_some_and(|zombie| !zombie)
}

#[test]
fn a_worker_stuck_in_its_plugin_ends_when_its_host_is_killed() {
    let plugins = plugin_dir("misbehave_delegate", false);
    let (_dir, program) = example();
    let mut host = host()
        .arg("run")
        .arg(&program)
        .arg("--plugin-dir")
        .arg(plugins.path())
        .args(["--isolate", "--deadline-ms", "600000"])
        .env_remove("DELEGATE_PLUGIN_PATH")
        .env("MISBEHAVE", "hang")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("delegate-host starts");
    // One worker per isolated call: the prefill's hangs in the plugin, the decode's waits for its first request.
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let workers = loop {
        let workers = children_of(host.id());
        if workers.len() == 2 {
            break workers;
        }
        assert!(std::time::Instant::now() < give_up, "the host started {} workers, not 2", workers.len());
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    // Into the prefill's first `execute`, where the plugin hangs (the deadline is ten minutes away).
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert!(workers.iter().all(|&w| running(w)), "a worker ended before its host did");
    host.kill().expect("kill the host");
    host.wait().expect("reap the host");
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(10);
    for worker in workers {
        while running(worker) {
            if std::time::Instant::now() >= give_up {
                // Not left behind by a failing test.
                let _ = std::process::Command::new("kill").args(["-9", &worker.to_string()]).status();
                panic!("worker {worker} outlived its killed host by 10 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

/// Runs the tiny example through the misbehave plugin, isolated, with `MISBEHAVE=misbehave`; returns its one
/// error line.
fn hostile_run(misbehave: &str, deadline_ms: &str) -> String {
    let plugins = plugin_dir("misbehave_delegate", false);
    let (_dir, program) = example();
    let flags = ["--isolate", "--deadline-ms", deadline_ms];
    one_line_error(&run_program(&program, plugins.path(), &flags, Some(misbehave)))
}

#[test]
fn a_worker_that_trickles_its_answer_is_killed_at_the_deadline_of_the_whole_call() {
    // It announces a 100 000-byte answer and sends a byte every 100 ms: each read is quick, the call is not.
    let start = Instant::now();
    let line = hostile_run("trickle", "2000");
    assert!(
        line.contains("the worker did not answer execute within its 2 s deadline and was killed"),
        "{line}"
    );
    assert!(line.ends_with("[Internal]"), "{line}");
    // Init (the worker starting) is not the call; the call itself ends at its deadline.
    assert!(start.elapsed() < Duration::from_secs(30), "the host took {:?}", start.elapsed());
}

#[test]
fn an_error_message_longer_than_the_socket_buffer_arrives_and_one_past_the_cap_is_cut_visibly() {
    // 300 000 bytes: more than a socket buffer holds, less than the cap.
    let line = hostile_run("long-error:300000", "5000");
    assert!(!line.contains("deadline"), "{}", &line[..line.len().min(300)]);
    let message = "x".repeat(300_000);
    assert!(line.contains(&format!(": {message} [Internal]")), "{}", &line[..line.len().min(300)]);
    // 3 MB: cut at the cap (512 KiB), saying how much was left out.
    let line = hostile_run("long-error:3000000", "5000");
    let cut = 3_000_000 - 512 * 1024;
    assert!(
        line.contains(&format!("xxx... [truncated {cut} bytes]")),
        "{}",
        &line[line.len().saturating_sub(300)..]
    );
    assert!(line.len() < 600_000, "{} bytes", line.len());
}

#[test]
fn a_worker_cannot_shrink_the_memory_files_it_shares_with_its_host() {
    let line = hostile_run("shrink", "5000");
    // Sealed: the doorbell, the blob and every buffer refuse; the host carries on and reports the call's error.
    for file in ["kv-delegate-bell", "kv-delegate-blob", "kv-delegate-buffer"] {
        assert!(line.contains(&format!("{file}: Operation not permitted")), "{file}: {line}");
    }
    assert!(!line.contains("shrunk"), "{line}");
    assert!(line.ends_with("[Internal]"), "{line}");
}

#[test]
fn a_worker_sees_only_the_descriptors_meant_for_it() {
    let plugins = plugin_dir("misbehave_delegate", false);
    let (_dir, program) = example();
    let out_dir = tempfile::tempdir().expect("temp dir");
    let stdout = out_dir.path().join("stdout");
    // The host starts with descriptor 3 taken, so that a private descriptor it makes lands on 4 or later,
    // where the worker's socket (3) does not cover it.
    let run = program_command(&program, plugins.path(), &["--isolate", "--json"], Some("fds"));
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg("exec \"$0\" \"$@\" 3</dev/null")
        .arg(run.get_program())
        .args(run.get_args())
        .env_remove("DELEGATE_PLUGIN_PATH")
        .env("MISBEHAVE", "fds");
    let file = std::fs::File::create(&stdout).expect("stdout file");
    let out = run_within_to(&mut cmd, file.into(), RUN_LIMIT);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let listed = stderr.split_once("fds: ").map(|(_, rest)| rest).expect(&stderr);
    let listed = listed.rsplit_once(" [").map_or(listed, |(list, _)| list);
    let worker: Vec<(u32, &str)> = listed
        .split(", ")
        .map(|entry| {
            let (fd, target) = entry.split_once(" -> ").expect(entry);
            (fd.parse().expect(entry), target)
        })
        .collect();
    let stdio: Vec<&str> = worker.iter().filter(|(fd, _)| *fd <= 3).map(|(_, t)| *t).collect();
    let ours = inherited_by_children();
    for &(fd, target) in &worker {
        assert!(!target.contains(stdout.to_str().expect("utf-8")), "the host's stdout leaked: {listed}");
        let meant = match fd {
            3 => target.starts_with("socket:"),
            0..=2 => true,
            // What it was sent (the host's memory files); what it opened or duplicated itself (the plugin
            // library, this listing's directory, its own standard streams and socket); what this test process
            // passes on to every child (cargo's jobserver), none of the host's making.
            _ => {
                target.starts_with("/memfd:kv-delegate-")
                    || target.starts_with("/proc/")
                    || Path::new(target).starts_with(plugins.path())
                    || stdio.contains(&target)
                    || ours.iter().any(|t| t == target)
            }
        };
        assert!(meant, "the worker holds descriptor {fd} -> {target}, not meant for it: {listed}");
    }
}

/// What this process's descriptors without close-on-exec point at: every child it starts inherits them.
fn inherited_by_children() -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd").flatten() {
        let name = entry.file_name();
        let info = std::fs::read_to_string(Path::new("/proc/self/fdinfo").join(&name)).unwrap_or_default();
        let flags = info.lines().find_map(|l| l.strip_prefix("flags:")).map(str::trim).unwrap_or("0");
        let cloexec = u32::from_str_radix(flags, 8).is_ok_and(|f| f & 0o2_000_000 != 0);
        if let (false, Ok(target)) = (cloexec, std::fs::read_link(entry.path())) {
            found.push(target.to_string_lossy().into_owned());
        }
    }
    found
}

#[test]
fn a_worker_that_answers_twice_fails_its_call_and_is_stopped() {
    // A success answer on the socket, then the call's failure on the doorbell.
    let line = hostile_run("answer-twice", "5000");
    assert!(
        line.contains("the worker answered execute with success after its doorbell said it failed"),
        "{line}"
    );
    assert!(line.ends_with("[Internal]"), "{line}");
}

#[test]
fn an_error_a_worker_codes_ok_is_internal() {
    let line = hostile_run("code-ok", "5000");
    assert!(line.ends_with("[Internal]"), "{line}");
}

#[test]
fn absurd_statistics_from_a_worker_do_not_overflow_the_host() {
    let plugins = plugin_dir("misbehave_delegate", false);
    let (_dir, program) = example();
    let here = stdout_json(&run_program(&program, plugins.path(), &["--json"], None));
    let absurd = stdout_json(&run_program(&program, plugins.path(), &["--json", "--isolate"], Some("stats")));
    assert_eq!(tokens(&absurd), tokens(&here));
}
