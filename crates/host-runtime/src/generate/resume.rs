//! Continuing a sequence from a position (after [`Program::rewind`] or [`Program::restore_cache`]): the
//! tokens fed as a prompt is (chunks through the prefill method, the rest one by one through decode), then
//! greedy decode steps, on the host loop.

use program_manifest::Generate;

use super::protocol::{feed_calls, reserve};
use super::step::{i64_bytes, read_token, run_calls};
use crate::program::{Error, Program};

/// Feeds `feed` at positions `position..` as a prompt is fed (the module docs: the tokens at those positions,
/// after a rewind to `p` the token that was at `p`, after a restored prompt prefix the rest of the prompt), then
/// runs `steps` decode steps feeding back each token. Returns the token after the last fed one, then one per
/// step. The caches must hold positions `0..position` ([`Program::rewind`], [`Program::restore_cache`]).
///
/// # Errors
/// [`Error::NotAGenerator`] when the program has no `[generate]`; [`Error::Usage`] when `feed` is empty or
/// the positions do not fit the caches or an `i64` position, before anything runs; the errors of the runs,
/// [`Error::TornBuffers`] among them; [`Error::Generation`] when `feed` is not a multiple of a one-method
/// program's token count.
pub fn continue_from(
    program: &mut Program,
    position: u64,
    feed: &[i64],
    steps: usize,
) -> Result<Vec<i64>, Error> {
    let g: Generate = program.manifest().generate.clone().ok_or(Error::NotAGenerator)?;
    if feed.is_empty() {
        return Err(Error::Usage("continuing needs the token at the position to feed".into()));
    }
    let fed = feed.len();
    let end = fed.checked_add(steps).and_then(|n| position.checked_add(u64::try_from(n).ok()?));
    let end = end.filter(|&end| i64::try_from(end).is_ok()).ok_or_else(|| {
        Error::Usage(format!(
            "{fed} tokens fed and {steps} decode steps from position {position} run past position {}, the last a position input holds",
            i64::MAX
        ))
    })?;
    if let Some(max) = g.max_positions.filter(|&max| end > max) {
        return Err(Error::Usage(format!(
            "{fed} tokens fed and {steps} decode steps from position {position} do not fit: the caches hold {max} positions"
        )));
    }
    // `position <= end`, which fits an i64.
    let mut position = i64::try_from(position).map_err(|_| Error::Usage(format!("position {position}")))?;
    let mut tokens = Vec::with_capacity(reserve(&g, steps).saturating_add(1));
    let (method, _) = run_calls(program, &g, &feed_calls(program, &g, feed, position)?)?;
    let mut token = read_token(program, &g, method)?;
    position += fed as i64;
    tokens.push(token);
    for _ in 0..steps {
        token = step(program, &g, token, position)?;
        position += 1;
        tokens.push(token);
    }
    program.set_position(u64::try_from(position).ok());
    Ok(tokens)
}

/// One decode step: `token` at `position`, run to completion, the next token read back.
fn step(program: &mut Program, g: &Generate, token: i64, position: i64) -> Result<i64, Error> {
    program.write_input(&g.decode, &g.token_input, &i64_bytes(&[token]))?;
    program.write_input(&g.decode, &g.position_input, &i64_bytes(&[position]))?;
    program.execute(&g.decode)?;
    read_token(program, g, &g.decode)
}
