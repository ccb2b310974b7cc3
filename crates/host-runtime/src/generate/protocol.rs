//! The generation protocol: which method calls feed a prompt, decided before any runs, and how far a
//! generation's positions reach. Every runtime that generates follows it: host-runtime's host and device
//! loops, a continued sequence, and ExecuTorch's own runtime through the bridge (`et-run`), which plans with
//! [`plan`].
//!
//! The prefill method takes the prompt in chunks of its token count (`T`, a chunked prefill). The tokens left
//! short of a chunk (the tail) go one token a call through the decode method, which leaves the caches exactly
//! as a longer prefill would (each call writes its rows and attends causally over the cache), so no call pads
//! and nothing is masked by hand; all of them for a prompt shorter than `T`. A tail of at least a quarter of a
//! chunk after at least one whole chunk is instead taken in one more prefill call over the feed's last `T`
//! tokens: it rewrites the rows the chunk before it wrote, from the same tokens at the same positions (each
//! row depends only on the tokens up to it: the same values, bit for bit on the reference delegate, whose rows
//! sum alike wherever they sit in a chunk), and ends on the feed's last token.
//! One chunk costs about as much as a quarter of its tokens taken one a call on the reference delegate (its
//! products take four rows a pass) and as a few decode steps on the GPU, so from a quarter on it is the cheaper
//! way on both. A program whose prefill and decode are one method (`forward`) of several tokens has no method
//! for a tail: it takes the last chunk so whatever the tail, and refuses a feed shorter than a chunk that
//! leaves one.

use program_manifest::Generate;

use super::Options;
use crate::program::{Error, Program};

/// A tail of at least `1 / LAST_CHUNK_FROM` of a chunk is taken as the feed's last chunk again (module docs).
const LAST_CHUNK_FROM: usize = 4;

/// One method call over part of the prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call<'f> {
    /// The method run: the prefill method, or the decode method for the tail.
    pub method: &'f str,
    /// The tokens fed (as many as the method takes).
    pub tokens: &'f [i64],
    /// The position of the first.
    pub position: i64,
}

/// The two methods a prompt is fed through, and how many tokens each takes a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Methods<'m> {
    /// The prefill method (the decode method too, for a one-method program).
    pub prefill: &'m str,
    /// Tokens the prefill method takes a call (0 is read as 1).
    pub prefill_rows: usize,
    /// The decode method.
    pub decode: &'m str,
    /// Tokens the decode method takes a call.
    pub decode_rows: usize,
}

/// The calls that feed `feed` from position `start` through `methods`, in order (module docs); the last one's
/// outputs hold the next token. Pure: nothing runs.
///
/// # Errors
/// [`Error::Generation`] when `feed` is shorter than a chunk and the decode method does not take one token a
/// call (a one-method program whose method takes several), naming both methods and the counts.
pub fn plan<'f>(methods: Methods<'f>, feed: &'f [i64], start: i64) -> Result<Vec<Call<'f>>, Error> {
    let Methods { prefill, decode, decode_rows, .. } = methods;
    let rows = methods.prefill_rows.max(1);
    let (head, tail) = feed.split_at(feed.len() / rows * rows);
    let no_singles = decode_rows != 1;
    if !tail.is_empty() && head.is_empty() && no_singles {
        return Err(Error::Generation(format!(
            "method '{prefill}' takes {rows} tokens per call, more than the {} tokens fed, and method \
             '{decode}' takes {decode_rows}, not one, so it cannot feed them",
            feed.len()
        )));
    }
    let call =
        |method, tokens: &'f [i64], offset: usize| Call { method, tokens, position: start + offset as i64 };
    let chunks = head.chunks(rows).enumerate().map(|(i, chunk)| call(prefill, chunk, i * rows));
    let mut calls: Vec<Call<'f>> = chunks.collect();
    let last_chunk_again = !head.is_empty() && (no_singles || tail.len() * LAST_CHUNK_FROM >= rows);
    if !tail.is_empty() && last_chunk_again {
        let last = feed.len() - rows;
        calls.push(call(prefill, &feed[last..], last));
    } else {
        calls.extend(
            tail.iter()
                .enumerate()
                .map(|(i, token)| call(decode, std::slice::from_ref(token), head.len() + i)),
        );
    }
    Ok(calls)
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
/// as the prompt is fed: [`plan`] over `program`'s methods (a prefill method whose token count is unknown
/// takes the whole feed in one call).
///
/// # Errors
/// As [`plan`].
pub(super) fn feed_calls<'f>(
    program: &Program,
    g: &'f Generate,
    feed: &'f [i64],
    start: i64,
) -> Result<Vec<Call<'f>>, Error> {
    let methods = Methods {
        prefill: &g.prefill,
        prefill_rows: token_rows(program, g, &g.prefill).filter(|&rows| rows > 0).unwrap_or(feed.len()),
        decode: &g.decode,
        decode_rows: token_rows(program, g, &g.decode).unwrap_or(1),
    };
    plan(methods, feed, start)
}

