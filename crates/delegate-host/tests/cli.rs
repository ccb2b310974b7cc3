//! The `delegate-host` binary as users run it: exit codes, one-line errors, JSON shapes, end-to-end runs.

use std::path::{Path, PathBuf};

use serde_json::Value;

mod common;
use common::{dylib, host, one_line_error, run, stdout_json, test_plugin_dir};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../blob-format/tests/fixtures/upstream").join(name)
}

#[test]
fn inspect_json_reads_upstream_blobs_as_their_readme_says() {
    let tr02 = stdout_json(&run(host().args(["inspect", "--json"]).arg(fixture("tr02_kv_cache.blob"))));
    assert_eq!(tr02["format"], "tr02");
    assert_eq!(tr02["backend"], "TensorRTBackend");
    assert_eq!(tr02["inputs"], serde_json::json!(["k_cache", "update", "write_idx"]));
    assert_eq!(tr02["outputs"], serde_json::json!(["k_cache_out", "logits"]));
    assert_eq!(
        tr02["aliases"],
        serde_json::json!([{"output": "k_cache_out", "input": "k_cache", "kind": "kv_cache_update"}])
    );
    assert_eq!(tr02["device_id"], 0);
    assert_eq!(tr02["engine_offset"], 512);
    assert_eq!(tr02["engine_size"], 273876);

    let tr01 = stdout_json(&run(host().args(["inspect", "--json"]).arg(fixture("tr01_relu.blob"))));
    assert_eq!(tr01["format"], "tr01");
    assert_eq!(tr01["inputs"], serde_json::json!(["input"]));
    assert_eq!(tr01["outputs"], serde_json::json!(["output"]));
    assert_eq!(tr01["aliases"], serde_json::json!([]));
    assert_eq!(tr01["engine_size"], 134028);
}

#[test]
fn unreadable_blobs_exit_2_with_one_named_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "root:*:20000:0:99999:7:::").expect("write");
    let line = one_line_error(&run(host().arg("inspect").arg(&text)));
    assert!(
        line.contains("unknown blob magic [72 6f 6f 74] (hex)")
            && line.ends_with("[DelegateInvalidCompatibility]"),
        "{line}"
    );
    // A file that is not a blob is not echoed back: four bytes in hex at most.
    assert!(!line.contains("root") && !line.contains("20000"), "{line}");

    let line = one_line_error(&run(host().arg("validate").arg(dir.path().join("missing.blob"))));
    assert!(line.contains("missing.blob") && line.ends_with("[AccessFailed]"), "{line}");

    // A truncated upstream blob: the engine extent runs past the end.
    let bytes = std::fs::read(fixture("tr02_kv_cache.blob")).expect("fixture");
    let cut = dir.path().join("cut.blob");
    std::fs::write(&cut, &bytes[..1000]).expect("write");
    let line = one_line_error(&run(host().arg("inspect").arg(&cut)));
    assert!(line.ends_with("[InvalidProgram]"), "{line}");
}

#[test]
fn validate_catches_a_corrupted_engine_that_inspect_does_not_read() {
    let dir = tempfile::tempdir().expect("temp dir");
    let native = dir.path().join("kv.blob");
    assert!(run(host()
        .arg("convert")
        .arg(fixture("tr02_kv_cache.blob"))
        .arg(&native)
        .args(["--to", "native"]))
    .status
    .success());
    let ok = run(host().arg("validate").arg(&native));
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    assert!(String::from_utf8_lossy(&ok.stdout).starts_with("ok: native 1.0 blob for TensorRTBackend"));

    let mut bytes = std::fs::read(&native).expect("read");
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&native, &bytes).expect("write");
    assert!(run(host().arg("inspect").arg(&native)).status.success(), "inspect parses the header only");
    let line = one_line_error(&run(host().arg("validate").arg(&native)));
    assert!(line.contains("checksum") && line.ends_with("[InvalidProgram]"), "{line}");
}

#[test]
fn convert_round_trips_upstream_blobs_byte_for_byte_and_refuses_lossy_targets() {
    let dir = tempfile::tempdir().expect("temp dir");
    for name in ["tr01_relu.blob", "tr02_kv_cache.blob"] {
        let native = dir.path().join(format!("{name}.native"));
        let back = dir.path().join(format!("{name}.back"));
        assert!(run(host().arg("convert").arg(fixture(name)).arg(&native).args(["--to", "native"]))
            .status
            .success());
        assert!(run(host().arg("convert").arg(&native).arg(&back).args(["--to", "tr02"])).status.success());
        assert_eq!(
            std::fs::read(&back).expect("back"),
            std::fs::read(fixture(name)).expect("fixture"),
            "{name}"
        );
    }

    kv_example::export::reference(&kv_example::Config::tiny(), dir.path()).expect("export");
    let out = dir.path().join("decode.tr02");
    let line = one_line_error(&run(host()
        .arg("convert")
        .arg(dir.path().join("decode.blob"))
        .arg(&out)
        .args(["--to", "tr02"])));
    assert!(line.contains("TR02 cannot express") && line.contains("ReferenceBackend"), "{line}");
    assert!(!out.exists(), "a refused conversion leaves no file behind");

    // A refused conversion onto an existing file leaves that file as it was.
    std::fs::write(&out, b"keep me").expect("write");
    one_line_error(&run(host()
        .arg("convert")
        .arg(dir.path().join("decode.blob"))
        .arg(&out)
        .args(["--to", "tr02"])));
    assert_eq!(std::fs::read(&out).expect("still there"), b"keep me");
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .expect("list")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with(".delegate-host-convert"))
        .collect();
    assert!(leftovers.is_empty(), "no temporary file is left behind: {leftovers:?}");
}

#[test]
fn convert_refuses_to_write_onto_its_input_by_any_name() {
    let dir = tempfile::tempdir().expect("temp dir");
    let blob = dir.path().join("a.blob");
    std::fs::copy(fixture("tr02_kv_cache.blob"), &blob).expect("copy");
    let original = std::fs::read(&blob).expect("read");
    let hard = dir.path().join("hard.blob");
    std::fs::hard_link(&blob, &hard).expect("hard link");
    let soft = dir.path().join("soft.blob");
    #[cfg(unix)]
    std::os::unix::fs::symlink(&blob, &soft).expect("symlink");
    for output in [&blob, &hard, &soft] {
        for to in ["native", "tr02"] {
            let line = one_line_error(&run(host().arg("convert").arg(&blob).arg(output).args(["--to", to])));
            assert!(line.contains("onto itself") && line.ends_with("[InvalidArgument]"), "{line}");
            assert_eq!(std::fs::read(&blob).expect("input intact"), original, "{}", output.display());
        }
    }
}

