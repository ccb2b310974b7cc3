//! Programs run inside ExecuTorch 1.5.1's own runtime with the reference plugin loaded from disk as a dylib:
//! tokens and logits as expected, the copies each decode step makes, and the refusals.

mod common;

use std::process::Command;

use common::Case;
use et_error::{ErrorCode, HasErrorCode};
use executorch_bridge::runner::{self, Protocol};
use executorch_bridge::BridgeError;

fn protocol() -> Protocol {
    Protocol { prompt: common::PROMPT.to_vec(), steps: common::STEPS, require_zero_copy: false }
}

fn check_case(case: &Case) {
    let registry = common::dylib_registry();
    let name = case.path.display().to_string();
    let report = runner::run(&case.path, &registry, &protocol()).unwrap_or_else(|e| panic!("{name}: {e}"));
    let (mut got, mut want) = (report.methods.clone(), case.methods.clone());
    got.sort();
    want.sort();
    assert_eq!(got, want, "{name}: methods");
    assert_eq!(report.tokens, case.tokens, "{name}: tokens");
    assert_eq!(report.logits.len(), case.logits.len(), "{name}: logits rows");
    for (step, (got, want)) in report.logits.iter().zip(&case.logits).enumerate() {
        assert_eq!(got.len(), want.len(), "{name}: row {step} width");
        let worst = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(worst <= case.tolerance, "{name}: row {step} differs by {worst} > {}", case.tolerance);
    }
    assert_eq!(report.decode.len(), common::STEPS);
    for (step, stats) in report.decode.iter().enumerate() {
        assert!(stats.executes >= 1, "{name}: step {step} reached the plugin");
        let want = if case.zero_copy { 0 } else { case.cache_bytes };
        assert_eq!(stats.write_back_bytes, want, "{name}: write-back bytes of decode step {step}");
        // Without the planning pass the plugin fills each separate KV output (then `copy_` writes it back).
        assert_eq!(stats.reflect_bytes, want, "{name}: bytes the plugin reflected at decode step {step}");
    }
}

#[test]
fn our_programs_run_in_executorch_through_the_dylib() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cases = common::own_cases(dir.path());
    assert_eq!(cases.len(), 4);
    for case in &cases {
        check_case(case);
    }
}

#[test]
fn the_exported_fixtures_run_in_executorch_through_the_dylib() {
    // The fixtures are committed (the exporter writes them): missing fixtures fail, they are not skipped.
    let cases = common::fixture_cases().expect("fixtures/executorch/expected.json is committed");
    assert_eq!(cases.len(), 5, "every exported variant: buffers 1m/2m, planned or not, and owned");
    for case in &cases {
        check_case(case);
    }
}

#[test]
fn without_the_planning_pass_each_decode_step_copies_the_whole_cache_and_with_it_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let registry = common::dylib_registry();
    let cfg = kv_example::Config::tiny();
    let mut copied = Vec::new();
    for planned in [false, true] {
        let path = dir.path().join(format!("p{planned}.pte"));
        std::fs::write(&path, common::program(&cfg, 2, planned, common::BACKEND)).expect("write");
        let report = runner::run(&path, &registry, &protocol()).expect("runs");
        copied.push(report.decode.iter().map(|s| (s.write_back_bytes, s.reflect_bytes)).collect::<Vec<_>>());
    }
    let cache = (2 * cfg.cache_len() * 4) as u64;
    // Copy-back: ExecuTorch's copy_ writes each separate KV output back, and the plugin filled those outputs.
    assert!(copied[0].iter().all(|&c| c == (cache, cache)), "{:?}", copied[0]);
    // Planned: one pointer for the buffer and its KV output; nothing moves.
    assert!(copied[1].iter().all(|&c| c == (0, 0)), "{:?}", copied[1]);
}

#[test]
fn an_unserved_backend_is_named_before_anything_runs() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("other.pte");
    let cfg = kv_example::Config::tiny();
    std::fs::write(&path, common::program(&cfg, 1, true, "SomeoneElsesBackend")).expect("write");
    let err = runner::run(&path, &common::dylib_registry(), &protocol()).expect_err("refused");
    assert!(
        matches!(&err, BridgeError::UnservedBackend { backend, .. } if backend == "SomeoneElsesBackend"),
        "{err}"
    );
    assert_eq!(err.error_code(), ErrorCode::NotFound);

    let out = et_run(&[path.as_os_str()]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("error: ") && stderr.contains("backend 'SomeoneElsesBackend'"), "{stderr}");
}

