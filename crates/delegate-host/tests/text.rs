//! `run` with text in and out (issue 47): a BPE tokenizer trained here (byte-level, with multi-byte
//! characters) saved beside a copy of a committed Llama program (vocabulary 128), the prompt as text, the
//! reply streamed as text, stops at an end-of-sequence id or a `--stop` string, and sampling with a seed.

mod common;

use std::path::{Path, PathBuf};

use serde_json::Value;
use tokenizers::Tokenizer;

use common::stdout_json;

const VOCAB: usize = 128;

/// A byte-level BPE of exactly 128 ids (the program's vocabulary), with `<eos>` as id 0.
fn train() -> Tokenizer {
    text_gen::testing::train(VOCAB)
}

/// A directory with a copy of the Llama program and the trained tokenizer.json beside it.
fn program_dir() -> (tempfile::TempDir, PathBuf, Tokenizer) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = tempfile::tempdir().expect("temp dir");
    let program = dir.path().join("llama.pte");
    std::fs::copy(root.join("fixtures/executorch/real/llama_f32.pte"), &program).expect("copies the program");
    let tokenizer = train();
    tokenizer.save(dir.path().join("tokenizer.json"), false).expect("saves tokenizer.json");
    (dir, program, tokenizer)
}

fn run(program: &Path, args: &[&str]) -> std::process::Output {
    let mut cmd = common::host();
    cmd.env_remove("DELEGATE_PLUGIN_PATH").arg("run").arg(program).args(args);
    common::run(&mut cmd)
}

fn ids(value: &Value) -> Vec<i64> {
    value.as_array().expect("ids").iter().map(|v| v.as_i64().expect("an id")).collect()
}

fn encode(tokenizer: &Tokenizer, text: &str) -> Vec<i64> {
    tokenizer.encode(text, true).expect("encodes").get_ids().iter().map(|&id| i64::from(id)).collect()
}

fn joined(ids: &[i64]) -> String {
    ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
}

const PROMPT: &str = "héllo wörld 日本";

