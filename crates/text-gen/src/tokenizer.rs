//! A model's `tokenizer.json` (given, or found beside the program), the prompt as text or token ids, and the
//! end-of-sequence ids of the `generation_config.json` beside the program.

use std::path::{Path, PathBuf};

use host_runtime::blob_file::BlobFile;
use tokenizers::Tokenizer;

use crate::TextError;

/// The file names a Hugging Face checkpoint uses, looked for beside the program.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// The checkpoint's generation defaults (its end-of-sequence ids).
pub const GENERATION_CONFIG_FILE: &str = "generation_config.json";

/// A tokenizer and where it came from.
pub struct TextTokenizer {
    /// The tokenizer.
    pub tokenizer: Tokenizer,
    /// The file it was read from.
    pub path: PathBuf,
}

impl TextTokenizer {
    /// The tokenizer in the `tokenizer.json` at `path` (`--tokenizer` names it in errors).
    ///
    /// # Errors
    /// `NotFound`/`AccessFailed` for a file that cannot be read, `InvalidArgument` for one the tokenizers
    /// library does not read.
    pub fn load(path: &Path) -> Result<TextTokenizer, TextError> {
        let bytes = read(path, "--tokenizer")?;
        let tokenizer = Tokenizer::from_bytes(bytes.bytes()).map_err(|err| {
            TextError::invalid(format!(
                "--tokenizer {}: not a tokenizer.json the tokenizers library reads: {err}",
                path.display()
            ))
        })?;
        Ok(TextTokenizer { tokenizer, path: path.to_owned() })
    }

    /// The directory the tokenizer came from: where a checkpoint keeps its other files.
    pub fn dir(&self) -> &Path {
        self.path.parent().unwrap_or(Path::new(""))
    }
}

/// The tokenizer `given` names (`--tokenizer`), else the `tokenizer.json` beside `program` when there is one.
///
/// # Errors
/// As [`TextTokenizer::load`].
pub fn find_tokenizer(program: &Path, given: Option<&Path>) -> Result<Option<TextTokenizer>, TextError> {
    let path = match given {
        Some(path) => path.to_owned(),
        None => {
            let beside = beside(program, TOKENIZER_FILE);
            if !beside.exists() {
                return Ok(None);
            }
            beside
        }
    };
    TextTokenizer::load(&path).map(Some)
}

/// The end-of-sequence ids of the `generation_config.json` beside `program` (`eos_token_id`: one id or a list),
/// none when there is no such file or it names none.
///
/// # Errors
/// A file that cannot be read, is not JSON, or whose `eos_token_id` is not ids.
pub fn eos_ids(program: &Path) -> Result<Vec<i64>, TextError> {
    let path = beside(program, GENERATION_CONFIG_FILE);
    if !path.exists() {
        return Ok(Vec::new());
    }
    let bytes = read(&path, "the generation config")?;
    let bad = |why: &str| TextError::invalid(format!("{}: {why}", path.display()));
    let value: serde_json::Value =
        serde_json::from_slice(bytes.bytes()).map_err(|err| bad(&format!("not JSON: {err}")))?;
    let eos = value.get("eos_token_id").cloned().unwrap_or(serde_json::Value::Null);
    let ids = match &eos {
        serde_json::Value::Null => Some(Vec::new()),
        serde_json::Value::Number(n) => n.as_i64().map(|id| vec![id]),
        serde_json::Value::Array(items) => items.iter().map(serde_json::Value::as_i64).collect(),
        _ => None,
    };
    ids.ok_or_else(|| bad(&format!("eos_token_id {eos} is neither a token id nor a list of token ids")))
}

/// The prompt's token ids: `ids` (`--prompt-ids`), or `prompt` encoded by the tokenizer when there is one,
/// or `prompt` read as comma-separated token ids when there is none.
///
/// # Errors
/// Both given; text without a tokenizer; text the tokenizer cannot encode or that encodes to nothing.
pub fn prompt_ids(
    prompt: Option<&str>,
    ids: Option<Vec<i64>>,
    tokenizer: Option<&TextTokenizer>,
) -> Result<Option<Vec<i64>>, TextError> {
    match (prompt, ids, tokenizer) {
        (Some(_), Some(_), _) => {
            Err(TextError::invalid("--prompt and --prompt-ids both give the prompt: give one"))
        }
        (None, ids, _) => Ok(ids),
        (Some(text), None, Some(t)) => encode(t, "--prompt", text, true).map(Some),
        (Some(text), None, None) => parse_ids(text).map(Some).map_err(|bad| {
            TextError::invalid(format!(
                "--prompt: {bad:?} is not a token id, and no tokenizer.json was given (--tokenizer) or found \
                 beside the program to read the prompt as text"
            ))
        }),
    }
}

/// `text`'s token ids (`what` names the argument in errors); `add_special`: the tokenizer adds its special
/// tokens (a BOS), as for a plain prompt, not for a rendered chat template, which holds its own.
///
/// # Errors
/// Text the tokenizer cannot encode, or that encodes to no tokens.
pub fn encode(t: &TextTokenizer, what: &str, text: &str, add_special: bool) -> Result<Vec<i64>, TextError> {
    let encoding = t.tokenizer.encode(text, add_special).map_err(|err| {
        TextError::invalid(format!("{what}: the tokenizer {} cannot encode it: {err}", t.path.display()))
    })?;
    if encoding.get_ids().is_empty() {
        return Err(TextError::invalid(format!("{what} {text:?} encodes to no tokens")));
    }
    Ok(encoding.get_ids().iter().map(|&id| i64::from(id)).collect())
}

/// Comma-separated token ids; the first part that is not one.
fn parse_ids(text: &str) -> Result<Vec<i64>, String> {
    text.split(',').map(|part| part.trim().parse().map_err(|_| part.to_owned())).collect()
}

fn beside(program: &Path, name: &str) -> PathBuf {
    program.parent().unwrap_or(Path::new("")).join(name)
}

/// The file at `path` (`what` names it in errors): a regular file only.
pub(crate) fn read(path: &Path, what: &str) -> Result<BlobFile, TextError> {
    BlobFile::open(path).map_err(|err| TextError::file(what, path, &err))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prompt_without_a_tokenizer_is_token_ids() {
        assert_eq!(prompt_ids(Some("1, 7,3"), None, None).ok().flatten(), Some(vec![1, 7, 3]));
        assert_eq!(prompt_ids(None, Some(vec![4]), None).ok().flatten(), Some(vec![4]));
        let Err(err) = prompt_ids(Some("Hello"), None, None) else { panic!("text without a tokenizer") };
        assert!(err.message.contains("\"Hello\" is not a token id"), "{}", err.message);
        assert!(prompt_ids(Some("1"), Some(vec![1]), None).is_err());
    }
}
