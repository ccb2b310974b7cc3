//! `delegate-host run` and `bench` over ExecuTorch programs (`.pte`) and `.npy` inputs and outputs, as users
//! run them: the oracle's tokens, bytes copied per decode step, one-line refusals, `.npy` round trips.

#[path = "../../host-runtime/tests/support/kv_pte.rs"]
mod kv_pte;

use std::path::{Path, PathBuf};
use std::process::Command;

use pte_format::testing::{InstructionSpec, ProgramSpec};
use serde_json::Value;

mod common;
use common::{one_line_error, run, stdout_json};

/// The binary without `DELEGATE_PLUGIN_PATH`, so the embedded reference delegate serves.
fn host() -> Command {
    let mut cmd = common::host();
    cmd.env_remove("DELEGATE_PLUGIN_PATH");
    cmd
}

fn write(dir: &Path, name: &str, spec: &ProgramSpec) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, spec.to_bytes()).expect("write");
    path
}

const PROMPT: &str = "1,7,3,12";
const STEPS: usize = 12;

/// The committed fixtures' expected tokens once the export lands them, else kv-example's oracle.
fn expected_tokens() -> Vec<i64> {
    let expected = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/executorch/expected.json");
    match std::fs::read(&expected) {
        Ok(bytes) => {
            let json: Value = serde_json::from_slice(&bytes).expect("expected.json");
            json["tokens"].as_array().expect("tokens").iter().map(|t| t.as_i64().expect("i64")).collect()
        }
        Err(_) => kv_pte::oracle_tokens(STEPS),
    }
}

fn run_pte(path: &Path, mode: &str) -> Value {
    stdout_json(&run(host().arg("run").arg(path).args([
        "--prompt",
        PROMPT,
        "--steps",
        &STEPS.to_string(),
        "--mode",
        mode,
        "--json",
    ])))
}

#[test]
fn a_pte_generates_the_oracle_tokens_copying_nothing_per_decode_step_in_zero_copy_mode() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cfg = kv_pte::config();
    let cache_bytes = (cfg.cache_len() * 4 * 2 * cfg.layers) as u64;
    for (name, two) in [("buffers_1m.pte", false), ("buffers_2m.pte", true)] {
        let path = write(dir.path(), name, &kv_pte::spec(two));
        let zero = run_pte(&path, "zero-copy");
        let tokens: Vec<i64> =
            zero["tokens"].as_array().expect("tokens").iter().map(|t| t.as_i64().expect("i64")).collect();
        assert_eq!(tokens, expected_tokens(), "{name}");
        assert_eq!(zero["stats"]["mean_decode_bytes_copied_total"], 0, "{name}: {}", zero["stats"]);
        let back = run_pte(&path, "copy-back");
        assert_eq!(back["tokens"], zero["tokens"], "{name}");
        let copies = &back["stats"]["mean_decode_bytes_copied"];
        assert_eq!(copies["writeback_bytes"], cache_bytes, "{name}: {copies}");
        assert_eq!(copies["reflect_bytes"], cache_bytes, "{name}: {copies}");
        assert_eq!(copies["op_bytes"], 0, "{name}: the logits clone is elided: {copies}");
        let steps = zero["steps"].as_array().expect("steps");
        assert_eq!(steps[0]["method"], if two { "prefill" } else { "forward" });
        assert_eq!(steps[1]["position"], cfg.prompt_len() as u64);
    }
}

#[test]
fn text_output_names_the_bytes_copied_per_decode_step_by_kind() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = write(dir.path(), "p.pte", &kv_pte::spec(true));
    let out =
        run(host().arg("run").arg(&path).args(["--prompt", PROMPT, "--steps", "3", "--mode", "copy-back"]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(
            "bytes copied per decode step: 8192 (reflect 4096, write-back 4096, staging 0, host ops 0)"
        ),
        "{text}"
    );
}