#[test]
fn a_text_prompt_is_the_tokenizers_ids_and_the_reply_is_their_text() {
    let (_dir, program, tokenizer) = program_dir();
    let prompt = encode(&tokenizer, PROMPT);
    let text = stdout_json(&run(&program, &["--prompt", PROMPT, "--max-new-tokens", "6", "--json"]));
    assert_eq!(ids(&text["prompt_ids"]), prompt, "{text}");
    let by_ids =
        stdout_json(&run(&program, &["--prompt-ids", &joined(&prompt), "--max-new-tokens", "6", "--json"]));
    assert_eq!(text["ids"], by_ids["ids"], "the same prompt, as text or ids, gives the same tokens");
    let reply = ids(&text["ids"]);
    assert_eq!(reply.len(), 6, "--max-new-tokens 6: {text}");
    let reply_u32: Vec<u32> = reply.iter().map(|&id| u32::try_from(id).expect("an id")).collect();
    assert_eq!(text["text"], tokenizer.decode(&reply_u32, true).expect("decodes"), "{text}");
    assert!(text["time_to_first_token_ms"].as_f64().is_some_and(|t| t > 0.0), "{text}");
    assert!(text["tokens_per_s"].as_f64().is_some_and(|r| r > 0.0), "{text}");
    assert_eq!(text["stop"], "length");
    // What streaming measured: every token, on the host loop here (a CPU program), the lag.
    let stream = &text["stats"]["stream"];
    assert_eq!(stream["tokens"], 6, "{text}");
    assert_eq!(
        (text["stats"]["device_loop"].as_bool(), stream["sampled_on_device"].as_bool()),
        (Some(false), Some(false))
    );
    assert!(stream["mean_lag_us"].as_f64().is_some_and(|us| us >= 0.0), "{text}");
    assert_eq!(stream["max_lag_tokens"], 0, "the host loop runs no step ahead: {text}");

    // Streamed: the same text on stdout, then a newline; the summary on stderr.
    let out = run(&program, &["--prompt", PROMPT, "--max-new-tokens", "6"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        String::from_utf8(out.stdout).expect("utf-8"),
        format!("{}\n", text["text"].as_str().expect("text"))
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("time to first token"));
}

#[test]
fn greedy_text_runs_give_the_argmax_tokens_of_an_id_run() {
    let (_dir, program, tokenizer) = program_dir();
    let prompt = joined(&encode(&tokenizer, PROMPT));
    let text = stdout_json(&run(&program, &["--prompt", PROMPT, "--steps", "5", "--json"]));
    // The same program without a tokenizer beside it: today's argmax run.
    let plain = program.with_file_name("plain").join("llama.pte");
    std::fs::create_dir(plain.parent().expect("dir")).expect("dir");
    std::fs::copy(&program, &plain).expect("copies");
    let argmax = stdout_json(&run(&plain, &["--prompt", &prompt, "--steps", "5", "--json"]));
    assert_eq!(text["ids"], argmax["tokens"]);
}

#[test]
fn an_end_of_sequence_id_of_generation_config_ends_the_run() {
    let (dir, program, _) = program_dir();
    let first = stdout_json(&run(&program, &["--prompt", PROMPT, "--max-new-tokens", "8", "--json"]));
    let all = ids(&first["ids"]);
    // The third token as the checkpoint's end of sequence (a list, as Llama 3's config gives).
    let eos = all[2];
    let first_eos = all.iter().position(|&id| id == eos).expect("present");
    std::fs::write(dir.path().join("generation_config.json"), format!("{{\"eos_token_id\": [999, {eos}]}}"))
        .expect("writes");
    let stopped = stdout_json(&run(&program, &["--prompt", PROMPT, "--max-new-tokens", "8", "--json"]));
    assert_eq!(stopped["stop"], "eos", "{stopped}");
    assert_eq!(ids(&stopped["ids"]), all[..=first_eos], "ends at the end-of-sequence id");
    // One id, as most configs give.
    std::fs::write(dir.path().join("generation_config.json"), format!("{{\"eos_token_id\": {eos}}}"))
        .expect("writes");
    let stopped = stdout_json(&run(&program, &["--prompt", PROMPT, "--max-new-tokens", "8", "--json"]));
    assert_eq!(ids(&stopped["ids"]), all[..=first_eos]);
    // A config that is not one is named.
    std::fs::write(dir.path().join("generation_config.json"), "{\"eos_token_id\": \"x\"}").expect("writes");
    let err = common::one_line_error(&run(&program, &["--prompt", PROMPT]));
    assert!(err.contains("generation_config.json: eos_token_id \"x\" is neither"), "{err}");
}

#[test]
fn a_stop_string_ends_the_run_and_is_not_printed() {
    let (_dir, program, _) = program_dir();
    let full = stdout_json(&run(&program, &["--prompt", PROMPT, "--max-new-tokens", "12", "--json"]));
    let text = full["text"].as_str().expect("text").to_owned();
    // A stop string from the middle of the reply: two characters starting at its third character.
    let chars: Vec<char> = text.chars().collect();
    assert!(chars.len() >= 6, "a reply long enough to cut: {text:?}");
    let stop: String = chars[3..5].iter().collect();
    let before = &text[..text.find(&stop).expect("present")];
    let out = run(&program, &["--prompt", PROMPT, "--max-new-tokens", "12", "--stop", &stop]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        String::from_utf8(out.stdout).expect("utf-8"),
        format!("{before}\n"),
        "stop {stop:?} in {text:?}"
    );
    let json = stdout_json(&run(
        &program,
        &["--prompt", PROMPT, "--max-new-tokens", "12", "--stop", &stop, "--json"],
    ));
    assert_eq!(json["stop"], "stop_string");
    assert_eq!(json["text"], before);
}

#[test]
fn sampling_with_a_seed_reproduces_and_another_seed_differs() {
    let (_dir, program, _) = program_dir();
    let sampled = |seed: &str| {
        let args =
            ["--prompt", PROMPT, "--max-new-tokens", "16", "--temperature", "5", "--seed", seed, "--json"];
        ids(&stdout_json(&run(&program, &args))["ids"])
    };
    assert_eq!(sampled("1"), sampled("1"));
    assert_ne!(sampled("1"), sampled("2"));
    let greedy = stdout_json(&run(&program, &["--prompt", PROMPT, "--max-new-tokens", "16", "--json"]));
    assert_ne!(ids(&greedy["ids"]), sampled("1"), "a hot temperature leaves the argmax");
    let err = common::one_line_error(&run(&program, &["--prompt", PROMPT, "--top-p", "0"]));
    assert!(err.contains("--top-p 0: must be in (0, 1]") && err.ends_with("[InvalidArgument]"), "{err}");
}

#[test]
fn a_text_prompt_without_a_tokenizer_is_named() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let program = root.join("fixtures/executorch/real/llama_f32.pte");
    let err = common::one_line_error(&run(&program, &["--prompt", "Hello"]));
    assert!(err.contains("--prompt: \"Hello\" is not a token id, and no tokenizer.json"), "{err}");
    let err = common::one_line_error(&run(&program, &["--prompt", "1,2", "--stop", "x"]));
    assert!(err.contains("--stop ends the reply at a text, but there is no tokenizer"), "{err}");
}