#[test]
fn convert_refuses_a_header_native_cannot_hold_before_writing_anything() {
    // A TR01 of long shape tables: 1.6 MB of metadata (under the 4 MiB upstream bound) that would become
    // about 19 MB of native header.
    let shape = vec![1i64; 200_000];
    let bindings: Vec<serde_json::Value> = (0..4)
        .map(|i| serde_json::json!({"name": format!("t{i}"), "dtype": "f32", "shape": shape, "is_input": true}))
        .collect();
    let metadata = serde_json::to_vec(&serde_json::json!({ "io_bindings": bindings })).expect("json");
    let engine_offset = (32 + metadata.len()).div_ceil(16) * 16;
    let mut bytes = b"TR01".to_vec();
    bytes.extend_from_slice(&32u32.to_le_bytes());
    bytes.extend_from_slice(&(metadata.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&(engine_offset as u32).to_le_bytes());
    bytes.extend_from_slice(&4u64.to_le_bytes());
    bytes.resize(32, 0);
    bytes.extend_from_slice(&metadata);
    bytes.resize(engine_offset, 0);
    bytes.extend_from_slice(b"ftrt");
    let dir = tempfile::tempdir().expect("temp dir");
    let (input, output) = (dir.path().join("long.blob"), dir.path().join("out.blob"));
    std::fs::write(&input, &bytes).expect("write");
    std::fs::write(&output, b"kept").expect("an existing output");
    let line = one_line_error(&run(host().arg("convert").arg(&input).arg(&output).args(["--to", "native"])));
    assert!(
        line.contains(
            "cannot convert to native: native cannot express this blob: its header would take up to"
        ),
        "{line}"
    );
    assert!(line.ends_with("[NotSupported]"), "{line}");
    assert_eq!(std::fs::read(&output).expect("output intact"), b"kept");
}

#[test]
fn usage_errors_are_one_line_with_a_code() {
    for args in [
        &["run", "program.toml", "--steps", "-1"][..],
        &["run", "program.toml", "--mode", "bogus"],
        &["inspect"],
        &["no-such-command"],
    ] {
        let line = one_line_error(&run(host().args(args)));
        assert!(line.ends_with("(see delegate-host --help) [InvalidArgument]"), "{args:?}: {line}");
    }
    let line = one_line_error(&run(host().args(["run", "program.toml", "--mode", "bogus"])));
    assert!(line.contains("'bogus'"), "{line}");
    // Help is not an error.
    let help = run(host().arg("--help"));
    assert!(help.status.success() && String::from_utf8_lossy(&help.stdout).contains("Usage"));
}

#[test]
fn a_closed_stdout_ends_quietly_and_a_full_one_is_one_error_line() {
    // The reader goes away before anything is written (`delegate-host ... | head -0`).
    let mut child = host()
        .args(["inspect"])
        .arg(fixture("tr02_kv_cache.blob"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starts");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("ends");
    assert!(out.status.success(), "{:?}: {}", out.status, String::from_utf8_lossy(&out.stderr));
    assert!(out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));

    if let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") {
        let out = run(host().arg("inspect").arg(fixture("tr02_kv_cache.blob")).stdout(full));
        let line = one_line_error(&out);
        assert!(line.contains("cannot write to stdout") && line.ends_with("[AccessFailed]"), "{line}");
    }
}

#[test]
fn control_characters_in_names_are_escaped() {
    let dir = tempfile::tempdir().expect("temp dir");
    let bytes = std::fs::read(fixture("tr02_kv_cache.blob")).expect("fixture");
    let header = blob_format::Blob::parse(&bytes).expect("parses").header;
    let mut evil = header.clone();
    evil.backend_id = "Evil\u{1b}[31mBackend\nsecond line".to_owned();
    evil.bindings[0].name = "k\0cache".to_owned();
    evil.aliases.clear();
    evil.bindings.retain(|b| b.threaded);
    let path = dir.path().join("evil.blob");
    std::fs::write(&path, blob_format::native::to_vec(&evil, b"engine")).expect("write");
    let out = run(host().arg("inspect").arg(&path));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Evil\\u{1b}[31mBackend\\nsecond line"), "{text}");
    assert!(text.contains("k\\u{0}cache"), "{text}");
    assert!(!text.contains('\u{1b}') && !text.contains('\0'), "{text}");
}

#[test]
fn plugins_lists_a_non_plugin_as_rejected_while_the_reference_plugin_loads() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("libnot_a_plugin.so"), "this is text").expect("write");
    let list = stdout_json(&run(host()
        .args(["plugins", "--json", "--probe", "--plugin-dir"])
        .arg(dir.path())
        .env_remove("DELEGATE_PLUGIN_PATH")));
    let candidates = list.as_array().expect("an array of candidates");
    let bogus = candidates
        .iter()
        .find(|c| c["path"].as_str().is_some_and(|p| p.ends_with("libnot_a_plugin.so")))
        .expect("listed");
    assert!(bogus["status"].to_string().contains("rejected"), "{bogus}");
    let loaded: Vec<&Value> =
        candidates.iter().filter(|c| c["status"].to_string().contains("loaded")).collect();
    assert!(loaded.iter().any(|c| c.to_string().contains("ReferenceBackend")), "{list}");
}

/// kv-example's tiny decoder exported for the reference backend into a fresh directory: the directory (kept
/// alive by the caller), its config and its `program.toml`.
fn tiny_reference() -> (tempfile::TempDir, kv_example::Config, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let cfg = kv_example::Config::tiny();
    kv_example::export::reference(&cfg, dir.path()).expect("export");
    let program = dir.path().join("program.toml");
    (dir, cfg, program)
}

fn run_json(program: &Path, mode: &str, steps: usize) -> Value {
    stdout_json(&run(host()
        .arg("run")
        .arg(program)
        .args(["--json", "--mode", mode, "--steps", &steps.to_string()])
        .env_remove("DELEGATE_PLUGIN_PATH")))
}

#[test]
fn run_decodes_with_zero_copies_and_copy_back_agrees() {
    let (_dir, cfg, program) = tiny_reference();
    let steps = cfg.max_decode_steps();
    let zero = run_json(&program, "zero-copy", steps);
    let back = run_json(&program, "copy-back", steps);
    assert_eq!(zero["tokens"].as_array().map(Vec::len), Some(steps + 1));
    assert_eq!(zero["tokens"], back["tokens"]);
    assert_eq!(zero["stats"]["mean_decode_bytes_copied_total"], 0);
    let cache_bytes = (cfg.cache_len() * 4 * 2 * cfg.layers) as u64;
    assert_eq!(back["stats"]["mean_decode_bytes_copied"]["reflect_bytes"], cache_bytes);
    assert_eq!(back["stats"]["mean_decode_bytes_copied"]["writeback_bytes"], cache_bytes);
    let steps_json = zero["steps"].as_array().expect("steps");
    assert_eq!(steps_json[0]["method"], "prefill");
    assert_eq!(steps_json[1]["method"], "decode");
    assert_eq!(steps_json[1]["position"], cfg.prompt_len() as u64);
}

#[test]
fn run_refuses_bad_programs_before_anything_runs() {
    let dir = tempfile::tempdir().expect("temp dir");
    kv_example::export::reference(&kv_example::Config::tiny(), dir.path()).expect("export");
    let program = dir.path().join("program.toml");
    let text = std::fs::read_to_string(&program).expect("manifest");

    // A typo in a buffer name is reported at its line and column.
    std::fs::write(&program, text.replacen("buffer:k_cache_0", "buffer:k_cahce_0", 1)).expect("write");
    let line = one_line_error(&run(host().arg("run").arg(&program)));
    assert!(line.contains("program.toml:") && line.contains("no buffer named 'k_cahce_0'"), "{line}");

    // Two of prefill's arguments swapped: the blob says which engine tensor each position binds.
    let prefill = text.find("[methods.prefill").expect("a prefill method");
    let (head, tail) = text.split_at(prefill);
    let swapped = format!(
        "{head}{}",
        tail.replacen("\"input:tokens\", \"input:input_pos\"", "\"input:input_pos\", \"input:tokens\"", 1)
    );
    assert_ne!(swapped, text, "the exported manifest lists tokens before input_pos");
    std::fs::write(&program, &swapped).expect("write");
    let line = one_line_error(&run(host().arg("run").arg(&program)));
    assert!(line.contains("argument 0 ('tokens')") && line.ends_with("[InvalidArgument]"), "{line}");

    // A missing blob.
    std::fs::write(&program, &text).expect("write");
    std::fs::remove_file(dir.path().join("decode.blob")).expect("remove");
    let line = one_line_error(&run(host().arg("run").arg(&program)));
    assert!(line.contains("decode.blob") && line.ends_with("[AccessFailed]"), "{line}");
}

/// The example program with its KV caches declared in `memory` instead of host memory.
fn example_with_caches_in(dir: &Path, memory: &str) -> PathBuf {
    kv_example::export::reference(&kv_example::Config::tiny(), dir).expect("export");
    let text = std::fs::read_to_string(dir.join("program.toml")).expect("manifest");
    let moved = text.replace("memory = \"host\"", &format!("memory = \"{memory}\""));
    assert_eq!(moved.matches(&format!("memory = \"{memory}\"")).count(), 2, "two caches moved:\n{moved}");
    let path = dir.join(format!("{memory}.toml"));
    std::fs::write(&path, moved).expect("write");
    path
}