#[test]
fn bench_measures_a_pte_in_both_modes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = write(dir.path(), "p.pte", &kv_pte::spec(false));
    let json = stdout_json(&run(host()
        .arg("bench")
        .arg(&path)
        .args(["--prompt", PROMPT, "--steps", "4", "--runs", "2", "--json"])));
    let rows = json["modes"].as_array().expect("modes");
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["mode"], "zero-copy");
    assert_eq!(rows[0]["bytes_copied_per_step"], 0);
    assert_eq!(rows[1]["mode"], "copy-back");
    assert_eq!(rows[1]["writeback_bytes_per_step"], 4096);
    let line = one_line_error(&run(host().arg("bench").arg(&path)));
    assert!(line.contains("is not a token generator until given --prompt"), "{line}");
}

#[test]
fn a_non_delegated_operator_is_refused_before_running_naming_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut spec = kv_pte::spec(false);
    spec.methods[0].operators.push(("aten::mul".to_owned(), "out".to_owned()));
    spec.methods[0].instructions.insert(3, InstructionSpec::Kernel { op: 2, args: vec![6, 6, 6] });
    let path = write(dir.path(), "mul.pte", &spec);
    let line = one_line_error(&run(host().arg("run").arg(&path).args(["--prompt", PROMPT])));
    assert!(
        line.contains(
            "method 'forward' instruction 3 calls operator 'aten::mul.out', which delegate-host does not run"
        ),
        "{line}"
    );
    // Issue 46, item 5: a partly delegated program is refused pointing at the runtime that runs it.
    assert!(line.contains(&format!("et-run {}", path.display())), "{line}");
    assert!(line.ends_with("[NotSupported]"), "{line}");
}

#[test]
fn a_delegate_id_no_plugin_serves_is_named() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut spec = kv_pte::spec(true);
    spec.methods[1].delegates[0].id = "MysteryBackend".to_owned();
    let path = write(dir.path(), "unknown.pte", &spec);
    let line = one_line_error(&run(host().arg("run").arg(&path).args(["--prompt", PROMPT])));
    assert!(line.contains("method 'decode' instruction 0 calls backend 'MysteryBackend'"), "{line}");
    assert!(line.contains("ReferenceBackend") && line.ends_with("[NotFound]"), "{line}");
}

#[test]
fn truncated_and_corrupted_programs_are_one_error_line_and_exit_2() {
    let dir = tempfile::tempdir().expect("temp dir");
    let bytes = kv_pte::bytes(false);
    let cut = dir.path().join("cut.pte");
    std::fs::write(&cut, &bytes[..bytes.len() / 3]).expect("write");
    let line = one_line_error(&run(host().arg("run").arg(&cut).args(["--prompt", PROMPT])));
    assert!(line.contains("cut.pte") && line.ends_with("[InvalidProgram]"), "{line}");

    // The delegate payload's blob damaged inside an intact container.
    let mut corrupt = bytes.clone();
    let at = corrupt.len() - 64;
    corrupt[at..].iter_mut().for_each(|b| *b ^= 0xff);
    let path = dir.path().join("corrupt.pte");
    std::fs::write(&path, &corrupt).expect("write");
    one_line_error(&run(host().arg("run").arg(&path).args(["--prompt", PROMPT])));

    // Not a program at all, named .pte.
    let junk = dir.path().join("junk.pte");
    std::fs::write(&junk, b"not a program at all").expect("write");
    let line = one_line_error(&run(host().arg("run").arg(&junk)));
    assert!(line.contains("junk.pte"), "{line}");
}

fn write_npy_i64(path: &Path, values: &[i64], shape: &[u64]) {
    use npyz::WriterBuilder;
    let file = std::fs::File::create(path).expect("create");
    let mut writer =
        npyz::WriteOptions::new().default_dtype().shape(shape).writer(file).begin_nd().expect("npy");
    writer.extend(values.iter().copied()).expect("write");
    writer.finish().expect("finish");
}

