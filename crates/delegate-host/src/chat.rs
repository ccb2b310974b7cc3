//! `run --chat`: the conversation rendered with the checkpoint's own chat template, as Hugging Face's
//! `apply_chat_template` and text-generation servers render it: `tokenizer_config.json`'s `chat_template` (a
//! Jinja template; a list of named templates picks `default`) over `messages` (`{role, content}`: an optional
//! `system` turn, then the `user` turn), with `add_generation_prompt` true and the config's `bos_token` /
//! `eos_token`. Rendered by minijinja with Python's string methods (`.strip()`, `.startswith()`, ...), and
//! `raise_exception(msg)` failing the render with the template's own message.
//!
//! The rendered text holds the template's special tokens (a BOS among them), so it is encoded without the
//! tokenizer adding its own.

use std::path::{Path, PathBuf};

use et_error::ErrorCode;
use host_runtime::blob_file::BlobFile;
use minijinja::{context, Environment, Error as JinjaError, ErrorKind};
use serde_json::Value;

use crate::Failure;

/// The file a Hugging Face checkpoint keeps its chat template in.
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";

/// One turn of the conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: &'static str,
    /// What was said.
    pub content: String,
}

/// The conversation `--system` and `--user` give.
pub fn messages(system: Option<String>, user: String) -> Vec<Message> {
    let system = system.map(|content| Message { role: "system", content });
    system.into_iter().chain([Message { role: "user", content: user }]).collect()
}

/// A checkpoint's chat template and the special tokens it refers to.
#[derive(Debug)]
pub struct ChatTemplate {
    source: String,
    bos_token: String,
    eos_token: String,
    path: PathBuf,
}

impl ChatTemplate {
    /// The template in `tokenizer_config.json` at `path`.
    pub fn load(path: &Path) -> Result<ChatTemplate, Failure> {
        let bytes = BlobFile::open(path).map_err(|err| {
            let code = match err.kind() {
                std::io::ErrorKind::NotFound => ErrorCode::NotFound,
                _ => ErrorCode::AccessFailed,
            };
            Failure::coded(code, format!("--chat: {}: {err}", path.display()))
        })?;
        let config: Value = serde_json::from_slice(bytes.bytes())
            .map_err(|err| invalid(path, &format!("not JSON: {err}")))?;
        ChatTemplate::from_config(&config, path)
    }

    /// The template of a parsed `tokenizer_config.json` (`path` names it in errors).
    pub fn from_config(config: &Value, path: &Path) -> Result<ChatTemplate, Failure> {
        let source = template_source(config.get("chat_template")).ok_or_else(|| {
            invalid(path, "it has no chat_template (a string, or a list with one named default)")
        })?;
        Ok(ChatTemplate {
            source,
            bos_token: token_text(config.get("bos_token")),
            eos_token: token_text(config.get("eos_token")),
            path: path.to_owned(),
        })
    }

    /// The conversation as the model was trained to see it, ending where the assistant's reply begins.
    pub fn render(&self, messages: &[Message]) -> Result<String, Failure> {
        let mut env = Environment::new();
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |message: String| -> Result<String, JinjaError> {
            Err(JinjaError::new(ErrorKind::InvalidOperation, message))
        });
        let fail = |err: JinjaError| invalid(&self.path, &format!("its chat_template: {}", describe(&err)));
        let template = env.template_from_str(&self.source).map_err(fail)?;
        template
            .render(context! {
                messages => messages
                    .iter()
                    .map(|m| context! { role => m.role, content => &m.content })
                    .collect::<minijinja::Value>(),
                add_generation_prompt => true,
                bos_token => &self.bos_token,
                eos_token => &self.eos_token,
            })
            .map_err(fail)
    }
}

/// A render error in one line: its kind's words and the template's own message where it raised one.
fn describe(err: &JinjaError) -> String {
    let line = err.line().map(|l| format!(" (line {l})")).unwrap_or_default();
    match err.detail() {
        Some(detail) => format!("{detail}{line}"),
        None => format!("{}{line}", err.kind()),
    }
}

/// `chat_template` as `tokenizer_config.json` holds it: a string, or `[{name, template}, ...]` of which the
/// one named `default` is the chat template.
fn template_source(value: Option<&Value>) -> Option<String> {
    match value? {
        Value::String(source) => Some(source.clone()),
        Value::Array(named) => named.iter().find_map(|entry| {
            (entry.get("name")?.as_str()? == "default")
                .then(|| entry.get("template")?.as_str().map(str::to_owned))?
        }),
        _ => None,
    }
}

/// A special token as the config writes it: a string, or an added-token object with its `content`.
fn token_text(value: Option<&Value>) -> String {
    match value {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Object(token)) => {
            token.get("content").and_then(Value::as_str).unwrap_or_default().to_owned()
        }
        _ => String::new(),
    }
}

fn invalid(path: &Path, why: &str) -> Failure {
    Failure::coded(ErrorCode::InvalidArgument, format!("--chat: {}: {why}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ChatML as Qwen2 writes it (with Python's `.strip()`), and Llama 2's template raising for a bad order.
    const CHATML: &str = "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'].strip() + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
    const RAISES: &str = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversation roles must start with user') }}{% endif %}{{ bos_token }}[INST] {{ messages[0]['content'] }} [/INST]";

    fn template(source: &str) -> ChatTemplate {
        let config = serde_json::json!({
            "chat_template": source,
            "bos_token": {"content": "<s>", "lstrip": false},
            "eos_token": "</s>",
        });
        ChatTemplate::from_config(&config, Path::new("tokenizer_config.json")).ok().expect("a template")
    }

    #[test]
    fn a_conversation_renders_as_the_template_writes_it_ending_at_the_assistants_turn() {
        let text = template(CHATML).render(&messages(Some("Be brief.".into()), " Héllo 日本 ".into())).ok();
        assert_eq!(
            text.as_deref(),
            Some("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHéllo 日本<|im_end|>\n<|im_start|>assistant\n")
        );
        let llama = template(RAISES).render(&messages(None, "Hi".into())).ok();
        assert_eq!(llama.as_deref(), Some("<s>[INST] Hi [/INST]"), "bos_token from an added-token object");
    }

    #[test]
    fn a_template_that_raises_is_one_line_with_its_message() {
        let Err(err) = template(RAISES).render(&messages(Some("sys".into()), "Hi".into())) else {
            panic!("the template raises for a system turn first")
        };
        assert!(err.message.contains("Conversation roles must start with user"), "{}", err.message);
        assert!(!err.message.contains('\n'), "{}", err.message);
    }

    #[test]
    fn a_named_list_picks_default_and_a_config_without_a_template_is_named() {
        let named =
            serde_json::json!([{"name": "tool_use", "template": "x"}, {"name": "default", "template": "d"}]);
        assert_eq!(template_source(Some(&named)).as_deref(), Some("d"));
        let Err(err) = ChatTemplate::from_config(&serde_json::json!({}), Path::new("c.json")) else {
            panic!("no template")
        };
        assert!(err.message.contains("c.json: it has no chat_template"), "{}", err.message);
    }
}
