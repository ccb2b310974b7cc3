//! `run --prompt A --branch B`: two sequences from one prefix through the same delegate instances. Prompt A
//! is generated as a plain run does; the caches are then forked at the longest prefix the prompts share
//! (host-runtime's `Program::fork_into`: only that prefix's rows are copied, and the bytes are reported),
//! branch B is fed the rest of its prompt and decoded on the fork, and branch A, swapped back, decodes one
//! more step: both branches stay live.
//!
//! The fork's caches are allocated before A runs (`Program::new_caches`), which also refuses a program that
//! cannot fork (a plugin in a worker process, `--isolate`; one that does not state
//! `rewind_fork_without_reinit`) before anything is generated. Prompts that share nothing run B from position
//! 0 on those zeroed caches: nothing is copied.

use host_runtime::generate::{continue_from, generate_with, Options};
use host_runtime::program::{Caches, Error, Mode, Program};
use serde_json::{json, Value};

use crate::run::RunArgs;
use crate::{emit, failure, Failure};

/// Refuses the `run` options that contradict `--branch`, one line each.
pub fn refuse_options(args: &RunArgs) -> Result<(), Failure> {
    let refusals = [
        (!args.inputs.is_empty(), "--input", "it runs one method once, not a generation to fork"),
        (args.method.is_some(), "--method", "it runs one method once, not a generation to fork"),
        (args.prompt_cache.is_some(), "--prompt-cache", "the branches would save two states to one file"),
        (args.output_dir.is_some(), "--output-dir", "the two branches hold different buffers"),
        (args.position.is_some(), "--position", "the fork position follows from the prompts"),
        (args.hold_position, "--hold-position", "a held position overwrites the rows the fork shares"),
        (
            args.cuda_graph,
            "--cuda-graph",
            "a captured graph holds the caches' addresses, which a swap changes",
        ),
    ];
    match refusals.into_iter().find(|(given, ..)| *given) {
        Some((_, option, why)) => Err(failure(format!("--branch cannot be combined with {option}: {why}"))),
        None => Ok(()),
    }
}

/// The positions branch B takes from A's caches: the prompts' longest common prefix, leaving at least B's
/// last token to feed (it yields B's first generated token).
fn fork_position(a: &[i64], b: &[i64]) -> usize {
    let common = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    common.min(b.len().saturating_sub(1))
}

/// `--steps`, or the default of a plain run of A (`default`) less what both branches need past it: B's longer
/// prompt, or the one step A decodes after the swap, whichever is more; so both fit the caches.
pub fn steps(default: usize, given: Option<usize>, a: &[i64], b: &[i64]) -> usize {
    given.unwrap_or_else(|| default.saturating_sub(b.len().saturating_sub(a.len()).max(1)))
}

/// `err` from the fork as one line naming `--branch` (the library's code kept); a call in a worker process
/// is told how to run in process.
fn fork_failure(err: Error) -> Failure {
    let hint = match &err {
        Error::NotForkable { reason } if reason.contains("worker process") => {
            " (run without --isolate, and with no plugin manifest marked \"isolate\")"
        }
        _ => "",
    };
    let code = et_error::HasErrorCode::error_code(&err);
    Failure::coded(code, format!("--branch: {err}{hint}"))
}

/// What the two branches gave.
struct Branches {
    /// A's tokens: the plain run's (`steps` + 1).
    a: Vec<i64>,
    /// A's next token, decoded after swapping its caches back.
    a_next: i64,
    /// B's tokens (`steps` + 1).
    b: Vec<i64>,
    /// The positions B shares with A.
    fork_position: usize,
    /// The bytes the fork copied.
    bytes_copied: u64,
}