fn read_npy_f32(path: &Path) -> (Vec<u64>, Vec<f32>) {
    let npy = npyz::NpyFile::new(std::fs::File::open(path).expect("open")).expect("npy");
    let shape = npy.shape().to_vec();
    (shape, npy.into_vec::<f32>().expect("f32"))
}

#[test]
fn inputs_and_outputs_round_trip_through_npy_for_a_manifest_and_a_pte() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cfg = kv_pte::config();
    kv_example::export::reference(&cfg, dir.path()).expect("export");
    let toml = dir.path().join("program.toml");
    let pte = write(dir.path(), "p.pte", &kv_pte::spec(false));
    let (tokens, pos) = (dir.path().join("tokens.npy"), dir.path().join("pos.npy"));
    write_npy_i64(&tokens, &[7], &[1]);
    write_npy_i64(&pos, &[0], &[1]);

    let toml_out = dir.path().join("toml_out");
    let json = stdout_json(&run(host().arg("run").arg(&toml).args(["--method", "decode", "--json"]).args([
        "--input".to_owned(),
        format!("tokens={}", tokens.display()),
        "--input".to_owned(),
        format!("input_pos={}", pos.display()),
        "--output-dir".to_owned(),
        toml_out.display().to_string(),
    ])));
    assert_eq!(json["method"], "decode");
    assert_eq!(json["bytes_copied_total"], 0);
    let pte_out = dir.path().join("pte_out");
    let json = stdout_json(&run(host().arg("run").arg(&pte).arg("--json").args([
        "--input".to_owned(),
        format!("0={}", tokens.display()),
        "--input".to_owned(),
        format!("1={}", pos.display()),
        "--output-dir".to_owned(),
        pte_out.display().to_string(),
    ])));
    assert_eq!(json["method"], "forward");
    assert_eq!(json["outputs"].as_array().map(Vec::len), Some(1), "internal values are not outputs: {json}");

    let (shape, toml_logits) = read_npy_f32(&toml_out.join("output.decode.logits.npy"));
    assert_eq!(shape, [1, cfg.vocab as u64]);
    let (shape, pte_logits) = read_npy_f32(&pte_out.join("output.forward.0.npy"));
    assert_eq!(shape, [1, cfg.vocab as u64]);
    assert!(toml_logits.iter().any(|&v| v != 0.0));
    assert_eq!(toml_logits, pte_logits, "the same blob over the same inputs");
    let next =
        npyz::NpyFile::new(std::fs::File::open(toml_out.join("output.decode.next_token.npy")).expect("open"))
            .expect("npy")
            .into_vec::<i64>()
            .expect("i64");
    assert_eq!(next, [kv_example::argmax(&toml_logits) as i64]);
    for cache in ["k_cache_0", "v_cache_0"] {
        let (shape, from_toml) = read_npy_f32(&toml_out.join(format!("buffer.{cache}.npy")));
        assert_eq!(shape, cfg.cache_shape().map(|d| d as u64));
        let (_, from_pte) = read_npy_f32(&pte_out.join(format!("buffer.{cache}.npy")));
        assert!(from_toml.iter().any(|&v| v != 0.0), "position 0 was written");
        assert_eq!(from_toml, from_pte, "{cache}");
    }
    assert!(!pte_out.join("output.forward.%v7.npy").exists());
}