/// How many tokens a method's token input takes per call.
pub(super) fn token_rows(program: &Program, g: &Generate, method: &str) -> Option<usize> {
    let decl = program.manifest().methods.get(method)?.inputs.iter().find(|d| d.name == g.token_input)?;
    usize::try_from(decl.numel()).ok()
}

/// The position after the rows a generation writes (the prompt's, then one per decode step from the start,
/// or one when held), once checked: decode starts at or after the prompt, and every position fits the
/// caches (`max_positions`) and an `i64` position input. The step count is the caller's, so every
/// conversion of it is checked.
pub(super) fn decode_end(g: &Generate, options: &Options) -> Result<i64, Error> {
    let steps = options.steps;
    let prompt = i64::try_from(g.prompt.len()).unwrap_or(i64::MAX);
    let start = options.start_position.unwrap_or(prompt);
    let advance = if options.hold_position { Some(1) } else { i64::try_from(steps).ok() };
    let end = advance.and_then(|advance| start.checked_add(advance)).filter(|_| start >= prompt);
    let fits = match g.max_positions {
        Some(max) => end.filter(|&end| u64::try_from(end).is_ok_and(|end| end <= max)),
        None => end,
    };
    match (fits, g.max_positions) {
        (Some(end), _) => Ok(if steps == 0 { prompt } else { end }),
        (None, Some(max)) => Err(Error::Usage(if options.start_position.is_some() {
            format!(
                "{steps} decode steps from position {start} do not fit: the caches hold {max} positions and the prompt takes {prompt}, so decode may start at positions {prompt}..{max} and run until position {}",
                max.saturating_sub(1)
            )
        } else {
            let most = g.max_decode_steps().unwrap_or_default();
            format!(
                "{steps} decode steps do not fit: the caches hold {max} positions and the prompt takes {prompt}, so at most {most} decode steps"
            )
        })),
        (None, None) if start < prompt => Err(Error::Usage(format!(
            "decode cannot start at position {start}, inside the prompt of {prompt} tokens"
        ))),
        (None, None) => Err(Error::Usage(format!(
            "{steps} decode steps from position {start} run past position {}, the last a position input holds",
            i64::MAX
        ))),
    }
}