/// Generates prompt A (the program's) for `steps`, forks, runs `branch` on the fork, swaps back and decodes one
/// more step of A; prints both branches.
pub fn run(
    program: &mut Program,
    branch: &[i64],
    steps: usize,
    mode: Mode,
    json: bool,
) -> Result<(), Failure> {
    if branch.is_empty() {
        return Err(failure("--branch: the branch prompt is empty"));
    }
    let Some(g) = program.manifest().generate.clone() else {
        return Err(failure("--branch forks a generation, but the program is not a token generator"));
    };
    let mut other = program.new_caches().map_err(fork_failure)?;
    let a = generate_with(program, &Options::steps(steps), |_, _| Ok(()))?.tokens;
    let fork_position = fork_position(&g.prompt, branch);
    let bytes_copied = match fork_position {
        0 => 0,
        p => program.fork_into(p as u64, &mut other).map_err(fork_failure)?,
    };
    let b = on_other(program, &mut other, |p| {
        continue_from(p, fork_position as u64, &branch[fork_position..], steps)
    })?;
    // A's generation fitted its positions, so this does too; were it not, `continue_from` would refuse it.
    let a_position = u64::try_from(g.prompt.len().saturating_add(steps)).unwrap_or(u64::MAX);
    let a_next = continue_from(program, a_position, &a[steps..], 0)?[0];
    let branches = Branches { a, a_next, b, fork_position, bytes_copied };
    report(&branches, branch, mode, json)
}

/// Runs `f` with `other` swapped in as the program's caches, then swaps them back (also when `f` failed).
fn on_other(
    program: &mut Program,
    other: &mut Caches,
    f: impl FnOnce(&mut Program) -> Result<Vec<i64>, Error>,
) -> Result<Vec<i64>, Failure> {
    program.swap_caches(other).map_err(fork_failure)?;
    let result = f(program);
    program.swap_caches(other).map_err(fork_failure)?;
    Ok(result?)
}

fn report(branches: &Branches, prompt: &[i64], mode: Mode, json: bool) -> Result<(), Failure> {
    if json {
        let value: Value = json!({
            "mode": mode,
            "tokens": branches.a,
            "branch": {
                "prompt": prompt,
                "fork_position": branches.fork_position,
                "bytes_copied": branches.bytes_copied,
                "tokens": branches.b,
                "a_next_token": branches.a_next,
            },
        });
        return emit(&format!("{value}\n"));
    }
    let fork = match branches.fork_position {
        0 => "the prompts share no prefix: branch B ran from position 0 on new caches (0 bytes copied)"
            .to_owned(),
        p => format!(
            "forked at position {p} (the prompts' shared prefix), {} bytes copied",
            branches.bytes_copied
        ),
    };
    emit(&format!(
        "tokens: {:?}\nbranch: {fork}\nbranch tokens: {:?}\nafter swapping back, branch A's next token: {}\n",
        branches.a, branches.b, branches.a_next
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fork_is_the_shared_prefix_leaving_a_token_of_b_to_feed() {
        assert_eq!(fork_position(&[1, 2, 3, 4], &[1, 2, 9]), 2);
        assert_eq!(fork_position(&[1, 2, 3, 4], &[1, 2, 3, 4]), 3, "the same prompt: feed its last token");
        assert_eq!(fork_position(&[1, 2], &[1, 2, 3, 4]), 2, "at most A's prompt");
        assert_eq!(fork_position(&[1, 2], &[5, 2]), 0);
        assert_eq!(fork_position(&[1, 2], &[]), 0);
    }

    #[test]
    fn the_default_steps_leave_room_for_the_longer_prompt_and_a_last_step_of_a() {
        assert_eq!(steps(12, None, &[1, 2, 3, 4], &[1, 2]), 11);
        assert_eq!(steps(12, None, &[1, 2], &[1, 2, 3, 4]), 10);
        assert_eq!(steps(12, None, &[1, 2], &[1, 2, 3]), 11, "B's one more token, or A's one more step");
        assert_eq!(steps(12, Some(5), &[1], &[1, 2, 3]), 5);
        assert_eq!(steps(0, None, &[1], &[1]), 0);
    }
}
