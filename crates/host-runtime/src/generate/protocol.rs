//! How a generation feeds its prompt: the calls that take it, decided before any runs.
//!
//! The prefill method takes the prompt in chunks of its token count (`T`, a chunked prefill); the tokens left
//! short of a chunk (all of them for a prompt shorter than `T`) go one token a call through the decode method,
//! which leaves the caches exactly as a longer prefill would (each call writes its rows and attends causally
//! over the cache), so no call pads and nothing is masked by hand. A program whose prefill and decode are one
//! method (`forward`) of several tokens has no method for the tail: its prompt must be a multiple of `T`.

use program_manifest::Generate;

use super::{i64_bytes, token_rows};
use crate::program::{Error, Program, RunStats};

/// One method call over part of the prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Call<'g> {
    /// The method run: the prefill method, or the decode method for the tail.
    pub method: &'g str,
    /// The tokens fed (as many as the method takes).
    pub tokens: &'g [i64],
    /// The position of the first.
    pub position: i64,
}

/// The calls that feed `g.prompt` from position 0, in order (module docs); the last one's outputs hold the next
/// token.
///
/// # Errors
/// As [`feed_calls`].
pub(super) fn prompt_calls<'g>(program: &Program, g: &'g Generate) -> Result<Vec<Call<'g>>, Error> {
    feed_calls(program, g, &g.prompt, 0)
}

/// The calls that feed `feed` from position `start` (the rest of a prompt after a restored prefix, a new turn),
/// as the prompt is fed (module docs).
///
/// # Errors
/// [`Error::Generation`] when `feed` leaves a tail and the decode method does not take one token a call (a
/// one-method program whose method takes several).
pub(super) fn feed_calls<'f>(
    program: &Program,
    g: &'f Generate,
    feed: &'f [i64],
    start: i64,
) -> Result<Vec<Call<'f>>, Error> {
    let rows = token_rows(program, g, &g.prefill).filter(|&rows| rows > 0).unwrap_or(feed.len());
    let decode_rows = token_rows(program, g, &g.decode).unwrap_or(1);
    calls(g, feed, start, (rows, decode_rows))
}

/// [`feed_calls`] for a prefill method of `rows` tokens a call and a decode method of `decode_rows`.
fn calls<'f>(
    g: &'f Generate,
    feed: &'f [i64],
    start: i64,
    (rows, decode_rows): (usize, usize),
) -> Result<Vec<Call<'f>>, Error> {
    let rows = rows.max(1);
    let (head, tail) = feed.split_at(feed.len() / rows * rows);
    if !tail.is_empty() && decode_rows != 1 {
        return Err(Error::Generation(format!(
            "method '{}' takes {rows} tokens per call, which does not divide the {} tokens fed, and method '{}' \
             takes {decode_rows}, not one, so it cannot feed the last {}",
            g.prefill,
            feed.len(),
            g.decode,
            tail.len()
        )));
    }
    let chunks = head.chunks(rows).map(|chunk| (g.prefill.as_str(), chunk));
    let singles = tail.chunks(1).map(|token| (g.decode.as_str(), token));
    let mut position = start;
    Ok(chunks
        .chain(singles)
        .map(|(method, tokens)| {
            let call = Call { method, tokens, position };
            position += tokens.len() as i64;
            call
        })
        .collect())
}

/// Runs `calls` in order, each to completion: the method of the last (whose outputs hold the next token) and
/// what the runs cost together.
pub(super) fn run_calls<'g>(
    program: &mut Program,
    g: &Generate,
    calls: &[Call<'g>],
) -> Result<(&'g str, RunStats), Error> {
    let mut stats = RunStats::default();
    for call in calls {
        program.write_input(call.method, &g.token_input, &i64_bytes(call.tokens))?;
        program.write_input(call.method, &g.position_input, &i64_bytes(&[call.position]))?;
        let run = program.execute(call.method)?;
        stats.elapsed += run.elapsed;
        stats.copies.add(run.copies);
    }
    let last =
        calls.last().ok_or_else(|| Error::Generation("the prompt is empty: nothing to feed".into()))?;
    Ok((last.method, stats))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn generate(prefill: &str, decode: &str, prompt: &[i64]) -> Generate {
        Generate {
            prefill: prefill.into(),
            decode: decode.into(),
            prompt: prompt.to_vec(),
            token_input: "tokens".into(),
            position_input: "input_pos".into(),
            logits_output: "logits".into(),
            next_token_output: None,
            max_positions: None,
        }
    }

    /// `(method, tokens, position)` of each call.
    fn plan(g: &Generate, rows: usize, decode_rows: usize) -> Vec<(&str, Vec<i64>, i64)> {
        let calls = calls(g, &g.prompt, 0, (rows, decode_rows)).expect("a plan");
        calls.iter().map(|c| (c.method, c.tokens.to_vec(), c.position)).collect()
    }

    #[test]
    fn a_chunked_prefill_takes_whole_chunks_and_decode_the_tokens_short_of_one() {
        let g = generate("prefill", "decode", &[1, 7, 3, 12, 5, 9, 2]);
        let expected =
            [("prefill", vec![1, 7, 3], 0), ("prefill", vec![12, 5, 9], 3), ("decode", vec![2], 6)];
        assert_eq!(plan(&g, 3, 1), expected);
        let exact = generate("prefill", "decode", &[1, 7, 3, 12]);
        assert_eq!(plan(&exact, 4, 1), [("prefill", vec![1, 7, 3, 12], 0)], "no tail");
        let short = generate("prefill", "decode", &[1, 7]);
        assert_eq!(
            plan(&short, 128, 1),
            [("decode", vec![1], 0), ("decode", vec![7], 1)],
            "shorter than a chunk"
        );
    }

    #[test]
    fn one_method_of_several_tokens_needs_a_prompt_it_divides() {
        let g = generate("forward", "forward", &[1, 7, 3, 12]);
        assert_eq!(plan(&g, 2, 2), [("forward", vec![1, 7], 0), ("forward", vec![3, 12], 2)]);
        assert_eq!(plan(&g, 1, 1).len(), 4, "one token a call");
        let message = calls(&g, &g.prompt, 0, (3, 3))
            .expect_err("a tail of one token and no method for it")
            .to_string();
        assert!(message
            .contains("method 'forward' takes 3 tokens per call, which does not divide the 4 tokens fed"));
        assert!(message.ends_with("cannot feed the last 1"), "{message}");
    }
}