#[test]
fn tokenizer_names_a_tokenizer_json_anywhere_and_a_bad_one_is_named() {
    let (dir, program, tokenizer) = program_dir();
    let elsewhere = dir.path().join("plain");
    std::fs::create_dir(&elsewhere).expect("dir");
    let plain = elsewhere.join("llama.pte");
    std::fs::copy(&program, &plain).expect("copies");
    let file = dir.path().join("tokenizer.json");
    let file = file.to_str().expect("utf-8 path");
    let json =
        stdout_json(&run(&plain, &["--tokenizer", file, "--prompt", PROMPT, "--steps", "2", "--json"]));
    assert_eq!(ids(&json["prompt_ids"]), encode(&tokenizer, PROMPT), "{json}");
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{}").expect("writes");
    let bad = bad.to_str().expect("utf-8 path");
    let err = common::one_line_error(&run(&plain, &["--tokenizer", bad, "--prompt", PROMPT]));
    assert!(err.contains("bad.json: not a tokenizer.json the tokenizers library reads"), "{err}");
    assert!(err.ends_with("[InvalidArgument]"), "{err}");
}

/// ChatML (Qwen2's form, with Python's `.strip()`), in a `tokenizer_config.json` beside the tokenizer.
const CHATML: &str = "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'].strip() + \
                      '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}\
                      {% endif %}";

#[test]
fn chat_renders_the_checkpoints_template_and_feeds_its_ids_without_added_special_tokens() {
    let (dir, program, tokenizer) = program_dir();
    let config = serde_json::json!({ "chat_template": CHATML, "eos_token": "<eos>" });
    std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).expect("writes the config");
    let args =
        ["--chat", "--system", "Be brief.", "--user", " héllo 日本 ", "--max-new-tokens", "4", "--json"];
    let json = stdout_json(&run(&program, &args));
    let rendered =
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhéllo 日本<|im_end|>\n<|im_start|>assistant\n";
    let expected: Vec<i64> = tokenizer
        .encode(rendered, false)
        .expect("encodes")
        .get_ids()
        .iter()
        .map(|&id| i64::from(id))
        .collect();
    assert_eq!(ids(&json["prompt_ids"]), expected, "{json}");
    assert_eq!(ids(&json["ids"]).len(), 4, "{json}");

    // Without a template, or with one that raises, one line naming the file.
    std::fs::write(dir.path().join("tokenizer_config.json"), "{}").expect("writes the config");
    let out = run(&program, &["--chat", "--user", "hi"]);
    let line = common::one_line_error(&out);
    assert!(line.contains("tokenizer_config.json: it has no chat_template"), "{line}");
    let raises = serde_json::json!({ "chat_template": "{{ raise_exception('System role not supported') }}" });
    std::fs::write(dir.path().join("tokenizer_config.json"), raises.to_string()).expect("writes the config");
    let line = common::one_line_error(&run(&program, &["--chat", "--user", "hi"]));
    assert!(line.contains("System role not supported") && line.ends_with("[InvalidArgument]"), "{line}");
}

