//! [`Reply`]: a reply's text side while its tokens arrive, the part `delegate-host run` and `et-run` share: each
//! token's time, the end it reaches (an end-of-sequence id, a stop string) and the text to show now; then the
//! rest of the text, the summary line and the report's speed and sampling fields.

use std::time::{Duration, Instant};

use sampling::Params;
use serde_json::{json, Value};
use tokenizers::Tokenizer;

use crate::{speed, Detokenizer, Pushed, Settings, StopReason};

/// A reply being generated (see the module docs). Without a tokenizer it has no text: only the
/// end-of-sequence ids end it early.
pub struct Reply<'t> {
    detokenizer: Option<Detokenizer<'t>>,
    eos: Vec<i64>,
    start: Instant,
    times: Vec<Duration>,
    stop: StopReason,
}

impl<'t> Reply<'t> {
    /// A reply starting now, read by `tokenizer` (if any), ending at `settings`' end-of-sequence ids and stop
    /// strings; until one of them comes, its end is [`StopReason::Length`].
    pub fn new(tokenizer: Option<&'t Tokenizer>, settings: &Settings) -> Reply<'t> {
        Reply {
            detokenizer: tokenizer.map(|t| Detokenizer::new(t, &settings.stops)),
            eos: settings.eos.clone(),
            start: Instant::now(),
            times: Vec::new(),
            stop: StopReason::Length,
        }
    }

    /// Whether the reply has text (a tokenizer reads it).
    pub fn has_text(&self) -> bool {
        self.detokenizer.is_some()
    }

    /// Adds generated token `id`: the text it completes, and whether the reply ends with it (an
    /// end-of-sequence id, whose text is never shown, or a stop string, shown up to its start).
    pub fn push(&mut self, id: i64) -> Pushed {
        self.times.push(self.start.elapsed());
        if self.eos.contains(&id) {
            self.stop = StopReason::Eos;
            return Pushed { text: String::new(), stopped: true };
        }
        let Some(detokenizer) = self.detokenizer.as_mut() else { return Pushed::default() };
        let pushed = detokenizer.push(id);
        if pushed.stopped {
            self.stop = StopReason::StopString;
        }
        pushed
    }

    /// The text held back until the reply ended (none after a stop string, whose start ends the text).
    pub fn finish(&mut self) -> String {
        match (&mut self.detokenizer, self.stop) {
            (Some(d), reason) if reason != StopReason::StopString => d.finish(),
            _ => String::new(),
        }
    }

    /// All the text shown so far (`None` without a tokenizer).
    pub fn text(&self) -> Option<&str> {
        self.detokenizer.as_ref().map(Detokenizer::text)
    }

    /// Why the reply ended ([`StopReason::Length`] while none of its own ends came).
    pub fn stop(&self) -> StopReason {
        self.stop
    }

    /// The time to the first token and the tokens per second after it ([`speed`]).
    pub fn speed(&self) -> (Option<Duration>, Option<f64>) {
        speed(&self.times)
    }

    /// The streamed reply's summary line: `N tokens (stop: eos), time to first token X ms, Y tokens/s`, for a
    /// reply of `tokens` generated ids.
    pub fn summary(&self, tokens: usize) -> String {
        let (ttft, rate) = self.speed();
        format!(
            "{tokens} tokens (stop: {}), time to first token {:.1} ms, {}",
            self.stop.name(),
            ttft.unwrap_or_default().as_secs_f64() * 1e3,
            rate.map_or("- tokens/s".to_owned(), |r| format!("{r:.1} tokens/s"))
        )
    }

    /// The fields every `--json` reply report has: `text`, `stop`, `time_to_first_token_ms`, `tokens_per_s` and
    /// `sampling` (the sampler's `params`, [`sampling_json`]).
    pub fn json_fields(&self, params: &Params) -> serde_json::Map<String, Value> {
        let (ttft, rate) = self.speed();
        let mut fields = serde_json::Map::new();
        fields.insert("text".into(), json!(self.text()));
        fields.insert("stop".into(), json!(self.stop.name()));
        fields.insert("time_to_first_token_ms".into(), json!(ttft.map(|t| t.as_secs_f64() * 1e3)));
        fields.insert("tokens_per_s".into(), json!(rate));
        fields.insert("sampling".into(), sampling_json(params));
        fields
    }
}

/// The sampling parameters as the reports show them.
pub fn sampling_json(p: &Params) -> Value {
    json!({
        "temperature": p.temperature,
        "top_k": p.top_k,
        "top_p": p.top_p,
        "min_p": p.min_p,
        "repetition_penalty": p.repetition_penalty,
        "seed": p.seed,
    })
}

#[cfg(test)]
mod tests {
    use sampling::Sampler;
    use tokenizers::models::wordlevel::WordLevel;
    use tokenizers::pre_tokenizers::whitespace::Whitespace;

