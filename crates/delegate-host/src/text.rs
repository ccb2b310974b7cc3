//! Text in and out for `run`: the model's tokenizer, the prompt as text or token ids and the checkpoint's
//! end-of-sequence ids, from `text-gen` (shared with `et-run`).

pub use text_gen::{find_tokenizer, prompt_ids, TextTokenizer};