/// `run --chat --interactive` with `turns` piped to stdin (one per line) and `args`.
fn converse(program: &Path, turns: &str, args: &[&str]) -> std::process::Output {
    use std::io::Write;
    let mut cmd = common::host();
    cmd.env_remove("DELEGATE_PLUGIN_PATH")
        .arg("run")
        .arg(program)
        .args(["--chat", "--interactive"])
        .args(args);
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("delegate-host starts");
    child.stdin.take().expect("stdin").write_all(turns.as_bytes()).expect("writes the turns");
    child.wait_with_output().expect("delegate-host ends")
}

#[test]
fn an_interactive_chat_feeds_only_each_new_turn_and_keeps_the_conversation_in_the_caches() {
    let (dir, program, _) = program_dir();
    // A terse template: two turns and their replies fit the program's 64 positions.
    let terse =
        "{% for m in messages %}{{ m['role'][0] + ':' + m['content'] + '\\n' }}{% endfor %}{{ 'a:' }}";
    let config = serde_json::json!({ "chat_template": terse });
    std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).expect("writes the config");
    let args = ["--system", "héllo", "--max-new-tokens", "4", "--json"];
    let out = converse(&program, "日本\n\nthe fox\n", &args);
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let turns: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per turn"))
        .collect();
    assert_eq!(turns.len(), 2, "an empty line is no turn: {turns:?}");
    let (first, second) = (&turns[0], &turns[1]);
    let (p1, p2) = (ids(&first["prompt_ids"]), ids(&second["prompt_ids"]));
    assert_eq!((first["kept"].as_u64(), first["fed"].as_u64()), (Some(0), Some(p1.len() as u64)), "{first}");
    // The second turn's conversation holds the first turn and its reply: the caches kept at least the first
    // turn's tokens, and only the rest was fed.
    assert_eq!(&p2[..p1.len()], &p1[..], "{second}");
    let kept = second["kept"].as_u64().expect("kept") as usize;
    assert!(kept >= p1.len(), "the first turn was fed again: {second}");
    assert_eq!(second["fed"].as_u64(), Some((p2.len() - kept) as u64), "{second}");
    assert_eq!(ids(&second["ids"]).len(), 4, "{second}");
    assert!(second["time_to_first_token_ms"].as_f64().is_some() && second["tokens_per_s"].as_f64().is_some());

    // The kept caches are the conversation's: the replies are those of runs fed each whole conversation.
    for turn in [first, second] {
        let prompt = joined(&ids(&turn["prompt_ids"]));
        let whole =
            stdout_json(&run(&program, &["--prompt-ids", &prompt, "--max-new-tokens", "4", "--json"]));
        assert_eq!(ids(&whole["ids"]), ids(&turn["ids"]), "{turn}");
    }

    // A program of the same weights with a `prefill` method of 3 tokens a call: each turn's new tokens go
    // through it in chunks, and the replies are the same.
    let chunked = dir.path().join("prefill");
    std::fs::create_dir(&chunked).expect("mkdir");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    std::fs::copy(root.join("fixtures/executorch/prefill/llama_f32.pte"), chunked.join("llama.pte"))
        .expect("copies");
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(dir.path().join(file), chunked.join(file)).expect("copies");
    }
    let out = converse(&chunked.join("llama.pte"), "日本\n\nthe fox\n", &args);
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let replies: Vec<Vec<i64>> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| ids(&serde_json::from_str::<Value>(l).expect("a turn")["ids"]))
        .collect();
    assert_eq!(replies, [ids(&first["ids"]), ids(&second["ids"])]);

    // Streamed: each reply's text on its line, a stats line per turn on stderr naming what was fed.
    let out = converse(&program, "日本\nthe fox\n", &args[..4]);
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stats: Vec<&str> = stderr.lines().filter(|l| l.starts_with("fed ")).collect();
    assert_eq!(stats.len(), 2, "{stderr}");
    assert!(stats[1].contains(&format!("({kept} kept in the caches)")), "{stderr}");
}

#[test]
fn interactive_without_chat_or_with_a_position_is_refused_in_one_line() {
    let (_dir, program, _) = program_dir();
    let line = common::one_line_error(&run(&program, &["--interactive"]));
    assert!(line.contains("--chat"), "{line}");
    let line = common::one_line_error(&converse(&program, "hi\n", &["--position", "3"]));
    assert!(line.contains("--interactive runs a conversation on the host loop"), "{line}");
}
