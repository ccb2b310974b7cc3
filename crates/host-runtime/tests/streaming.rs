//! `generate_streaming` on the host loop (a CPU program, the reference delegate running kv-example's tiny
//! decoder): every token reaches the callback in order, exactly once, each the host sampler's pick from that
//! step's logits given the history so far; a stop ends the generation at that token and leaves the position
//! after the tokens fed; plain greedy streams the program's own tokens. The device loop's streaming is
//! tested on a GPU (`tests/device_loop.rs`).

use std::path::Path;

use delegate_abi::host::HostConfig;
use host_runtime::generate::{generate, generate_choosing, generate_streaming, Options};
use host_runtime::manifest::Manifest;
use host_runtime::plugins::{Discovery, Registry};
use host_runtime::program::{Mode, Program};
use sampling::{Params, Sampler};

fn program(dir: &Path) -> Program {
    kv_example::export::reference(&kv_example::Config::tiny(), dir).expect("export");
    let registry = Registry::discover(Discovery::new())
        .with_embedded(reference_delegate::delegate_root(), &HostConfig::default());
    let manifest = Manifest::load(&dir.join("program.toml")).expect("manifest");
    Program::load(manifest, &registry, Mode::ZeroCopy).expect("loads")
}

/// The streamed tokens, checking their order, and the generation.
fn streamed(
    program: &mut Program,
    steps: usize,
    sampler: &Sampler,
    stop_at: Option<usize>,
) -> host_runtime::generate::StreamedGeneration {
    let mut seen = Vec::new();
    let generation = generate_streaming(program, &Options::steps(steps), sampler, |token| {
        assert_eq!(token.index, seen.len(), "in order, once each");
        assert_eq!(token.lag_tokens, 0, "the host loop runs no step ahead");
        seen.push(token.token);
        Ok(Some(token.index) != stop_at)
    })
    .expect("streams");
    assert_eq!(seen, generation.generation.tokens);
    assert!(!generation.stream.device_loop && !generation.stream.sampled_on_device);
    assert_eq!(generation.stream.tokens, seen.len());
    assert!(generation.stream.mean_lag_micros.is_some_and(|us| us >= 0.0));
    generation
}

#[test]
fn the_host_loop_streams_the_samplers_picks_in_order_and_honours_a_stop() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut program = program(dir.path());
    let prompt = program.manifest().generate.as_ref().expect("a generator").prompt.clone();
    let steps = 6;

    // Greedy: the program's own tokens.
    let greedy = generate(&mut program, steps, |_, _| Ok(())).expect("greedy").tokens;
    program.reset_buffers().expect("reset");
    assert_eq!(
        streamed(&mut program, steps, &Sampler::new(Params::default()).expect("valid"), None)
            .generation
            .tokens,
        greedy
    );

    // Sampled: the tokens `generate_choosing` picks with the same sampler from each step's logits and the
    // history so far (what `delegate-host run --temperature` did before streaming).
    let params =
        Params { temperature: 1.5, top_k: 20, repetition_penalty: 1.2, seed: 3, ..Params::default() };
    let sampler = Sampler::new(params).expect("valid");
    program.reset_buffers().expect("reset");
    let all = streamed(&mut program, steps, &sampler, None).generation.tokens;
    program.reset_buffers().expect("reset");
    let mut history = prompt.clone();
    let choose = |row: &[f32], index: usize| {
        let token = sampler.pick(row, &history, index as u64) as i64;
        history.push(token);
        token
    };
    let chosen =
        generate_choosing(&mut program, &Options::steps(steps), choose, |_, _| Ok(true)).expect("host");
    assert_eq!(all, chosen.tokens);
    assert_ne!(all, greedy, "the sampler drew other tokens than the argmax");

    // A stop at a token ends the generation there; the position follows the tokens fed.
    for stop in [0, 2] {
        program.reset_buffers().expect("reset");
        let cut = streamed(&mut program, steps, &sampler, Some(stop));
        assert_eq!(cut.generation.tokens, all[..=stop]);
        assert_eq!(program.position(), Some((prompt.len() + stop) as u64));
    }
}