#[test]
fn cuda_caches_load_only_with_a_driver_and_otherwise_fail_in_one_line() {
    let dir = tempfile::tempdir().expect("temp dir");
    let host_program = dir.path().join("program.toml");
    for memory in ["managed", "pinned"] {
        let program = example_with_caches_in(dir.path(), memory);
        match host_runtime::cuda::Context::open(0) {
            // CI: no driver. The program is refused at load with the driver's reason, not a panic.
            Err(err) => {
                let line =
                    one_line_error(&run(host().arg("run").arg(&program).env_remove("DELEGATE_PLUGIN_PATH")));
                assert_eq!(
                    line,
                    format!("error: buffer 'k_cache_0' wants {memory} memory but {err} [NotSupported]")
                );
            }
            // A GPU machine: the caches really are CUDA memory and decode the same tokens, zero-copy.
            Ok(_) => {
                for mode in ["zero-copy", "copy-back"] {
                    let on_cuda = run_json(&program, mode, 4);
                    let on_host = run_json(&host_program, mode, 4);
                    assert_eq!(on_cuda["tokens"], on_host["tokens"], "{memory} {mode}");
                    assert_eq!(
                        on_cuda["stats"]["mean_decode_bytes_copied"],
                        on_host["stats"]["mean_decode_bytes_copied"],
                        "{memory} {mode}"
                    );
                }
            }
        }
    }
}

#[test]
fn device_caches_are_refused_before_allocation_by_a_plugin_that_reads_host_memory() {
    let dir = tempfile::tempdir().expect("temp dir");
    let program = example_with_caches_in(dir.path(), "device");
    // The same line with or without a CUDA driver: the argument check runs before any memory is allocated.
    let line = one_line_error(&run(host().arg("run").arg(&program).env_remove("DELEGATE_PLUGIN_PATH")));
    assert!(
        line.contains("device.toml:")
            && line.contains("argument 2 ('k_cache_0') is in device memory, but plugin 'reference-delegate' does not accept device memory (it accepts host, pinned, managed)")
            && line.ends_with("[InvalidArgument]"),
        "{line}"
    );
}

#[test]
fn run_fills_the_caches_by_default_and_refuses_steps_that_do_not_fit() {
    let (_dir, cfg, program) = tiny_reference();

    let full =
        stdout_json(&run(host().arg("run").arg(&program).arg("--json").env_remove("DELEGATE_PLUGIN_PATH")));
    assert_eq!(full["tokens"].as_array().map(Vec::len), Some(cfg.max_decode_steps() + 1));

    let too_many = (cfg.max_decode_steps() + 1).to_string();
    let line = one_line_error(&run(host().arg("run").arg(&program).args(["--steps", &too_many])));
    assert!(
        line.contains("do not fit") && line.contains(&format!("at most {}", cfg.max_decode_steps())),
        "{line}"
    );
}