/// How many steps' records to reserve for `steps` decode steps: at most as many as the caches hold (the
/// count is the caller's, never trusted with an allocation; records past it grow as the steps run).
pub(super) fn reserve(g: &Generate, steps: usize) -> usize {
    steps.min(g.max_positions.and_then(|max| usize::try_from(max).ok()).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn generate(prefill: &str, decode: &str, prompt: &[i64], max_positions: Option<u64>) -> Generate {
        Generate {
            prefill: prefill.into(),
            decode: decode.into(),
            prompt: prompt.to_vec(),
            token_input: "tokens".into(),
            position_input: "input_pos".into(),
            logits_output: "logits".into(),
            next_token_output: None,
            max_positions,
        }
    }

    fn methods(g: &Generate, prefill_rows: usize, decode_rows: usize) -> Methods<'_> {
        Methods { prefill: &g.prefill, prefill_rows, decode: &g.decode, decode_rows }
    }

    /// `(method, tokens, position)` of each call.
    fn calls(g: &Generate, rows: usize, decode_rows: usize) -> Vec<(&str, Vec<i64>, i64)> {
        let calls = plan(methods(g, rows, decode_rows), &g.prompt, 0).expect("a plan");
        calls.iter().map(|c| (c.method, c.tokens.to_vec(), c.position)).collect()
    }

    #[test]
    fn a_chunked_prefill_takes_whole_chunks_and_decode_the_tokens_short_of_one() {
        let prompt: Vec<i64> = (1..=9).collect();
        let g = generate("prefill", "decode", &prompt, None);
        let expected = [("prefill", (1..=8).collect(), 0), ("decode", vec![9], 8)];
        assert_eq!(calls(&g, 8, 1), expected, "a tail under a quarter of a chunk");
        let exact = generate("prefill", "decode", &[1, 7, 3, 12], None);
        assert_eq!(calls(&exact, 4, 1), [("prefill", vec![1, 7, 3, 12], 0)], "no tail");
        let short = generate("prefill", "decode", &[1, 7], None);
        assert_eq!(
            calls(&short, 128, 1),
            [("decode", vec![1], 0), ("decode", vec![7], 1)],
            "shorter than a chunk"
        );
        let later = plan(methods(&g, 8, 1), &g.prompt, 10).expect("a plan");
        assert_eq!(later.iter().map(|c| c.position).collect::<Vec<_>>(), [10, 18], "from a later position");
    }

    #[test]
    fn a_tail_of_a_quarter_of_a_chunk_or_more_is_the_feeds_last_chunk_again() {
        let prompt: Vec<i64> = (1..=10).collect();
        let g = generate("prefill", "decode", &prompt, None);
        // 8 tokens a chunk: a tail of 2 is a quarter; the last call rewrites positions 2..8 from the same tokens.
        let expected = [("prefill", (1..=8).collect::<Vec<i64>>(), 0), ("prefill", (3..=10).collect(), 2)];
        assert_eq!(calls(&g, 8, 1), expected);
        assert_eq!(
            calls(&g, 9, 1).len(),
            2,
            "a tail of 1 in chunks of 9 is under a quarter: one decode call"
        );
        assert_eq!(calls(&g, 9, 1)[1], ("decode", vec![10], 9));
        let later = plan(methods(&g, 8, 1), &g.prompt, 100).expect("a plan");
        assert_eq!(later.iter().map(|c| c.position).collect::<Vec<_>>(), [100, 102], "from a later position");
        let last = later.last().expect("calls");
        assert_eq!(last.position + last.tokens.len() as i64, 110, "the feed ends where it would have");
    }

    #[test]
    fn one_method_of_several_tokens_takes_the_last_chunk_again_and_refuses_a_shorter_feed() {
        let g = generate("forward", "forward", &[1, 7, 3, 12], None);
        assert_eq!(calls(&g, 2, 2), [("forward", vec![1, 7], 0), ("forward", vec![3, 12], 2)]);
        assert_eq!(calls(&g, 1, 1).len(), 4, "one token a call");
        assert_eq!(calls(&g, 0, 1).len(), 4, "a count of 0 is read as one");
        assert_eq!(calls(&g, 3, 3), [("forward", vec![1, 7, 3], 0), ("forward", vec![7, 3, 12], 1)]);
        let message = plan(methods(&g, 5, 5), &g.prompt, 0).expect_err("no method for 4 tokens").to_string();
        assert!(message.contains("method 'forward' takes 5 tokens per call, more than the 4 tokens fed"));
        assert!(message.ends_with("so it cannot feed them"), "{message}");
    }

    fn options(steps: usize, start: Option<i64>, hold: bool) -> Options {
        Options { start_position: start, hold_position: hold, ..Options::steps(steps) }
    }

    #[test]
    fn decode_steps_fit_the_caches_and_an_i64_position_whatever_the_count() {
        let usage = |result: Result<i64, Error>| match result {
            Err(Error::Usage(message)) => message,
            other => panic!("{other:?}"),
        };
        let prompt = [1, 7, 3, 12];
        let held = generate("prefill", "decode", &prompt, Some(16));
        assert_eq!(decode_end(&held, &options(12, None, false)).ok(), Some(16));
        assert_eq!(decode_end(&held, &options(0, None, false)).ok(), Some(4), "the prompt's rows");
        assert_eq!(decode_end(&held, &options(usize::MAX, Some(15), true)).ok(), Some(16), "held: one row");
        // `usize::MAX as i64` is -1, which once passed the check.
        for steps in [13, 1 << 40, usize::MAX] {
            let message = usage(decode_end(&held, &options(steps, None, false)));
            assert!(message.ends_with("so at most 12 decode steps"), "{message}");
        }
        let message = usage(decode_end(&held, &options(usize::MAX, Some(i64::MAX), false)));
        assert!(message.contains("from position 9223372036854775807 do not fit"), "{message}");
        let none_held = generate("prefill", "decode", &prompt, Some(0));
        assert!(usage(decode_end(&none_held, &options(1, Some(0), false))).ends_with("until position 0"));

        let untold = generate("prefill", "decode", &prompt, None);
        assert_eq!(decode_end(&untold, &options(1 << 40, None, false)).ok(), Some(4 + (1 << 40)));
        let message = usage(decode_end(&untold, &options(usize::MAX, None, false)));
        assert!(message.contains("run past position 9223372036854775807"), "{message}");
        let message = usage(decode_end(&untold, &options(1, Some(3), false)));
        assert!(message.contains("inside the prompt of 4 tokens"), "{message}");
    }

    #[test]
    fn records_are_reserved_for_no_more_steps_than_the_caches_hold() {
        let prompt = [1, 7, 3, 12];
        assert_eq!(reserve(&generate("prefill", "decode", &prompt, Some(16)), usize::MAX), 16);
        assert_eq!(reserve(&generate("prefill", "decode", &prompt, Some(16)), 3), 3);
        assert_eq!(reserve(&generate("prefill", "decode", &prompt, None), 1 << 40), 0);
    }
}
