//! `run --prompt-cache FILE`: the caches of an earlier run kept in FILE (host-runtime's cache file), the
//! longest saved prefix that matches the prompt reused, only the rest of the prompt fed, and the new state
//! saved back at the end.
//!
//! Without a usable prefix (no file yet, or nothing in common) the prompt runs through the prefill method as
//! a plain `run` does; with one, the caches are restored, rewound to the shared prefix, and the rest of the
//! prompt is fed as a prompt is (`continue_from`: chunks through a prefill method, the rest through decode).
//! Time to first token is from before the restore to the first generated token.

use std::path::Path;
use std::time::Instant;

use host_runtime::generate::{check_fit, continue_from, generate_with, Options};
use host_runtime::program::{Mode, Program};
use serde_json::json;

use crate::{emit, Failure};

/// What the prompt cache did for one run.
struct Reuse {
    /// Prompt positions taken from the file.
    reused: usize,
    /// Prompt tokens fed.
    fed: usize,
    /// From before the restore to the first generated token, in microseconds.
    first_token_micros: f64,
}

/// How many of `prompt`'s first tokens the saved `tokens` share, leaving at least the prompt's last token to
/// feed (it yields the first generated token).
fn shared_prefix(saved: &[i64], prompt: &[i64]) -> usize {
    let common = saved.iter().zip(prompt).take_while(|(a, b)| a == b).count();
    common.min(prompt.len().saturating_sub(1))
}

/// Generates `steps` decode steps after the prompt with the prompt cache in `file`, prints the tokens and
/// what the cache reused, and saves the caches back to `file`.
pub fn run(program: &mut Program, file: &Path, steps: usize, mode: Mode, json: bool) -> Result<(), Failure> {
    let g = program.manifest().generate.clone().expect("run_program checked [generate]");
    let prompt = g.prompt.clone();
    // Before the file is read: steps that do not fit are refused as a plain run refuses them.
    check_fit(program, &Options::steps(steps))?;
    let start = Instant::now();
    let reused = match file.exists() {
        true => shared_prefix(&program.restore_cache(file)?.tokens, &prompt),
        false => 0,
    };
    let (tokens, first_token_micros) = if reused == 0 {
        let generation = generate_with(program, &Options::steps(steps), |_, _| Ok(()))?;
        let first = generation.steps.first().map_or(0.0, |s| s.micros);
        (generation.tokens, first)
    } else {
        program.rewind(reused as u64)?;
        let mut tokens = continue_from(program, reused as u64, &prompt[reused..], 0)?;
        let first = start.elapsed().as_secs_f64() * 1e6;
        if steps > 0 {
            let position = prompt.len() as u64;
            let rest = continue_from(program, position, &tokens[..1], steps - 1)?;
            tokens.extend(rest);
        }
        (tokens, first)
    };
    let fed: Vec<i64> = prompt.iter().chain(&tokens[..steps]).copied().collect();
    program.save_cache(file, fed.len() as u64, &fed)?;
    let reuse = Reuse { reused, fed: prompt.len() - reused, first_token_micros };
    report(&tokens, &reuse, file, mode, json)
}

fn report(tokens: &[i64], reuse: &Reuse, file: &Path, mode: Mode, json: bool) -> Result<(), Failure> {
    if json {
        let value = json!({
            "mode": mode,
            "tokens": tokens,
            "prompt_cache": {
                "file": file,
                "reused_positions": reuse.reused,
                "fed_prompt_tokens": reuse.fed,
                "first_token_us": reuse.first_token_micros,
            },
        });
        return emit(&format!("{value}\n"));
    }
    emit(&format!(
        "tokens: {tokens:?}\nprompt cache {}: {} prompt positions reused, {} fed; first token after {:.1} us\n",
        file.display(),
        reuse.reused,
        reuse.fed,
        reuse.first_token_micros
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shared_prefix_leaves_the_last_prompt_token_to_feed() {
        assert_eq!(shared_prefix(&[1, 2, 3, 4, 9], &[1, 2, 3, 5]), 3);
        assert_eq!(
            shared_prefix(&[1, 2, 3, 4, 9], &[1, 2, 3, 4]),
            3,
            "the whole prompt saved: feed its last"
        );
        assert_eq!(shared_prefix(&[7], &[1, 2]), 0);
        assert_eq!(shared_prefix(&[], &[]), 0);
    }
}