#[test]
fn a_bad_npy_input_is_one_error_line_naming_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pte = write(dir.path(), "p.pte", &kv_pte::spec(false));
    let wrong_dtype = dir.path().join("f32.npy");
    npyz::to_file_1d(&wrong_dtype, vec![7.0f32]).expect("npy");
    let wrong_shape = dir.path().join("two.npy");
    write_npy_i64(&wrong_shape, &[7, 8], &[2]);
    let good = dir.path().join("good.npy");
    write_npy_i64(&good, &[7], &[1]);

    let line = one_line_error(&run(host()
        .arg("run")
        .arg(&pte)
        .arg("--input")
        .arg(format!("0={}", wrong_dtype.display()))));
    assert!(line.contains(&format!("--input 0={}", wrong_dtype.display())), "{line}");
    assert!(
        line.contains("holds <f4 [1], but input '0' of method 'forward' is <i8 [1]")
            && line.ends_with("[InvalidArgument]"),
        "{line}"
    );

    let line = one_line_error(&run(host()
        .arg("run")
        .arg(&pte)
        .arg("--input")
        .arg(format!("0={}", wrong_shape.display()))));
    assert!(line.contains("holds <i8 [2], but input '0' of method 'forward' is <i8 [1]"), "{line}");

    let line = one_line_error(&run(host()
        .arg("run")
        .arg(&pte)
        .arg("--input")
        .arg(format!("tokens={}", good.display()))));
    assert!(line.contains("method 'forward' has no input 'tokens' (its inputs: 0, 1)"), "{line}");

    let missing = dir.path().join("missing.npy");
    let line = one_line_error(&run(host()
        .arg("run")
        .arg(&pte)
        .arg("--input")
        .arg(format!("1={}", missing.display()))));
    assert!(line.contains("missing.npy") && line.ends_with("[AccessFailed]"), "{line}");

    let line = one_line_error(&run(host().arg("run").arg(&pte).args(["--input", "no-equals-sign"])));
    assert!(line.contains("'no-equals-sign' is not NAME=FILE.npy"), "{line}");

    let line = one_line_error(&run(host().arg("run").arg(&pte).args(["--method", "decode"])));
    assert!(line.contains("no method 'decode' (its methods: forward)"), "{line}");
}

/// The export's committed fixtures (`fixtures/executorch/`, the issue 9 contract): every program generates
/// torch eager's tokens in both modes, zero-copy copies nothing per decode step where the caches are program
/// buffers, and the last decode step's logits are torch's within 1e-4.
#[test]
fn the_committed_executorch_fixtures_generate_torch_eager_tokens() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/executorch");
    let bytes = std::fs::read(fixtures.join("expected.json"))
        .expect("fixtures/executorch/expected.json is committed");
    let expected: Value = serde_json::from_slice(&bytes).expect("expected.json");
    let prompt: Vec<String> =
        expected["prompt"].as_array().expect("prompt").iter().map(|t| t.to_string()).collect();
    let steps = expected["steps"].as_u64().expect("steps");
    let (shape, logits) = read_npy_f32(&fixtures.join(expected["logits"].as_str().expect("logits file")));
    let vocab = shape[1] as usize;
    let last = &logits[steps as usize * vocab..(steps as usize + 1) * vocab];
    let dir = tempfile::tempdir().expect("temp dir");
    let programs = expected["programs"].as_object().expect("programs");
    assert!(!programs.is_empty());
    for (file, info) in programs {
        for mode in ["zero-copy", "copy-back"] {
            let out = dir.path().join(format!("{file}-{mode}"));
            let json = stdout_json(&run(host()
                .arg("run")
                .arg(fixtures.join(file))
                .args([
                    "--prompt",
                    &prompt.join(","),
                    "--steps",
                    &steps.to_string(),
                    "--mode",
                    mode,
                    "--json",
                ])
                .arg("--output-dir")
                .arg(&out)));
            assert_eq!(json["tokens"], expected["tokens"], "{file} in {mode} mode");
            if mode == "zero-copy" && info["design"] == "buffers" {
                assert_eq!(json["stats"]["mean_decode_bytes_copied_total"], 0, "{file}: {}", json["stats"]);
            }
            let decode =
                info["methods"].as_array().and_then(|m| m.last()).and_then(Value::as_str).expect("methods");
            let (_, ours) = read_npy_f32(&out.join(format!("output.{decode}.0.npy")));
            let worst = ours.iter().zip(last).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            assert!(worst <= 1e-4, "{file} in {mode} mode: last logits differ from torch's by {worst}");
        }
    }
}
