//! `et-run` with text, chat and sampling (issue 47), inside ExecuTorch's own runtime: a BPE tokenizer trained
//! here (byte-level, multi-byte characters) beside a copy of a committed Llama program (vocabulary 128), the
//! prompt as text, the reply streamed as text, the checkpoint's chat template, the sampler of `delegate-host
//! run` (a seed reproduces, its first draw is `sampling::Sampler`'s over the prompt's logits), and the stops:
//! an end-of-sequence id of `generation_config.json`, a `--stop` string, `--max-new-tokens`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sampling::{Params, Sampler};
use serde_json::Value;
use tokenizers::Tokenizer;

const PROMPT: &str = "héllo wörld 日本";
const CHATML: &str =
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}\
                      {% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// The committed Llama program, no tokenizer beside it.
fn committed() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/executorch/real/llama_f32.pte")
}

/// A directory with a copy of the Llama program and the trained tokenizer.json beside it.
fn program_dir() -> (tempfile::TempDir, PathBuf, Tokenizer) {
    let dir = tempfile::tempdir().expect("temp dir");
    let program = dir.path().join("llama.pte");
    std::fs::copy(committed(), &program).expect("copies the program");
    let tokenizer = text_gen::testing::train(128);
    tokenizer.save(dir.path().join("tokenizer.json"), false).expect("saves tokenizer.json");
    (dir, program, tokenizer)
}

fn et_run(program: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_et-run"))
        .arg(program)
        .args(args)
        .env_remove("DELEGATE_PLUGIN_PATH")
        .output()
        .expect("et-run runs")
}

fn json(out: &Output) -> Value {
    assert!(out.status.success(), "exit {:?}, stderr: {}", out.status, String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON value")
}

fn one_line_error(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(2), "stdout: {}", String::from_utf8_lossy(&out.stdout));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    stderr.trim_end().to_owned()
}

fn ids(value: &Value) -> Vec<i64> {
    value.as_array().expect("ids").iter().map(|v| v.as_i64().expect("an id")).collect()
}

fn joined(ids: &[i64]) -> String {
    ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
}

fn encode(tokenizer: &Tokenizer, text: &str, special: bool) -> Vec<i64> {
    tokenizer.encode(text, special).expect("encodes").get_ids().iter().map(|&id| i64::from(id)).collect()
}

fn decode(tokenizer: &Tokenizer, ids: &[i64]) -> String {
    let ids: Vec<u32> = ids.iter().map(|&id| u32::try_from(id).expect("an id")).collect();
    tokenizer.decode(&ids, true).expect("decodes")
}

#[test]
fn a_text_prompt_is_the_tokenizers_ids_and_the_reply_is_streamed_as_their_text() {
    let (_dir, program, tokenizer) = program_dir();
    let report = json(&et_run(&program, &["--prompt", PROMPT, "--max-new-tokens", "6", "--json"]));
    assert_eq!(ids(&report["prompt_ids"]), encode(&tokenizer, PROMPT, true), "{report}");
    let reply = ids(&report["ids"]);
    assert_eq!((reply.len(), report["stop"].as_str()), (6, Some("length")), "{report}");
    assert_eq!(report["text"].as_str(), Some(decode(&tokenizer, &reply).as_str()), "{report}");
    assert!(report["time_to_first_token_ms"].as_f64().is_some(), "{report}");

    // Greedy text is the argmax run of the same ids (the program without a tokenizer beside it: token ids in
    // and out), and streamed it prints that text.
    let plain = et_run(&committed(), &["--prompt-ids", &joined(&ids(&report["prompt_ids"])), "--steps", "5"]);
    let stdout = String::from_utf8_lossy(&plain.stdout);
    assert!(stdout.starts_with(&format!("tokens: {}\n", joined(&reply).replace(',', " "))), "{stdout}");
    let streamed = et_run(&program, &["--prompt", PROMPT, "--max-new-tokens", "6"]);
    assert!(streamed.status.success(), "{}", String::from_utf8_lossy(&streamed.stderr));
    assert_eq!(String::from_utf8_lossy(&streamed.stdout), format!("{}\n", decode(&tokenizer, &reply)));
    let stderr = String::from_utf8_lossy(&streamed.stderr);
    assert!(stderr.starts_with("6 tokens (stop: length), time to first token "), "{stderr}");
}

