//! Isolated plugins (`--isolate`, or `"isolate": true` in a plugin's manifest): a plugin that aborts, hangs or
//! exits inside `execute` fails its call with one error line instead of taking the host down, and a
//! well-behaved one decodes to the same tokens with zero copies.

use std::path::{Path, PathBuf};
use std::process::Output;

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

fn run_program(program: &Path, plugins: &Path, flags: &[&str], misbehave: Option<&str>) -> Output {
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
    run(&mut cmd)
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