    use super::*;

    /// Words `a`, `b`, `c`, `<eos>` as ids 0 to 3, decoded with spaces between them.
    fn words() -> Tokenizer {
        let vocab = [("a", 0), ("b", 1), ("c", 2), ("<eos>", 3)].map(|(w, i)| (w.to_owned(), i)).into();
        let model = WordLevel::builder().vocab(vocab).unk_token("<eos>".into()).build().expect("a WordLevel");
        let mut tokenizer = Tokenizer::new(model);
        tokenizer.with_pre_tokenizer(Some(Whitespace {}));
        tokenizer
    }

    fn settings(eos: &[i64], stops: &[&str]) -> Settings {
        Settings {
            sampler: Sampler::new(Params::default()).expect("the default sampler"),
            stops: stops.iter().map(|s| (*s).to_owned()).collect(),
            eos: eos.to_vec(),
            max_new_tokens: None,
            steps: None,
        }
    }

    #[test]
    fn an_eos_id_ends_the_reply_and_is_never_shown() {
        let tokenizer = words();
        let mut reply = Reply::new(Some(&tokenizer), &settings(&[3], &[]));
        assert_eq!(reply.push(0), Pushed { text: "a".into(), stopped: false });
        assert_eq!(reply.push(3), Pushed { text: String::new(), stopped: true });
        assert_eq!(reply.stop(), StopReason::Eos);
        assert_eq!(reply.finish(), "");
        assert_eq!(reply.text(), Some("a"));
        assert!(
            reply.summary(2).starts_with("2 tokens (stop: eos), time to first token "),
            "{}",
            reply.summary(2)
        );
    }

    #[test]
    fn a_stop_string_ends_the_reply_and_the_held_text_is_released_otherwise() {
        let tokenizer = words();
        let mut reply = Reply::new(Some(&tokenizer), &settings(&[], &["b c"]));
        let shown: String = [0, 1].map(|id| reply.push(id).text).concat();
        assert_eq!(reply.stop(), StopReason::Length, "no end yet");
        assert!(reply.push(2).stopped);
        assert_eq!(reply.stop(), StopReason::StopString);
        assert_eq!(format!("{shown}{}", reply.finish()), "a ", "the stop string's start ends the text");

        let mut reply = Reply::new(Some(&tokenizer), &settings(&[], &["b c"]));
        let shown: String = [0, 1].map(|id| reply.push(id).text).concat();
        assert_eq!(
            format!("{shown}{}", reply.finish()),
            "a b",
            "held back for a stop string that never came"
        );
        let fields = reply.json_fields(&Params::default());
        assert_eq!((fields["text"].as_str(), fields["stop"].as_str()), (Some("a b"), Some("length")));
        assert_eq!(fields["sampling"]["temperature"], json!(Params::default().temperature));
    }

    #[test]
    fn without_a_tokenizer_only_the_eos_ids_end_the_reply() {
        let mut reply = Reply::new(None, &settings(&[3], &["a"]));
        assert!(!reply.has_text());
        assert_eq!(reply.push(0), Pushed::default());
        assert!(reply.push(3).stopped);
        assert_eq!(reply.finish(), "");
        assert_eq!(reply.text(), None);
    }
}