#[test]
fn truncated_and_corrupted_files_are_one_error_line() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cfg = kv_example::Config::tiny();
    let good = common::program(&cfg, 1, true, common::BACKEND);
    let truncated = dir.path().join("truncated.pte");
    std::fs::write(&truncated, &good[..good.len() - 100]).expect("write");
    let mut bad = good.clone();
    bad[4..8].copy_from_slice(b"XX12");
    let corrupted = dir.path().join("corrupted.pte");
    std::fs::write(&corrupted, &bad).expect("write");
    let mut flipped = good.clone();
    for b in &mut flipped[40..200] {
        *b ^= 0xa5;
    }
    let scrambled = dir.path().join("scrambled.pte");
    std::fs::write(&scrambled, &flipped).expect("write");
    // And an exported program cut anywhere past its header.
    let exported = std::fs::read(common::workspace_root().join("fixtures/executorch/buffers_2m_planned.pte"))
        .expect("the committed fixture");
    let cut = dir.path().join("cut.pte");
    std::fs::write(&cut, &exported[..exported.len() * 2 / 3]).expect("write");
    for path in [&truncated, &corrupted, &scrambled, &cut] {
        let out =
            et_run(&[path.as_os_str(), "--plugin-dir".as_ref(), common::reference_only_dir().as_os_str()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{}: {stderr}", path.display());
        assert_eq!(stderr.trim().lines().count(), 1, "{}: {stderr}", path.display());
        assert!(stderr.starts_with("error: "), "{stderr}");
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn a_plugin_error_keeps_its_executorch_code_through_the_runtime() {
    // pte-format's hand-made decoder carries a blob whose payload is not a reference graph: the plugin's
    // `init` refuses it with InvalidProgram (0x23), ExecuTorch's Method fails with that code.
    let path = common::workspace_root().join("crates/pte-format/tests/fixtures/et_1_5_1_kv_decoder.pte");
    let err = runner::run(&path, &common::dylib_registry(), &protocol()).expect_err("init fails");
    match &err {
        BridgeError::Runtime { code, detail, .. } => {
            assert_eq!(*code, ErrorCode::InvalidProgram, "{err}");
            let detail = detail.as_deref().unwrap_or_default();
            assert!(detail.contains("ReferenceBackend") && detail.contains("init failed"), "{detail}");
        }
        other => panic!("expected a runtime error, got {other}"),
    }
}

#[test]
fn et_run_prints_the_tokens_and_the_copies_as_json() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cases = common::own_cases(dir.path());
    let case = cases.iter().find(|c| c.path.ends_with("buffers_2m_planned.pte")).expect("the planned 2m");
    let out = et_run(&[
        case.path.as_os_str(),
        "--plugin-dir".as_ref(),
        common::reference_only_dir().as_os_str(),
        "--probe".as_ref(),
        "--prompt".as_ref(),
        "1,7,3,12".as_ref(),
        "--steps".as_ref(),
        "12".as_ref(),
        "--json".as_ref(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(json["tokens"], serde_json::json!(case.tokens));
    let dylib = common::reference_only_dir().join(common::dylib_name("reference_delegate_dylib"));
    assert_eq!(json["served_by"][common::BACKEND], serde_json::json!(dylib.display().to_string()));
    assert_eq!(json["write_back_bytes_per_decode_step"], serde_json::json!(vec![0; common::STEPS]));
    assert_eq!(json["logits"].as_array().map(Vec::len), Some(common::STEPS + 1));
}

fn et_run(args: &[&std::ffi::OsStr]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_et-run"))
        .args(args)
        .env_remove("DELEGATE_PLUGIN_PATH")
        .output()
        .expect("et-run runs")
}

#[test]
fn et_run_finds_the_dylib_by_its_manifest_and_passes_over_a_plugin_that_no_longer_matches_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let plugins = dir.path().join("plugins");
    std::fs::create_dir(&plugins).expect("mkdir");
    let name = common::dylib_name("reference_delegate_dylib");
    let library = plugins.join(&name);
    std::fs::copy(common::plugin_dir().join(&name), &library).expect("copy the dylib");
    let manifest = common::write_manifest(&library, false);
    let manifest_path = host_runtime::plugin_manifest::PluginManifest::path_for(&library);

    let cases = common::own_cases(dir.path());
    let program = &cases[0].path;
    let args = [program.as_os_str(), "--plugin-dir".as_ref(), plugins.as_os_str(), "--json".as_ref()];
    let out = et_run(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(json["served_by"][common::BACKEND], serde_json::json!(library.display().to_string()));
    assert_eq!(json["tokens"], serde_json::json!(cases[0].tokens));

    // The manifest no longer matches the library: the library is passed over, and the embedded reference
    // plugin, the next candidate, serves.
    let tampered = manifest.to_json().replace(&manifest.sha256, &"0".repeat(manifest.sha256.len()));
    std::fs::write(&manifest_path, tampered).expect("write the manifest");
    let out = et_run(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(json["served_by"][common::BACKEND], serde_json::json!("(embedded)"));
    assert_eq!(json["tokens"], serde_json::json!(cases[0].tokens));
    // With no other candidate, the backend the program calls is named with the library's reason, one error.
    let registry =
        host_runtime::plugins::Registry::discover(host_runtime::plugins::Discovery::new().dirs([&plugins]));
    let err = runner::run(program, &registry, &protocol()).expect_err("no usable plugin");
    let line = err.to_string();
    assert!(
        matches!(&err, BridgeError::PluginUnavailable { backend, .. } if backend == common::BACKEND),
        "{line}"
    );
    assert!(line.contains("sha256") && line.contains("delegate-host plugin-manifest"), "{line}");
}

/// Runs et-run with `stdout`, its stderr captured, `PLUGIN_PATH` unset.
fn et_run_to(args: &[&std::ffi::OsStr], stdout: std::process::Stdio) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_et-run"))
        .args(args)
        .env_remove("DELEGATE_PLUGIN_PATH")
        .stdout(stdout)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("et-run starts")
}

#[test]
fn et_run_ends_quietly_when_its_reader_goes_away_and_a_full_stdout_is_one_error_line() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cases = common::own_cases(dir.path());
    let program = cases[0].path.as_os_str();
    let plugins = common::reference_only_dir().as_os_str();
    for json in [false, true] {
        let mut args = vec![program, "--plugin-dir".as_ref(), plugins];
        if json {
            args.push("--json".as_ref());
        }
        // `et-run ... | head -0`: the reader is gone before et-run writes (as delegate-host's own test).
        let mut child = et_run_to(&args, std::process::Stdio::piped());
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("ends");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "json {json}: {:?}: {stderr}", out.status);
        assert!(out.stderr.is_empty(), "json {json}: no panic, no line: {stderr}");

        if let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") {
            let out = et_run_to(&args, full.into()).wait_with_output().expect("ends");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{stderr}");
            assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
            assert!(
                stderr.starts_with("error: cannot write to stdout")
                    && stderr.trim_end().ends_with("[AccessFailed]"),
                "{stderr}"
            );
        }
    }
}

#[test]
fn module_execute_refuses_an_input_its_slice_does_not_hold() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cases = common::own_cases(dir.path());
    let case = cases.iter().find(|c| c.path.ends_with("buffers_1m_planned.pte")).expect("the planned 1m");
    executorch_bridge::register(&common::dylib_registry()).expect("registered");
    let mut module = runner::Module::open(&case.path).expect("opens");
    module.load_method("forward").expect("loads");
    let mut logits = vec![0u8; 1 << 16];
    let pos = 0i64.to_le_bytes();
    let pos_input = runner::Input { data: &pos, dtype: delegate_abi::DTypeCode::I64, shape: &[1] };
    // 8 bytes declared [4] i64: the tensor would read 32.
    let short = [0u8; 8];
    let tokens = runner::Input { data: &short, dtype: delegate_abi::DTypeCode::I64, shape: &[4] };
    let err = module.execute("forward", &[tokens, pos_input], &mut [&mut logits]).expect_err("refused");
    match &err {
        BridgeError::Input { index, dtype, shape, problem } => {
            assert_eq!((*index, *dtype, shape.as_slice()), (0, delegate_abi::DTypeCode::I64, &[4i64][..]));
            assert_eq!(*problem, executorch_bridge::InputProblem::Length { expected: Some(32), actual: 8 });
        }
        other => panic!("expected an input error, got {other}"),
    }
    assert_eq!(err.error_code(), ErrorCode::InvalidArgument);
    assert_eq!(err.to_string(), "input 0 (i64 [4]): its shape x dtype is 32 bytes, but the slice holds 8");
    // A size past ExecuTorch's int32 sizes is refused, not truncated (2^32 + 1 would read as 1).
    let wide = runner::Input { data: &short, dtype: delegate_abi::DTypeCode::I64, shape: &[(1 << 32) + 1] };
    let err = module.execute("forward", &[wide, pos_input], &mut [&mut logits]).expect_err("refused");
    assert!(
        matches!(
            &err,
            BridgeError::Input {
                index: 0,
                problem: executorch_bridge::InputProblem::Size { dim: 0, .. },
                ..
            }
        ),
        "{err}"
    );
    // The same module still runs a right input.
    let one = 1i64.to_le_bytes();
    let tokens = runner::Input { data: &one, dtype: delegate_abi::DTypeCode::I64, shape: &[1] };
    module.execute("forward", &[tokens, pos_input], &mut [&mut logits]).expect("runs");
}

#[test]
fn a_plugin_that_must_run_isolated_is_never_loaded_and_is_refused_naming_the_plugin_the_backend_and_the_fix()
{
    use host_runtime::isolate::Isolation;
    use host_runtime::plugins::{Discovery, Registry};

    let dir = tempfile::tempdir().expect("temp dir");
    let cases = common::own_cases(dir.path());
    let program = &cases[0].path;
    // The reference dylib, its manifest asking for isolation (`delegate-host plugin-manifest --isolate LIB`).
    let asks = dir.path().join("asks");
    std::fs::create_dir(&asks).expect("mkdir");
    let library = common::link_reference_dylib(&asks);
    let manifest = common::write_manifest(&library, true);
    let check = |err: &BridgeError, library: &std::path::Path| match err {
        BridgeError::Isolated { backend, plugin, library: at, program: p } => {
            assert_eq!((backend.as_str(), plugin.as_str()), (common::BACKEND, manifest.name.as_str()));
            assert_eq!(at, &library.display().to_string());
            assert_eq!(p.as_deref(), Some(program.display().to_string().as_str()));
            let line = err.to_string();
            assert!(
                line.contains(&format!("run the program with `delegate-host run {}`", program.display())),
                "{line}"
            );
            assert_eq!(err.error_code(), ErrorCode::NotSupported);
        }
        other => panic!("expected the isolation refusal, got {other}"),
    };

    // The library API, a registry without isolation settings: the plugin is refused, never loaded.
    let registry = Registry::discover(Discovery::new().dirs([&asks]));
    let err = runner::run(program, &registry, &protocol()).expect_err("refused");
    check(&err, &library);
    assert!(registry.candidates().iter().all(|c| c.plugin().is_none()), "nothing was loaded");
    // A registry that runs workers: the same (the plugin is served isolated, so the bridge refuses it).
    let isolating = Registry::discover(
        Discovery::new().dirs([&asks]).isolation(Isolation::new("delegate-host", ["worker"])),
    );
    check(&runner::run(program, &isolating, &protocol()).expect_err("refused"), &library);
    assert!(isolating.candidates().iter().all(|c| c.plugin().is_none()), "nothing was loaded");

    // A registry that isolates every library plugin: a plugin whose manifest does not ask is refused too.
    let all = Registry::discover(
        Discovery::new()
            .dirs([common::reference_only_dir()])
            .isolation(Isolation::new("delegate-host", ["worker"]).all(true)),
    );
    let err = runner::run(program, &all, &protocol()).expect_err("refused");
    assert!(matches!(&err, BridgeError::Isolated { backend, .. } if backend == common::BACKEND), "{err}");

    // et-run: one line, exit 2, although the embedded reference plugin also offers the backend.
    let out = et_run(&[program.as_os_str(), "--plugin-dir".as_ref(), asks.as_os_str()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with(&format!(
            "error: backend '{}' is served by plugin '{}'",
            common::BACKEND,
            manifest.name
        )),
        "{stderr}"
    );
    assert!(stderr.contains(&format!("`delegate-host run {}`", program.display())), "{stderr}");
    assert!(stderr.trim_end().ends_with("[NotSupported]"), "{stderr}");
    assert!(out.stdout.is_empty());
}
