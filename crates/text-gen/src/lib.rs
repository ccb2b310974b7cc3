//! The text side of generating with a model: its Hugging Face tokenizer, the reply streamed as text while it
//! is generated, its chat template, the rules that end a reply, and the sampling options of the command lines
//! (`delegate-host run`, `et-run`). It runs no model: a caller's loop produces logits, picks tokens with
//! [`sampling::Sampler`] and feeds them here.
//!
//! ## Examples
//!
//! ```
//! use text_gen::{StopChecker, StopReason, StopRules};
//!
//! let rules = StopRules { eos: vec![2], stops: vec!["\n\n".into()], max_new_tokens: Some(4) };
//! let mut checker = StopChecker::new(rules);
//! assert_eq!(checker.push(5, "Hello"), None);
//! assert_eq!(checker.push(6, "\n"), None);
//! assert_eq!(checker.push(6, "\n"), Some(StopReason::StopString));
//! assert_eq!(StopChecker::new(StopRules { eos: vec![2], ..StopRules::default() }).push(2, ""), Some(StopReason::Eos));
//! ```
//!
//! ## Feature Flags
//!
//! - `testing`: [`testing::train`], a small trained BPE tokenizer for the tools' tests.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod chat;
mod detokenizer;
mod error;
mod options;
mod reply;
mod speed;
mod stop;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tokenizer;

pub use chat::{ChatTemplate, Conversation, Message};
pub use detokenizer::{Detokenizer, Pushed};
pub use error::TextError;
pub use options::{GenArgs, Settings};
pub use reply::{sampling_json, Reply};
pub use speed::speed;
pub use stop::{StopChecker, StopReason, StopRules};
pub use tokenizer::{encode, eos_ids, find_tokenizer, prompt_ids, TextTokenizer};