#[test]
fn a_plugin_for_a_newer_abi_is_rejected_naming_both_ranges_while_the_others_load() {
    // Only the two test plugins, so the listing does not depend on what else is built.
    let built = test_plugin_dir();
    let dir = tempfile::tempdir().expect("temp dir");
    for name in ["abi_test", "abi_test_future"] {
        let file = format!("{}{name}{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX);
        std::fs::copy(built.join(&file), dir.path().join(&file)).expect("built test plugin");
    }
    let list = stdout_json(&run(host()
        .args(["plugins", "--json", "--probe", "--plugin-dir"])
        .arg(dir.path())
        .env_remove("DELEGATE_PLUGIN_PATH")));
    let candidates = list.as_array().expect("an array of candidates");
    let candidate = |stem: &str| -> &Value {
        candidates
            .iter()
            .find(|c| c["path"].as_str().is_some_and(|p| p.contains(stem)))
            .unwrap_or_else(|| panic!("{stem} listed in {list}"))
    };
    let future = candidate("abi_test_future");
    assert_eq!(future["status"], "rejected", "{future}");
    assert_eq!(future["reason"], "plugin speaks ABI 2..=3, host 1..=1", "{future}");
    assert_eq!(candidate("libabi_test.")["status"], "loaded", "{list}");
}

#[test]
fn what_a_plugin_prints_goes_to_stderr_and_json_stays_clean() {
    let file = format!("{}abi_test{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX);
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::copy(test_plugin_dir().join(&file), dir.path().join(&file)).expect("built test plugin");
    let out = run(host()
        .args(["plugins", "--json", "--probe", "--plugin-dir"])
        .arg(dir.path())
        .env("ABI_TEST_PRINT", "chatter from a plugin {")
        .env_remove("DELEGATE_PLUGIN_PATH"));
    let list = stdout_json(&out);
    assert!(list.as_array().is_some_and(|l| l.iter().any(|c| c["status"] == "loaded")), "{list}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("chatter from a plugin {"), "printed, to stderr");
    // `--help` is the command's own output and stays on stdout.
    let help = run(host().arg("--help"));
    assert!(String::from_utf8_lossy(&help.stdout).contains("Usage"), "help on stdout");
}

#[test]
fn bench_reports_both_modes_with_their_copies() {
    let (_dir, cfg, program) = tiny_reference();
    let report = stdout_json(&run(host()
        .arg("bench")
        .arg(&program)
        .args(["--json", "--steps", "3", "--runs", "2"])
        .env_remove("DELEGATE_PLUGIN_PATH")));
    let modes = report["modes"].as_array().expect("modes");
    assert_eq!(modes.len(), 2, "{report}");
    assert_eq!(modes[0]["mode"], "zero-copy");
    assert_eq!(modes[0]["bytes_copied_per_step"], 0);
    assert_eq!(modes[0]["decode_steps_measured"], 3);
    assert_eq!(modes[1]["mode"], "copy-back");
    let cache_bytes = (cfg.cache_len() * 4 * 2 * cfg.layers) as u64;
    assert_eq!(modes[1]["reflect_bytes_per_step"], cache_bytes);
    assert_eq!(modes[1]["writeback_bytes_per_step"], cache_bytes);
    assert!(modes.iter().all(|m| m["median_us"].as_f64().is_some_and(|t| t > 0.0)), "{report}");
}

#[test]
fn plugins_table_and_json_name_every_candidate_with_its_status() {
    // The abi-test plugin twice (equal versions: the first found serves, the second is shadowed), a text file
    // posing as a library, and the embedded reference and CUDA plugins.
    let file = format!("{}abi_test{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX);
    let built = test_plugin_dir().join(&file);
    let (first, second) = (tempfile::tempdir().expect("temp dir"), tempfile::tempdir().expect("temp dir"));
    std::fs::copy(&built, first.path().join(&file)).expect("built test plugin");
    std::fs::copy(&built, second.path().join(&file)).expect("built test plugin");
    let fake = format!("{}fake{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX);
    std::fs::write(first.path().join(&fake), "not a library\n").expect("write");
    let listing = |json: bool| {
        let mut cmd = host();
        cmd.arg("plugins")
            .arg("--probe")
            .arg("--plugin-dir")
            .arg(first.path())
            .arg("--plugin-dir")
            .arg(second.path());
        if json {
            cmd.arg("--json");
        }
        run(cmd.env_remove("DELEGATE_PLUGIN_PATH"))
    };

    let out = listing(false);
    assert!(out.status.success());
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    let (candidates, serving) = table.split_once("\n\n").expect("candidates, then who serves each backend");
    let lines: Vec<&str> = candidates.lines().collect();
    assert!(lines[0].starts_with("PATH") && lines[0].trim_end().ends_with("STATUS"), "{table}");
    assert_eq!(lines.len(), 6, "a header and five candidates:\n{table}");
    // Each backend served: by which candidate, where it runs, and why.
    let first_copy = first.path().join(&file);
    assert!(
        serving.lines().any(|l| l
            == format!(
            "AbiTestBackend: served by {} (abi-test, in process): found first of the verified candidates at \
                 version 0.1.0",
            first_copy.display()
        )),
        "{table}"
    );
    assert!(lines[1].contains(" in process "), "the RUNS column: {table}");
    assert!(
        lines[1].contains("abi-test")
            && lines[1].contains(" AbiTestBackend ")
            && lines[1].ends_with("loaded")
    );
    assert!(lines[2].contains(&fake) && lines[2].contains("rejected: not a loadable library"), "{table}");
    // A backend a candidate offers but does not serve is parenthesised, and the status names the winner.
    assert!(lines[3].contains("(AbiTestBackend)"), "{table}");
    assert!(lines[3].ends_with(&format!("shadowed by {}", first.path().join(&file).display())), "{table}");
    assert!(lines[4].starts_with("(embedded)") && lines[4].ends_with("loaded"), "{table}");
    // The CUDA delegate serves its backend where a GPU is, and says why not elsewhere.
    let cuda = lines[5];
    assert!(cuda.starts_with("(embedded)") && cuda.contains("cuda-delegate"), "{table}");
    if std::path::Path::new("/dev/nvidiactl").exists() {
        assert!(cuda.ends_with("loaded"), "{table}");
    } else {
        assert!(
            cuda.contains("(CudaBackend)") && cuda.contains("unavailable: no CUDA driver is available"),
            "{table}"
        );
    }

    let json = stdout_json(&listing(true));
    assert_eq!(json[0]["status"], "loaded");
    assert_eq!(json[0]["name"], "abi-test");
    assert_eq!(json[0]["abi_version"], 1);
    assert_eq!(json[0]["backends"], serde_json::json!(["AbiTestBackend"]));
    assert_eq!(json[0]["serves"], serde_json::json!(["AbiTestBackend"]));
    assert_eq!(json[0]["wire_formats"], serde_json::json!([{"format": "native", "versions": ">=1.0, <2"}]));
    assert_eq!(json[0]["memory_kinds"], serde_json::json!(["host", "pinned"]));
    assert_eq!(json[0]["isolated"], false);
    assert_eq!(
        json[0]["serves_why"],
        serde_json::json!({"AbiTestBackend": "found first of the verified candidates at version 0.1.0"})
    );
    assert_eq!(json[1]["status"], "rejected");
    assert!(json[1]["reason"].as_str().expect("reason").starts_with("not a loadable library"));
    assert_eq!(json[2]["status"], "shadowed");
    assert_eq!(json[2]["serves"], serde_json::json!([]));
    assert_eq!(json[2]["shadowed_by"], first.path().join(&file).display().to_string());
    assert_eq!(json[3]["embedded"], true);
    assert_eq!(json[3]["path"], Value::Null);
    assert_eq!(json[4]["embedded"], true);
    assert_eq!(json[4]["name"], "cuda-delegate");
}

// ExecuTorch programs (.pte): `inspect` reads the container and the blob in each delegate.

fn pte_fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../pte-format/tests/fixtures").join(name)
}

#[test]
fn inspect_json_reads_an_executorch_program_and_the_blobs_of_its_delegates() {
    // The same KV decoder written by pte-format's test builder and by ExecuTorch 1.5.1's own serializer.
    for name in ["kv_decoder.pte", "et_1_5_1_kv_decoder.pte"] {
        let pte = stdout_json(&run(host().args(["inspect", "--json"]).arg(pte_fixture(name))));
        assert_eq!(pte["format"], "pte", "{name}");
        assert_eq!(pte["identifier"], "ET12");
        assert_eq!(pte["extended_header"]["length"], 32);
        assert_eq!(pte["segments"].as_array().map(Vec::len), Some(2));
        let forward = &pte["methods"][0];
        assert_eq!(forward["name"], "forward");
        let values = |key: &str| -> Vec<Value> {
            forward[key].as_array().expect(key).iter().map(|v| v["value"].clone()).collect()
        };
        assert_eq!(values("inputs"), [serde_json::json!(0), serde_json::json!(1)]);
        assert_eq!(forward["inputs"][0]["tensor"]["scalar_type"], "Long");
        assert_eq!(forward["inputs"][0]["tensor"]["sizes"], serde_json::json!([1, 1]));
        assert_eq!(values("outputs"), [serde_json::json!(7)]);
        assert_eq!(forward["outputs"][0]["tensor"]["sizes"], serde_json::json!([1, 1, 32]));

        let buffers = &forward["mutable_buffers"];
        assert_eq!(buffers[0]["name"], "k_cache");
        assert_eq!(
            (&buffers[0]["mem_id"], &buffers[0]["offset"]),
            (&serde_json::json!(2), &serde_json::json!(0))
        );
        assert_eq!(buffers[0]["tensor"]["nbytes"], 1024);
        assert_eq!(
            buffers[0]["write_backs"],
            serde_json::json!([{"instruction": "chains[0].instructions[1]", "src": 4}])
        );
        assert_eq!(buffers[1]["name"], "v_cache");
        assert_eq!(buffers[1]["offset"], 1024);

        let call = &forward["delegate_calls"][0];
        assert_eq!(call["instruction"], "chains[0].instructions[0]");
        assert_eq!(call["backend"], "ReferenceBackend");
        assert_eq!(call["args"], serde_json::json!([1, 0, 2, 3, 4, 5, 6]));
        assert_eq!(call["payload"]["location"], "segment");
        assert_eq!(call["payload"]["index"], 1);
        assert_eq!(call["payload"]["offset"], pte["extended_header"]["segment_base_offset"]);
        assert_eq!(call["compile_specs"], serde_json::json!([{"key": "max_seq_len", "size": 2}]));
        let blob = &call["blob"];
        assert_eq!(
            (&blob["format"], &blob["version"]),
            (&serde_json::json!("native"), &serde_json::json!("1.0"))
        );
        assert_eq!(blob["backend"], "ReferenceBackend");
        assert_eq!(blob["payload_kind"], "reference-graph");
        // Each threaded binding is matched with the DelegateCall argument at its position.
        assert_eq!(blob["bindings"][0]["name"], "input_pos");
        assert_eq!(
            (&blob["bindings"][0]["arg"], &blob["bindings"][0]["value"]),
            (&serde_json::json!(0), &serde_json::json!(1))
        );
        assert_eq!(blob["bindings"][2]["name"], "k_cache");
        assert_eq!(blob["bindings"][2]["value"], 2);
        assert_eq!(blob["bindings"][2]["shape"], serde_json::json!([1, 2, 16, 8]));
        assert_eq!(
            blob["aliases"][0],
            serde_json::json!({"output": "k_cache_out", "input": "k_cache", "kind": "kv_cache_update"})
        );

        let ops: Vec<_> = forward["operators"]
            .as_array()
            .expect("operators")
            .iter()
            .map(|o| {
                format!(
                    "{}.{} {}",
                    o["name"].as_str().unwrap_or(""),
                    o["overload"].as_str().unwrap_or(""),
                    o["args"]
                )
            })
            .collect();
        assert_eq!(ops, ["aten::copy_. [2,4,9,2]", "aten::copy_. [3,5,9,3]", "aten::clone.out [6,8,7]"]);
        assert_eq!(forward["instructions"].as_array().map(Vec::len), Some(4));
    }
}

#[test]
fn inspect_text_shows_methods_buffers_delegate_calls_and_operators() {
    let out = run(host().arg("inspect").arg(pte_fixture("et_1_5_1_kv_decoder.pte")));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let has = |line_start: &str| text.lines().any(|l| l.trim_start().starts_with(line_start));
    assert!(text.starts_with("format:   pte ET12 (schema version 0)\n"), "{text}");
    assert!(has("method forward"), "{text}");
    assert!(has("[0] v0   Long [1, 1]  mem 1 @ 0"), "{text}");
    assert!(
        has("v2   k_cache  Float [1, 2, 16, 8]  mem 2 @ 0  1024 bytes; written back from v4 by aten::copy_ at chains[0].instructions[1]"),
        "{text}"
    );
    assert!(has("chains[0].instructions[0]  delegate 0  ReferenceBackend"), "{text}");
    assert!(has("args:     v1 v0 v2 v3 v4 v5 v6"), "{text}");
    assert!(
        has("blob:     native 1.0, backend ReferenceBackend, payload reference-graph (300 bytes)"),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l.contains("arg  2  input  k_cache")
            && l.ends_with("v2  k_cache  Float [1, 2, 16, 8]  mem 2 @ 0")),
        "{text}"
    );
    assert!(has("k_cache_out <- k_cache (kv_cache_update)"), "{text}");
    assert!(has("chains[0].instructions[3]  aten::clone.out  (v6 v8 v7)"), "{text}");
}

#[test]
fn inspect_pte_reports_a_delegate_payload_it_cannot_read_and_carries_on() {
    use pte_format::model::DataLocation;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut spec = pte_format::testing::kv_decoder_spec(b"");
    spec.segments = vec![Vec::new()];
    spec.inline_data = vec![b"XNNPACK payload, not a delegate blob".to_vec()];
    spec.methods[0].delegates[0].id = "XnnpackBackend".into();
    spec.methods[0].delegates[0].location = DataLocation::Inline;
    spec.methods[0].delegates[0].index = 0;
    let path = dir.path().join("xnnpack.pte");
    std::fs::write(&path, spec.to_bytes()).expect("write");

    let json = stdout_json(&run(host().args(["inspect", "--json"]).arg(&path)));
    assert!(json["extended_header"].is_null(), "no segment data, no extended header");
    let call = &json["methods"][0]["delegate_calls"][0];
    assert_eq!(call["backend"], "XnnpackBackend");
    assert_eq!(call["payload"]["location"], "inline");
    assert!(call.get("blob").is_none());
    assert_eq!(call["blob_error"]["code"], "DelegateInvalidCompatibility");
    assert!(call["blob_error"]["message"].as_str().is_some_and(|m| m.starts_with("unknown blob magic")));

    let out = run(host().arg("inspect").arg(&path));
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("blob:     not read: unknown blob magic [58 4e 4e 50] (hex)"), "{text}");
    assert!(text.contains("[DelegateInvalidCompatibility]"), "{text}");
}

#[test]
fn malformed_programs_exit_2_with_one_named_error_and_names_from_files_are_escaped() {
    let dir = tempfile::tempdir().expect("temp dir");
    let bytes = std::fs::read(pte_fixture("kv_decoder.pte")).expect("fixture");

    let cut = dir.path().join("cut.pte");
    std::fs::write(&cut, &bytes[..bytes.len() - 1]).expect("write");
    let line = one_line_error(&run(host().arg("inspect").arg(&cut)));
    assert!(
        line.contains("cut.pte: the segment data (extended header)") && line.ends_with("[InvalidProgram]"),
        "{line}"
    );

    let mut future = bytes.clone();
    future[4..8].copy_from_slice(b"ET13");
    let et13 = dir.path().join("future.pte");
    std::fs::write(&et13, &future).expect("write");
    let line = one_line_error(&run(host().args(["inspect", "--json"]).arg(&et13)));
    assert!(
        line.contains("\"ET13\" is not read by this build") && line.ends_with("[NotSupported]"),
        "{line}"
    );

    let mut spec = pte_format::testing::kv_decoder_spec(b"payload");
    spec.methods[0].name = "forward\n\u{1b}[31mred".into();
    spec.methods[0].delegates[0].index = 9;
    let bad = dir.path().join("bad.pte");
    std::fs::write(&bad, spec.to_bytes()).expect("write");
    let line = one_line_error(&run(host().arg("inspect").arg(&bad)));
    assert!(
        line.contains("processed.index is 9, but segments has 2 entries")
            && line.ends_with("[InvalidProgram]"),
        "{line}"
    );
    assert!(!line.contains('\u{1b}'), "{line}");

    spec.methods[0].delegates[0].index = 1;
    let named = dir.path().join("named.pte");
    std::fs::write(&named, spec.to_bytes()).expect("write");
    let out = run(host().arg("inspect").arg(&named));
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("method forward\\n\\u{1b}[31mred\n"), "{text}");
    assert!(!text.contains('\u{1b}'));
}

#[test]
fn fifos_and_devices_are_refused_before_they_are_read() {
    let dir = tempfile::tempdir().expect("temp dir");
    let fifo = dir.path().join("pipe.blob");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().expect("mkfifo runs");
    assert!(made.success());
    // Each would block (a FIFO with no writer) or read without end (/dev/zero) if opened.
    for (args, what) in [
        (vec!["inspect".to_owned(), fifo.display().to_string()], "a FIFO"),
        (vec!["validate".to_owned(), "/dev/zero".to_owned()], "a character device"),
        (vec!["run".to_owned(), fifo.display().to_string()], "not a regular file"),
        (vec!["run".to_owned(), "/dev/zero".to_owned()], "not a regular file"),
    ] {
        let line = one_line_error(&run(host().args(&args)));
        assert!(line.contains(what) && line.ends_with("[AccessFailed]"), "{args:?}: {line}");
    }
}

#[test]
fn a_manifest_larger_than_the_limit_is_refused_without_reading_it_all() {
    let dir = tempfile::tempdir().expect("temp dir");
    let big = dir.path().join("big.toml");
    let file = std::fs::File::create(&big).expect("create");
    file.set_len(program_manifest::MAX_MANIFEST_BYTES + 1).expect("sparse file");
    let line = one_line_error(&run(host().arg("run").arg(&big)));
    assert!(line.contains("the most a manifest may be") && line.ends_with("[AccessFailed]"), "{line}");
}

#[test]
fn run_and_bench_start_at_a_position_and_a_cuda_graph_without_the_device_loop_is_one_error_line() {
    let (_dir, cfg, program) = tiny_reference();
    let max = cfg.max_len as u64;

    // --position P: decode steps run at P, P+1, ...; by default as many as fit from P.
    let from = stdout_json(&run(host()
        .arg("run")
        .arg(&program)
        .args(["--json", "--position", &(max - 2).to_string()])
        .env_remove("DELEGATE_PLUGIN_PATH")));
    let positions: Vec<u64> =
        from["steps"].as_array().expect("steps").iter().filter_map(|s| s["position"].as_u64()).collect();
    assert_eq!(positions, [0, max - 2, max - 1], "{from}");
    assert_eq!(from["stats"]["device_loop"], false);
    assert_eq!(from["stats"]["cuda_graph"], false);
    assert_eq!(from["stats"]["host_syncs_per_decode_step"], 0.0);
    assert!(from["stats"]["mean_decode_gpu_us"].is_null(), "host memory: no GPU time");

    // Refused at load: the reference delegate does not state that it can be captured.
    let line = one_line_error(&run(host().arg("run").arg(&program).arg("--cuda-graph")));
    assert_eq!(
        line,
        "error: a CUDA graph (--cuda-graph) of method 'decode' is refused at load: call 0 (ReferenceBackend) is served by plugin 'reference-delegate', which does not state the capability cuda_graph_capturable [NotSupported]"
    );

    let report = stdout_json(&run(host()
        .arg("bench")
        .arg(&program)
        .args(["--json", "--runs", "2", "--position", &(max / 2).to_string()])
        .env_remove("DELEGATE_PLUGIN_PATH")));
    assert_eq!(report["position"], max / 2);
    assert_eq!(report["steps"], max - max / 2, "as many steps as fit from the position");
    let modes = report["modes"].as_array().expect("modes");
    assert_eq!(modes.len(), 2, "no graph row without the device loop: {report}");
    for row in modes {
        assert_eq!(row["cuda_graph"], false);
        assert_eq!(row["host_syncs_per_step"], 0.0);
        assert!(row["gpu_median_us"].is_null(), "{row}");
    }
    let line = one_line_error(&run(host().arg("bench").arg(&program).args(["--position", &max.to_string()])));
    assert!(line.contains("do not fit") || line.contains("--steps >= 1"), "{line}");
}

#[test]
fn a_program_naming_a_blob_outside_its_directory_runs_only_when_allowed() {
    let outer = tempfile::tempdir().expect("temp dir");
    let cfg = kv_example::Config::tiny();
    kv_example::export::reference(&cfg, &outer.path().join("blobs")).expect("export");
    // The program lives in its own directory and names the blobs through `..`.
    let dir = outer.path().join("program");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let text = std::fs::read_to_string(outer.path().join("blobs/program.toml"))
        .expect("manifest")
        .replace("blob = \"", "blob = \"../blobs/");
    std::fs::write(dir.join("program.toml"), text).expect("write");
    let line = one_line_error(&run(host()
        .arg("run")
        .arg(dir.join("program.toml"))
        .env_remove("DELEGATE_PLUGIN_PATH")));
    assert!(
        line.contains("blob '../blobs/decode.blob' is outside the program's directory")
            || line.contains("blob '../blobs/prefill.blob' is outside the program's directory"),
        "{line}"
    );
    assert!(
        line.ends_with(
            "a host loads it only when told to (delegate-host --allow-outside-blobs) [InvalidProgram]"
        ),
        "{line}"
    );
    let out = run(host()
        .arg("run")
        .arg(dir.join("program.toml"))
        .arg("--allow-outside-blobs")
        .arg("--json")
        .env_remove("DELEGATE_PLUGIN_PATH"));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// A manifest for a fixture that cannot be loaded to describe itself (crash-on-load, panic-on-info), offering
/// `backend` at `version`, with the library's own SHA-256 or `sha256`.
fn fixture_manifest(dir: &Path, library: &str, backend: &str, version: &str, sha256: Option<&str>) {
    let sha256 = sha256.map_or_else(
        || host_runtime::plugin_manifest::sha256_file(&dir.join(library)).expect("hashable"),
        str::to_owned,
    );
    let manifest = serde_json::json!({
        "manifest_version": 1, "library": library, "sha256": sha256, "name": "fixture", "version": version,
        "abi": {"min": 1, "max": 1}, "backends": [backend],
        "wire_formats": [{"format": "native", "versions": ">=1.0, <2"}], "memory_kinds": ["host"],
        "binds_aliases_in_place": true,
        "target": format!("{}-{}", std::env::consts::ARCH, std::env::consts::OS),
    });
    let stem = library.trim_end_matches(std::env::consts::DLL_SUFFIX);
    std::fs::write(dir.join(format!("{stem}.plugin.json")), manifest.to_string()).expect("write manifest");
}

/// A manifest for the crash-on-load fixture, its hash right, offering `CrashBackend`.
fn crash_manifest(dir: &Path, library: &str) {
    fixture_manifest(dir, library, "CrashBackend", "0.1.0", None);
}

/// The built fixture `stem`: in the test plugin directory, or built into `target/plugin-tests` (a separate
/// target dir: the outer cargo holds the main one's lock).
fn built_fixture(stem: &str, package: &str) -> PathBuf {
    let path = test_plugin_dir().join(dylib(stem));
    if path.exists() {
        return path;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let target = root.join("target").join("plugin-tests");
    let status = std::process::Command::new(env!("CARGO"))
        .args(["build", "-q", "-p", package, "--target-dir"])
        .arg(&target)
        .current_dir(&root)
        .status()
        .expect("cargo starts");
    let path = target.join("debug").join(dylib(stem));
    assert!(status.success() && path.exists(), "building {package} failed");
    path
}

/// The plugins serving the run (its `--json` report's `plugins`), as (backend, path, isolated).
fn run_plugins(report: &Value) -> Vec<(String, Value, bool)> {
    report["plugins"]
        .as_array()
        .unwrap_or_else(|| panic!("no plugins in {report}"))
        .iter()
        .map(|p| {
            (p["backend"].as_str().unwrap_or_default().to_owned(), p["path"].clone(), p["isolated"] == true)
        })
        .collect()
}

#[test]
fn a_library_beside_a_manifest_with_a_wrong_sha256_never_runs_and_the_embedded_plugin_serves() {
    // crash-on-load aborts the process that opens it; its manifest claims a newer ReferenceBackend.
    let dir = tempfile::tempdir().expect("temp dir");
    let library = dylib("crash_on_load");
    std::fs::copy(test_plugin_dir().join(&library), dir.path().join(&library)).expect("built fixture");
    fixture_manifest(dir.path(), &library, "ReferenceBackend", "9.0.0", Some(&"ab".repeat(32)));
    for probe in [false, true] {
        let mut cmd = host();
        cmd.args(["plugins", "--json", "--plugin-dir"]).arg(dir.path()).env_remove("DELEGATE_PLUGIN_PATH");
        if probe {
            cmd.arg("--probe");
        }
        let list = stdout_json(&run(&mut cmd));
        let candidate = &list[0];
        assert_eq!(candidate["status"], "rejected", "{candidate}");
        let reason = candidate["reason"].as_str().expect("a reason");
        assert!(reason.starts_with(&format!("sha256: manifest {}, library ", "ab".repeat(32))), "{reason}");
        let fix = format!("`delegate-host plugin-manifest {}`", dir.path().join(&library).display());
        assert!(reason.ends_with(&fix), "{reason}");
    }
    let program = tempfile::tempdir().expect("temp dir");
    kv_example::export::reference(&kv_example::Config::tiny(), program.path()).expect("export");
    let report = stdout_json(&run(host()
        .arg("run")
        .arg(program.path().join("program.toml"))
        .args(["--steps", "2", "--json", "--plugin-dir"])
        .arg(dir.path())
        .env_remove("DELEGATE_PLUGIN_PATH")));
    assert_eq!(run_plugins(&report), [("ReferenceBackend".to_owned(), Value::Null, false)]);
}

#[test]
fn a_plugin_whose_self_description_panics_is_passed_over_quietly_for_the_next_candidate() {
    let dir = tempfile::tempdir().expect("temp dir");
    let library = dylib("panic_on_info");
    std::fs::copy(built_fixture("panic_on_info", "panic-on-info"), dir.path().join(&library))
        .expect("built fixture");
    fixture_manifest(dir.path(), &library, "ReferenceBackend", "9.0.0", None);
    let list = stdout_json(&run(host()
        .args(["plugins", "--json", "--plugin-dir"])
        .arg(dir.path())
        .env_remove("DELEGATE_PLUGIN_PATH")));
    assert_eq!(list[0]["status"], "listed", "{list}");
    assert_eq!(
        list[0]["serves_why"],
        serde_json::json!({"ReferenceBackend": "the highest version (9.0.0) of 2 verified candidates"})
    );
    let program = tempfile::tempdir().expect("temp dir");
    kv_example::export::reference(&kv_example::Config::tiny(), program.path()).expect("export");
    let out = run(host()
        .arg("run")
        .arg(program.path().join("program.toml"))
        .args(["--steps", "2", "--json", "--plugin-dir"])
        .arg(dir.path())
        .env_remove("DELEGATE_PLUGIN_PATH"));
    let report = stdout_json(&out);
    assert_eq!(run_plugins(&report), [("ReferenceBackend".to_owned(), Value::Null, false)]);
    // One log line, naming the library and why; no panic text.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].contains("WARN") && lines[0].contains("passed over"), "{stderr}");
    assert!(lines[0].contains(&library) && lines[0].contains("plugin refused the handshake"), "{stderr}");
    assert!(!stderr.contains("panicked at") && !stderr.contains("RUST_BACKTRACE"), "{stderr}");
}

#[test]
fn a_pte_program_runs_a_plugin_whose_manifest_asks_for_isolation_in_a_worker_as_a_toml_program_does() {
    // crash-on-load, its hash right, claiming the newest ReferenceBackend and asking for isolation: every
    // program path places it in a worker, whose death fails the run in one line; the host never opens it.
    let dir = tempfile::tempdir().expect("temp dir");
    let library = dylib("crash_on_load");
    std::fs::copy(test_plugin_dir().join(&library), dir.path().join(&library)).expect("built fixture");
    fixture_manifest(dir.path(), &library, "ReferenceBackend", "9.0.0", None);
    let stem = library.trim_end_matches(std::env::consts::DLL_SUFFIX);
    let manifest_path = dir.path().join(format!("{stem}.plugin.json"));
    let mut manifest: Value =
        serde_json::from_slice(&std::fs::read(&manifest_path).expect("written")).expect("json");
    manifest["isolate"] = Value::from(true);
    std::fs::write(&manifest_path, manifest.to_string()).expect("edit");

    let pte = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/executorch/buffers_2m.pte");
    let toml = tempfile::tempdir().expect("temp dir");
    kv_example::export::reference(&kv_example::Config::tiny(), toml.path()).expect("export");
    for program in [pte, toml.path().join("program.toml")] {
        let out = run(host()
            .arg("run")
            .arg(&program)
            .args(["--prompt", "1,7,3,12", "--steps", "2", "--plugin-dir"])
            .arg(dir.path())
            .env_remove("DELEGATE_PLUGIN_PATH"));
        let line = one_line_error(&out);
        assert!(line.ends_with("[Internal]"), "{}: {line}", program.display());
    }
}

#[test]
fn plugins_and_run_say_per_plugin_whether_it_runs_isolated() {
    // The reference delegate as a library whose manifest asks for isolation (it misbehaves only on request).
    let dir = tempfile::tempdir().expect("temp dir");
    let library = dir.path().join(dylib("misbehave_delegate"));
    std::fs::copy(test_plugin_dir().join(dylib("misbehave_delegate")), &library).expect("built fixture");
    let out = run(host().args(["plugin-manifest", "--isolate"]).arg(&library));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let list = stdout_json(&run(host()
        .args(["plugins", "--json", "--plugin-dir"])
        .arg(dir.path())
        .env_remove("DELEGATE_PLUGIN_PATH")));
    let isolated: Vec<(Value, Value)> =
        list.as_array().expect("a list").iter().map(|c| (c["name"].clone(), c["isolated"].clone())).collect();
    assert_eq!(isolated[0], (Value::from("misbehave-delegate"), Value::from(true)), "{list}");
    assert_eq!(isolated[1], (Value::from("reference-delegate"), Value::from(false)), "{list}");
    let table =
        run(host().args(["plugins", "--plugin-dir"]).arg(dir.path()).env_remove("DELEGATE_PLUGIN_PATH"));
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    assert!(
        table.lines().any(|l| l.starts_with(&format!(
            "ReferenceBackend: served by {} (misbehave-delegate, isolated): ",
            library.display()
        ))),
        "{table}"
    );

    let program = tempfile::tempdir().expect("temp dir");
    kv_example::export::reference(&kv_example::Config::tiny(), program.path()).expect("export");
    let run_it = |json: bool| {
        let mut cmd = two_steps_with_plugins(program.path(), dir.path());
        cmd.env_remove("MISBEHAVE");
        if json {
            cmd.arg("--json");
        }
        run(&mut cmd)
    };
    let path = Value::from(library.display().to_string());
    assert_eq!(run_plugins(&stdout_json(&run_it(true))), [("ReferenceBackend".to_owned(), path, true)]);
    let out = run_it(false);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let line = format!("plugin for ReferenceBackend: misbehave-delegate ({}), isolated", library.display());
    assert!(text.lines().any(|l| l == line), "{text}");
}

#[test]
fn a_backend_nobody_serves_names_each_library_without_a_manifest_and_the_command_that_writes_one() {
    // A plugin built by following the guide but without its manifest; the program calls CudaBackend, which
    // the embedded CUDA delegate serves only where a GPU is.
    let dir = tempfile::tempdir().expect("temp dir");
    let library = dir.path().join(dylib("abi_test"));
    std::fs::copy(test_plugin_dir().join(dylib("abi_test")), &library).expect("built plugin");
    let program = tempfile::tempdir().expect("temp dir");
    let target = kv_example::export::Target {
        backend: kv_example::export::Backend::Cuda,
        memory: program_manifest::MemoryKind::Host,
    };
    kv_example::export::program(&kv_example::Config::tiny(), program.path(), &target).expect("export");
    let out = run(&mut two_steps_with_plugins(program.path(), dir.path()));
    if std::path::Path::new("/dev/nvidiactl").exists() {
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        return;
    }
    let line = one_line_error(&out);
    assert!(
        line.contains("no loaded plugin serves backend 'CudaBackend' (loaded: ReferenceBackend)"),
        "{line}"
    );
    let fix = format!("write one with `delegate-host plugin-manifest {}`", library.display());
    let named = format!("library {} has no manifest, so this host never opens it", library.display());
    assert!(line.contains(&named) && line.contains(&fix), "{line}");
}

#[test]
fn probing_and_isolating_together_are_refused_in_one_line() {
    let line = one_line_error(&run(host().args(["--probe", "--isolate", "plugins"])));
    assert!(line
        .starts_with("error: --probe loads every plugin library into this process, which --isolate forbids"));
    assert!(line.ends_with("[InvalidArgument]"), "{line}");
}

#[test]
fn plugins_and_run_never_open_a_library_they_do_not_need() {
    // A library that aborts the process the moment it is opened: once with a manifest, once without.
    let dir = tempfile::tempdir().expect("temp dir");
    let crash = test_plugin_dir().join(dylib("crash_on_load"));
    let (listed, bare) = (dylib("crash_listed"), dylib("crash_bare"));
    std::fs::copy(&crash, dir.path().join(&listed)).expect("built fixture");
    std::fs::copy(&crash, dir.path().join(&bare)).expect("built fixture");
    crash_manifest(dir.path(), &listed);
    let list = stdout_json(&run(host()
        .args(["plugins", "--json", "--plugin-dir"])
        .arg(dir.path())
        .env_remove("DELEGATE_PLUGIN_PATH")));
    let status = |name: &str| {
        list.as_array()
            .and_then(|l| l.iter().find(|c| c["path"].as_str().is_some_and(|p| p.ends_with(name))))
            .map(|c| (c["status"].clone(), c["backends"].clone()))
            .unwrap_or_else(|| panic!("{name} listed: {list}"))
    };
    assert_eq!(
        status(&listed),
        (Value::from("listed"), serde_json::json!(["CrashBackend"])),
        "from its manifest"
    );
    assert_eq!(status(&bare).0, "no-manifest");

    // A program that needs only the embedded reference delegate runs with them on the plugin path.
    let program = tempfile::tempdir().expect("temp dir");
    kv_example::export::reference(&kv_example::Config::tiny(), program.path()).expect("export");
    let out = run(&mut two_steps_with_plugins(program.path(), dir.path()));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_library_that_disagrees_with_its_manifest_is_rejected_naming_the_difference() {
    let dir = tempfile::tempdir().expect("temp dir");
    let library = dir.path().join(dylib("reference_delegate_dylib"));
    std::fs::copy(test_plugin_dir().join(dylib("reference_delegate_dylib")), &library).expect("built plugin");
    // The manifest is written from the library, by the tool, never by hand.
    let out = run(host().arg("plugin-manifest").arg(&library));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let manifest_path = dir.path().join("libreference_delegate_dylib.plugin.json");
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(&manifest_path).expect("written")).expect("json");
    assert_eq!(
        (manifest["name"].as_str(), manifest["backends"][0].as_str()),
        (Some("reference-delegate"), Some("ReferenceBackend"))
    );
    assert_eq!(manifest["sha256"].as_str().map(str::len), Some(64));
    // The compiler that built the library, as the library records it.
    assert!(manifest["rustc"].as_str().is_some_and(|r| r.starts_with("rustc version ")), "{manifest}");

    let program = tempfile::tempdir().expect("temp dir");
    kv_example::export::reference(&kv_example::Config::tiny(), program.path()).expect("export");
    let run_it = || {
        run(host()
            .arg("run")
            .arg(program.path().join("program.toml"))
            .args(["--steps", "2", "--json", "--plugin-dir"])
            .arg(dir.path())
            .env_remove("DELEGATE_PLUGIN_PATH"))
    };
    // As written: the library from disk (found before the embedded copy of the same version) serves.
    assert_eq!(
        run_plugins(&stdout_json(&run_it())),
        [("ReferenceBackend".to_owned(), Value::from(library.display().to_string()), false)]
    );

    // A rebuilt library under the old manifest: rejected from its hash alone, naming the library and the
    // command that writes its manifest again; the embedded copy serves the program.
    let mut edited = manifest.clone();
    edited["sha256"] = Value::from("0".repeat(64));
    std::fs::write(&manifest_path, edited.to_string()).expect("edit");
    let fix = format!("`delegate-host plugin-manifest {}`", library.display());
    let list = stdout_json(&run(host().args(["plugins", "--json", "--plugin-dir"]).arg(dir.path())));
    let reason = list[0]["reason"].as_str().unwrap_or_default().to_owned();
    assert!(reason.starts_with("sha256: manifest 0000") && reason.ends_with(&fix), "{list}");
    assert_eq!(run_plugins(&stdout_json(&run_it())), [("ReferenceBackend".to_owned(), Value::Null, false)]);

    // Its hash right but its self-description not: passed over when the program asks for it, naming the
    // difference, and the next candidate (embedded) serves.
    // (A version above the embedded copy's, so the library ranks first and is loaded.)
    let mut edited = manifest.clone();
    edited["version"] = Value::from("9.0.0");
    std::fs::write(&manifest_path, edited.to_string()).expect("edit");
    let out = run_it();
    assert_eq!(run_plugins(&stdout_json(&out)), [("ReferenceBackend".to_owned(), Value::Null, false)]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let differs =
        format!("version: manifest 9.0.0, library {}", manifest["version"].as_str().expect("a version"));
    assert!(stderr.contains(&differs) && stderr.contains(&fix), "{stderr}");
    // `--probe` loads it at once and lists the same reason.
    let list =
        stdout_json(&run(host().args(["plugins", "--json", "--probe", "--plugin-dir"]).arg(dir.path())));
    let candidate = list.as_array().and_then(|l| l.first()).expect("the library").clone();
    assert_eq!(candidate["status"], "rejected", "{candidate}");
    assert!(candidate["reason"].as_str().is_some_and(|r| r.contains(&differs)), "{candidate}");
}

// ---------------------------------------------------------------------------------------------------------
// Issue 17, items 13-15 (blob files and program manifests): a blob linked out of its program's directory, a
// FIFO in place of a program file, and `inspect` of multi-gigabyte files reading only their headers.

/// Runs `delegate-host ARGS` with its address space limited to `mib` MiB (`ulimit -v`): a command that
/// reads a file larger than that into memory fails to allocate it.
fn host_within(mib: u64, args: &[&std::ffi::OsStr]) -> std::process::Output {
    let script = format!("ulimit -v {} && exec \"$@\"", mib * 1024);
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c").arg(script).arg("sh").arg(host().get_program()).args(args);
    run(&mut cmd)
}

const GIB: u64 = 1 << 30;

#[test]
fn inspect_of_a_4_gib_blob_reads_its_header_not_its_engine() {
    let dir = tempfile::tempdir().expect("temp dir");
    // The TR02 fixture with its engine_size (bytes 16..24) saying 4 GiB, and the file as long as that
    // (sparse: no disk is written).
    let mut bytes = std::fs::read(fixture("tr02_kv_cache.blob")).expect("fixture");
    let engine_offset = 512;
    bytes[16..24].copy_from_slice(&(4 * GIB).to_le_bytes());
    let path = dir.path().join("big.blob");
    std::fs::write(&path, &bytes).expect("write");
    let file = std::fs::File::options().write(true).open(&path).expect("open");
    file.set_len(engine_offset + 4 * GIB).expect("sparse");

    let out = host_within(256, &["inspect".as_ref(), "--json".as_ref(), path.as_os_str()]);
    let json = stdout_json(&out);
    assert_eq!((json["engine_offset"].as_u64(), json["engine_size"].as_u64()), (Some(512), Some(4 * GIB)));
    assert_eq!(json["outputs"], serde_json::json!(["k_cache_out", "logits"]));
    let text = host_within(256, &["inspect".as_ref(), path.as_os_str()]);
    assert!(text.status.success(), "{}", String::from_utf8_lossy(&text.stderr));
    assert!(String::from_utf8_lossy(&text.stdout).contains("(4294967296 bytes at offset 512)"));
    // Loading still reads the whole blob, into owned memory: under the same limit it fails, naming the file.
    let line = one_line_error(&host_within(256, &["validate".as_ref(), path.as_os_str()]));
    assert!(line.contains("big.blob") && line.contains("cannot allocate"), "{line}");
}

#[test]
fn inspect_of_a_4_gib_program_reads_its_program_data_and_blob_headers() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("big.pte");
    std::fs::copy(pte_fixture("kv_decoder.pte"), &path).expect("copy");
    let small = stdout_json(&run(host().args(["inspect", "--json"]).arg(&path)));
    std::fs::File::options().write(true).open(&path).and_then(|f| f.set_len(4 * GIB)).expect("sparse");
    let big = stdout_json(&host_within(256, &["inspect".as_ref(), "--json".as_ref(), path.as_os_str()]));
    assert_eq!(big, small, "the same program, its segments and blobs, read from the first bytes only");
    assert!(big["methods"][0]["delegate_calls"][0]["blob"]["engine_size"].as_u64() > Some(0), "{big}");
}

#[test]
fn a_blob_linked_out_of_the_program_directory_is_one_error_line_unless_allowed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let program = dir.path().join("program");
    std::fs::create_dir(&program).expect("mkdir");
    kv_example::export::reference(&kv_example::Config::tiny(), &program).expect("export");
    std::fs::rename(program.join("decode.blob"), dir.path().join("elsewhere.blob")).expect("move out");
    std::os::unix::fs::symlink("../elsewhere.blob", program.join("decode.blob")).expect("symlink");
    let manifest = program.join("program.toml");
    let line = one_line_error(&run(host().args(["run", "--steps", "2"]).arg(&manifest)));
    let blob = program.join("decode.blob");
    assert!(line.contains(&format!("cannot read blob {}: it leads outside", blob.display())), "{line}");
    assert!(line.contains("--allow-outside-blobs") && line.ends_with("[AccessFailed]"), "{line}");
    let out = run(host().args(["run", "--steps", "2", "--allow-outside-blobs"]).arg(&manifest));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_fifo_in_place_of_a_blob_is_refused_at_once_naming_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    kv_example::export::reference(&kv_example::Config::tiny(), dir.path()).expect("export");
    let blob = dir.path().join("decode.blob");
    std::fs::remove_file(&blob).expect("remove");
    let made = std::process::Command::new("mkfifo").arg(&blob).status().expect("mkfifo runs");
    assert!(made.success());
    // A blocked open would hang the command: it must end by itself, well within the limit.
    let mut child = host()
        .args(["run", "--steps", "2"])
        .arg(dir.path().join("program.toml"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starts");
    let start = std::time::Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if start.elapsed() > std::time::Duration::from_secs(60) {
            let _ = child.kill();
            panic!("`run` blocked on a FIFO in place of a blob");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let line = one_line_error(&child.wait_with_output().expect("output"));
    assert!(
        line.contains(&format!("cannot read blob {}: not a regular file (it is a FIFO)", blob.display())),
        "{line}"
    );
}

/// `delegate-host run DIR/program.toml --steps 2 --plugin-dir PLUGINS`, with no `DELEGATE_PLUGIN_PATH`.
fn two_steps_with_plugins(program: &std::path::Path, plugins: &std::path::Path) -> std::process::Command {
    let mut cmd = host();
    cmd.arg("run").arg(program.join("program.toml")).args(["--steps", "2", "--plugin-dir"]).arg(plugins);
    cmd.env_remove("DELEGATE_PLUGIN_PATH");
    cmd
}
