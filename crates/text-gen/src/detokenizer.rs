//! Streaming a reply as text while it is generated: the ids generated so far are decoded whole and only the
//! new, complete part is released, so a character spread over several tokens (byte fallback, byte-level
//! BPE) is never printed in halves, a merge that rewrites earlier text is waited out, and a stop string is
//! never printed, not even its beginning.

use tokenizers::Tokenizer;

/// What [`Detokenizer::push`] found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Pushed {
    /// Text to print now (possibly empty).
    pub text: String,
    /// Whether a stop string appeared: the generation ends, the text before it was released.
    pub stopped: bool,
}

/// Decodes a growing list of ids into text released in complete pieces.
pub struct Detokenizer<'t> {
    tokenizer: &'t Tokenizer,
    stops: Vec<String>,
    ids: Vec<u32>,
    /// The text released so far.
    released: String,
}

impl<'t> Detokenizer<'t> {
    /// A decoder that ends at any of `stops` (empty strings are ignored).
    pub fn new(tokenizer: &'t Tokenizer, stops: &[String]) -> Detokenizer<'t> {
        let stops = stops.iter().filter(|s| !s.is_empty()).cloned().collect();
        Detokenizer { tokenizer, stops, ids: Vec::new(), released: String::new() }
    }

    /// Adds a generated id; returns the text it completes. An id outside the vocabulary decodes to nothing.
    pub fn push(&mut self, id: i64) -> Pushed {
        if let Ok(id) = u32::try_from(id) {
            self.ids.push(id);
        }
        let text = self.decoded();
        if let Some(stop) = self.first_stop(&text) {
            return Pushed { text: self.release(&text[..stop]), stopped: true };
        }
        // A trailing replacement character is a character still missing bytes; the end of the text that
        // could begin a stop string waits for the next token.
        let complete = text.trim_end_matches('\u{fffd}');
        let held = self.stop_prefix_len(complete);
        Pushed { text: self.release(&complete[..complete.len() - held]), stopped: false }
    }

    /// The rest of the text once the generation ended (a character left incomplete is released as the
    /// replacement character).
    pub fn finish(&mut self) -> String {
        let text = self.decoded();
        let end = self.first_stop(&text).unwrap_or(text.len());
        self.release(&text[..end])
    }

    /// All the text released.
    pub fn text(&self) -> &str {
        &self.released
    }

    fn decoded(&self) -> String {
        // Decoding known ids cannot fail; an unknown id decodes to nothing.
        self.tokenizer.decode(&self.ids, true).unwrap_or_default()
    }

    /// The part of `ready` after what was released, when `ready` extends it (a merge that rewrote released
    /// text releases nothing until the text agrees again).
    fn release(&mut self, ready: &str) -> String {
        match ready.strip_prefix(self.released.as_str()) {
            Some(new) if !new.is_empty() => {
                let new = new.to_owned();
                self.released.push_str(&new);
                new
            }
            _ => String::new(),
        }
    }

    /// Where the earliest stop string starts in `text`.
    fn first_stop(&self, text: &str) -> Option<usize> {
        self.stops.iter().filter_map(|stop| text.find(stop.as_str())).min()
    }

    /// The length of the longest end of `text` that is the beginning of a stop string.
    fn stop_prefix_len(&self, text: &str) -> usize {
        let ends = text.char_indices().map(|(i, _)| i).filter(|&i| {
            let end = &text[i..];
            self.stops.iter().any(|stop| stop.starts_with(end))
        });
        ends.min().map_or(0, |i| text.len() - i)
    }
}

#[cfg(test)]
mod tests {
    use tokenizers::decoders::byte_level::ByteLevel;
    use tokenizers::models::bpe::{Vocab, BPE};

    use super::*;

    /// A byte-level tokenizer with one token per byte and no merges: a three-byte character takes three
    /// tokens.
    fn bytes_tokenizer() -> Tokenizer {
        let alphabet = ByteLevel::alphabet();
        let mut chars: Vec<char> = alphabet.into_iter().collect();
        chars.sort_unstable();
        let vocab: Vocab = chars.iter().enumerate().map(|(i, c)| (c.to_string(), i as u32)).collect();
        let bpe = BPE::builder().vocab_and_merges(vocab, Vec::new()).build().expect("a BPE");
        let mut tokenizer = Tokenizer::new(bpe);
        tokenizer.with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)));
        tokenizer.with_decoder(Some(ByteLevel::default()));
        tokenizer
    }

    fn ids(tokenizer: &Tokenizer, text: &str) -> Vec<i64> {
        let encoding = tokenizer.encode(text, false).expect("encodes");
        encoding.get_ids().iter().map(|&id| i64::from(id)).collect()
    }

    #[test]
    fn a_character_spread_over_tokens_is_released_only_when_complete() {
        let tokenizer = bytes_tokenizer();
        let ids = ids(&tokenizer, "日本");
        assert_eq!(ids.len(), 6, "one token per byte");
        let mut d = Detokenizer::new(&tokenizer, &[]);
        let pieces: Vec<String> = ids.iter().map(|&id| d.push(id).text).collect();
        assert_eq!(pieces, ["", "", "日", "", "", "本"]);
        assert_eq!(d.finish(), "");
        assert_eq!(d.text(), "日本");
    }

    #[test]
    fn a_stop_string_is_never_printed_not_even_its_beginning() {
        let tokenizer = bytes_tokenizer();
        let mut d = Detokenizer::new(&tokenizer, &["END".to_owned()]);
        let mut printed = String::new();
        let mut stopped = false;
        for id in ids(&tokenizer, "héllo ENDING") {
            let pushed = d.push(id);
            printed.push_str(&pushed.text);
            if pushed.stopped {
                stopped = true;
                break;
            }
        }
        assert!(stopped);
        assert_eq!(printed, "héllo ");
        // A beginning of the stop string that never completes is released at the end.
        let mut d = Detokenizer::new(&tokenizer, &["END".to_owned()]);
        let held: String = ids(&tokenizer, "a EN").into_iter().map(|id| d.push(id).text).collect();
        assert_eq!(held, "a ");
        assert_eq!(d.finish(), "EN");
    }
}
