//! The rules that end a reply: an end-of-sequence id, a stop string in the reply's text, a token budget.

/// Why a reply ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// An end-of-sequence id was generated (it is not part of the reply's text).
    Eos,
    /// A stop string appeared in the reply's text.
    StopString,
    /// The token budget ran out.
    Length,
}

impl StopReason {
    /// The name reports use: `eos`, `stop_string`, `length`.
    pub fn name(self) -> &'static str {
        match self {
            StopReason::Eos => "eos",
            StopReason::StopString => "stop_string",
            StopReason::Length => "length",
        }
    }
}

/// When to end a reply.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopRules {
    /// End-of-sequence ids (`generation_config.json`'s `eos_token_id`, several allowed).
    pub eos: Vec<i64>,
    /// Stop strings (empty ones are ignored).
    pub stops: Vec<String>,
    /// At most this many generated tokens; `None`: no budget.
    pub max_new_tokens: Option<u64>,
}

/// Checks each generated token against [`StopRules`], keeping only as much of the reply's text as a stop
/// string spanning several tokens needs.
#[derive(Debug, Clone)]
pub struct StopChecker {
    rules: StopRules,
    generated: u64,
    /// The end of the reply's text, long enough to hold any stop string but its last character.
    tail: String,
}

impl StopChecker {
    /// A checker for a new reply.
    pub fn new(mut rules: StopRules) -> StopChecker {
        rules.stops.retain(|s| !s.is_empty());
        StopChecker { rules, generated: 0, tail: String::new() }
    }

    /// Adds generated token `id` whose text is `text` (the piece it adds to the reply, possibly empty: the
    /// caller's detokeniser decides); returns why the reply ends with it, if it does. The checks run in the
    /// order of [`StopReason`]: an end-of-sequence id first, then a stop string, then the budget.
    pub fn push(&mut self, id: i64, text: &str) -> Option<StopReason> {
        self.generated = self.generated.saturating_add(1);
        if self.rules.eos.contains(&id) {
            return Some(StopReason::Eos);
        }
        self.tail.push_str(text);
        if self.rules.stops.iter().any(|stop| self.tail.contains(stop.as_str())) {
            return Some(StopReason::StopString);
        }
        self.trim();
        match self.rules.max_new_tokens {
            Some(max) if self.generated >= max => Some(StopReason::Length),
            _ => None,
        }
    }

    /// Tokens pushed so far.
    pub fn generated(&self) -> u64 {
        self.generated
    }

    /// The rules.
    pub fn rules(&self) -> &StopRules {
        &self.rules
    }

    /// Drops the text no stop string can still end in.
    fn trim(&mut self) {
        let keep = self.rules.stops.iter().map(String::len).max().unwrap_or(0).saturating_sub(1);
        if self.tail.len() > keep {
            let mut cut = self.tail.len() - keep;
            while !self.tail.is_char_boundary(cut) {
                cut -= 1;
            }
            self.tail.drain(..cut);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checker(max: Option<u64>) -> StopChecker {
        StopChecker::new(StopRules {
            eos: vec![2, 9],
            stops: vec!["END".into(), String::new()],
            max_new_tokens: max,
        })
    }

    #[test]
    fn each_eos_id_ends_the_reply_and_the_budget_counts_every_token() {
        let mut c = checker(Some(3));
        assert_eq!(c.push(5, "a"), None);
        assert_eq!(c.push(9, ""), Some(StopReason::Eos), "the second eos id");
        let mut c = checker(Some(2));
        assert_eq!(c.push(5, "a"), None);
        assert_eq!(c.push(5, "b"), Some(StopReason::Length));
        assert_eq!(c.generated(), 2);
    }

    #[test]
    fn a_stop_string_spread_over_tokens_and_characters_is_found() {
        let mut c = checker(None);
        for piece in ["日本", "語E", "N"] {
            assert_eq!(c.push(5, piece), None, "{piece}");
        }
        assert_eq!(c.push(5, "D!"), Some(StopReason::StopString));
        let mut empty_only =
            StopChecker::new(StopRules { stops: vec![String::new()], ..StopRules::default() });
        assert_eq!(empty_only.push(1, "x"), None, "an empty stop string never matches");
    }
}