#[test]
fn sampling_draws_the_samplers_tokens_and_a_seed_reproduces() {
    let (_dir, program, _) = program_dir();
    let args = |seed: &'static str| {
        ["--prompt-ids", "1,7,3,12", "--temperature", "1.5", "--top-k", "20", "--seed", seed, "--steps", "7"]
    };
    let run = |seed| ids(&json(&et_run(&program, &[&args(seed)[..], &["--json"]].concat()))["ids"]);
    let first = run("5");
    assert_eq!(first.len(), 8);
    assert_eq!(run("5"), first, "a seed reproduces");
    assert!(["6", "7", "8", "9"].into_iter().any(|seed| run(seed) != first), "other seeds draw otherwise");
    // The first draw is the sampler's over the prompt's logits (those of the greedy run's report).
    let greedy = json(&et_run(&committed(), &["--prompt-ids", "1,7,3,12", "--steps", "0", "--json"]));
    let row: Vec<f32> = greedy["logits"][0]
        .as_array()
        .expect("logits")
        .iter()
        .map(|v| v.as_f64().expect("a logit") as f32)
        .collect();
    let sampler = Sampler::new(Params { temperature: 1.5, top_k: 20, seed: 5, ..Params::default() })
        .expect("valid parameters");
    assert_eq!(first[0], sampler.pick(&row, &[1, 7, 3, 12], 0) as i64);
}

#[test]
fn an_eos_id_of_generation_config_and_a_stop_string_end_the_reply() {
    let (dir, program, tokenizer) = program_dir();
    let greedy =
        ids(&json(&et_run(&program, &["--prompt", PROMPT, "--max-new-tokens", "8", "--json"]))["ids"]);
    let config = serde_json::json!({ "eos_token_id": [9999, greedy[2]] });
    std::fs::write(dir.path().join("generation_config.json"), config.to_string()).expect("writes the config");
    let report = json(&et_run(&program, &["--prompt", PROMPT, "--max-new-tokens", "8", "--json"]));
    assert_eq!(
        (ids(&report["ids"]), report["stop"].as_str()),
        (greedy[..3].to_vec(), Some("eos")),
        "{report}"
    );
    assert_eq!(report["text"].as_str(), Some(decode(&tokenizer, &greedy[..2]).as_str()), "{report}");

    std::fs::remove_file(dir.path().join("generation_config.json")).expect("removes the config");
    let text = decode(&tokenizer, &greedy);
    let stop: String = text.chars().skip(2).take(2).collect();
    let report =
        json(&et_run(&program, &["--prompt", PROMPT, "--max-new-tokens", "8", "--stop", &stop, "--json"]));
    let printed = report["text"].as_str().expect("text");
    assert_eq!(report["stop"].as_str(), Some("stop_string"), "{report}");
    assert!(!printed.contains(&stop) && text.starts_with(printed), "{report}");
}

#[test]
fn chat_renders_the_checkpoints_template_and_feeds_its_ids() {
    let (dir, program, tokenizer) = program_dir();
    let config = serde_json::json!({ "chat_template": CHATML });
    std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).expect("writes the config");
    let args = ["--chat", "--system", "Be brief.", "--user", "héllo 日本", "--max-new-tokens", "3", "--json"];
    let report = json(&et_run(&program, &args));
    let rendered = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhéllo 日本<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(ids(&report["prompt_ids"]), encode(&tokenizer, rendered, false), "{report}");
    assert_eq!(ids(&report["ids"]).len(), 3, "{report}");
}

#[test]
fn text_options_without_a_tokenizer_and_bad_sampling_options_are_one_line() {
    let program = committed();
    let line = one_line_error(&et_run(&program, &["--prompt", "Hello"]));
    assert!(line.contains("\"Hello\" is not a token id") && line.ends_with("[InvalidArgument]"), "{line}");
    let line = one_line_error(&et_run(&program, &["--stop", "x"]));
    assert!(line.contains("--stop ends the reply at a text, but there is no tokenizer"), "{line}");
    let line = one_line_error(&et_run(&program, &["--chat", "--user", "hi"]));
    assert!(line.contains("--chat needs the model's tokenizer"), "{line}");
    let line = one_line_error(&et_run(&program, &["--top-p", "1.5"]));
    assert_eq!(line, "error: --top-p 1.5: must be in (0, 1] [InvalidArgument]");
}
