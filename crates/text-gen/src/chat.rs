//! Chat: the conversation rendered with the checkpoint's own chat template, as Hugging Face's
//! `apply_chat_template` and text-generation servers render it: the checkpoint's template (`chat_template.jinja`
//! beside `tokenizer_config.json`, where transformers 4.48 and later save it, else the config's `chat_template`:
//! a Jinja template, or a list of named templates of which `default` is picked) over `messages` (`{role, content}`: an optional
//! `system` turn, then the `user` turn), with `add_generation_prompt` true and the config's `bos_token` /
//! `eos_token`. Rendered by minijinja with Python's string methods (`.strip()`, `.startswith()`, ...), and
//! `raise_exception(msg)` failing the render with the template's own message.
//!
//! The rendered text holds the template's special tokens (a BOS among them), so it is encoded without the
//! tokenizer adding its own.

use std::path::{Path, PathBuf};

use minijinja::{context, Environment, Error as JinjaError, ErrorKind};
use serde_json::Value;

use crate::TextError;

/// The file a Hugging Face checkpoint keeps its tokenizer's settings in: the special tokens, and the chat template
/// in checkpoints saved before transformers 4.48.
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";

/// The file beside [`TOKENIZER_CONFIG_FILE`] that transformers 4.48 and later save the chat template in; where
/// it exists it is the template (as transformers itself reads a checkpoint), whatever the config holds.
pub const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";

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
    /// The template of the checkpoint whose `tokenizer_config.json` is at `path`: the [`CHAT_TEMPLATE_FILE`]
    /// beside it where there is one, else the config's `chat_template`; the special tokens from the config.
    ///
    /// # Errors
    /// A file that cannot be read, a config that is not JSON, a template file that is not UTF-8, or no
    /// template in either place.
    pub fn load(path: &Path) -> Result<ChatTemplate, TextError> {
        let bytes = crate::tokenizer::read(path, "--chat:")?;
        let config: Value = serde_json::from_slice(bytes.bytes())
            .map_err(|err| invalid(path, &format!("not JSON: {err}")))?;
        let file = path.with_file_name(CHAT_TEMPLATE_FILE);
        if !file.is_file() {
            return ChatTemplate::from_config(&config, path);
        }
        let bytes = crate::tokenizer::read(&file, "--chat:")?;
        let source = String::from_utf8(bytes.bytes().to_vec())
            .map_err(|err| invalid(&file, &format!("not UTF-8: {err}")))?;
        Ok(ChatTemplate::with_source(source, &config, &file))
    }

    /// The template in the `tokenizer_config.json` beside the tokenizer `t`.
    ///
    /// # Errors
    /// As [`ChatTemplate::load`].
    pub fn beside(t: &crate::TextTokenizer) -> Result<ChatTemplate, TextError> {
        ChatTemplate::load(&t.dir().join(TOKENIZER_CONFIG_FILE))
    }

    /// The template of a parsed `tokenizer_config.json` (`path` names it in errors).
    ///
    /// # Errors
    /// A config without a `chat_template`.
    pub fn from_config(config: &Value, path: &Path) -> Result<ChatTemplate, TextError> {
        let source = template_source(config.get("chat_template")).ok_or_else(|| {
            invalid(
                path,
                &format!(
                    "it has no chat_template (a string, or a list with one named default), and there is no \
                     {CHAT_TEMPLATE_FILE} beside it"
                ),
            )
        })?;
        Ok(ChatTemplate::with_source(source, config, path))
    }

    /// `source` with the special tokens of `config`; `path` (where the template came from) names it in errors.
    fn with_source(source: String, config: &Value, path: &Path) -> ChatTemplate {
        ChatTemplate {
            source,
            bos_token: token_text(config.get("bos_token")),
            eos_token: token_text(config.get("eos_token")),
            path: path.to_owned(),
        }
    }

    /// The conversation as the model was trained to see it, ending where the assistant's reply begins.
    ///
    /// # Errors
    /// A template minijinja cannot read or render, or one that raises (its message, in one line).
    pub fn render(&self, messages: &[Message]) -> Result<String, TextError> {
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

/// A conversation that grows turn by turn (`run --chat --interactive`): each user turn is rendered with the
/// whole conversation before it, as the template must see it (a system turn, earlier replies), and the caller
/// feeds only the tokens past what its caches already hold.
#[derive(Debug)]
pub struct Conversation {
    template: ChatTemplate,
    messages: Vec<Message>,
}

impl Conversation {
    /// A conversation opening with `system`'s turn, if any.
    pub fn new(template: ChatTemplate, system: Option<String>) -> Conversation {
        let messages = system.map(|content| Message { role: "system", content }).into_iter().collect();
        Conversation { template, messages }
    }

    /// Adds the user's turn; returns the whole conversation rendered, ending where the assistant's reply
    /// begins. A turn the template refuses is not kept.
    ///
    /// # Errors
    /// As [`ChatTemplate::render`].
    pub fn user(&mut self, content: String) -> Result<String, TextError> {
        self.messages.push(Message { role: "user", content });
        let rendered = self.template.render(&self.messages);
        if rendered.is_err() {
            self.messages.pop();
        }
        rendered
    }

    /// Adds the assistant's reply (its text, a stop string left out).
    pub fn assistant(&mut self, content: String) {
        self.messages.push(Message { role: "assistant", content });
    }

    /// The turns so far.
    pub fn messages(&self) -> &[Message] {
        &self.messages
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

fn invalid(path: &Path, why: &str) -> TextError {
    TextError::invalid(format!("--chat: {}: {why}", path.display()))
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
        ChatTemplate::from_config(&config, Path::new("tokenizer_config.json")).expect("a template")
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

    /// A checkpoint saved by transformers 4.48 or later: the template in chat_template.jinja, the config without
    /// one (or with an older one, which the file overrides, as transformers reads it).
    #[test]
    fn the_template_file_beside_the_config_is_the_template() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let config = dir.path().join(TOKENIZER_CONFIG_FILE);
        std::fs::write(&config, r#"{"bos_token": "<s>", "eos_token": "</s>", "chat_template": "stale"}"#)
            .expect("writes");
        std::fs::write(dir.path().join(CHAT_TEMPLATE_FILE), RAISES).expect("writes");
        let text = ChatTemplate::load(&config).and_then(|t| t.render(&messages(None, "Hi".into()))).ok();
        assert_eq!(text.as_deref(), Some("<s>[INST] Hi [/INST]"), "the file's template, the config's tokens");
        let Err(err) =
            ChatTemplate::load(&config).and_then(|t| t.render(&messages(Some("s".into()), "Hi".into())))
        else {
            panic!("the template raises for a system turn first")
        };
        assert!(err.message.contains(CHAT_TEMPLATE_FILE), "errors name the file: {}", err.message);

        std::fs::write(dir.path().join(CHAT_TEMPLATE_FILE), [0xff, 0xfe]).expect("writes");
        let Err(err) = ChatTemplate::load(&config) else { panic!("a template that is not UTF-8") };
        assert!(err.message.contains("not UTF-8"), "{}", err.message);

        std::fs::remove_file(dir.path().join(CHAT_TEMPLATE_FILE)).expect("removes");
        std::fs::write(&config, r#"{"bos_token": "<s>"}"#).expect("writes");
        let Err(err) = ChatTemplate::load(&config) else { panic!("no template anywhere") };
        assert!(err.message.contains("and there is no chat_template.jinja beside it"), "{}", err.message);
    }

    #[test]
    fn a_conversation_renders_every_turn_so_far_and_drops_a_refused_one() {
        let mut chat = Conversation::new(template(CHATML), Some("S".into()));
        let first = chat.user("A".into()).expect("renders");
        chat.assistant("B".into());
        let second = chat.user("C".into()).expect("renders");
        assert!(second.starts_with(&first), "{second:?}");
        assert_eq!(
            &second[first.len()..],
            "B<|im_end|>\n<|im_start|>user\nC<|im_end|>\n<|im_start|>assistant\n"
        );
        let mut refused = Conversation::new(template(RAISES), Some("sys".into()));
        assert!(refused.user("Hi".into()).is_err());
        assert_eq!(refused.messages().len(), 1, "the refused turn is not kept");
    }
}
