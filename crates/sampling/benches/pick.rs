//! What the host loop pays to draw one token: [`Sampler::pick`] over one row of logits at the vocabularies
//! users have (Llama 3's 128 256 ids, Llama 2's 32 000), for greedy and for the settings chat front ends use.
//! The logits are seeded pseudo-random values in the spread a language model's logits have (a few units),
//! the history a 512-token conversation.
//!
//! `cargo bench -p sampling --bench pick`.

use criterion::{BenchmarkId, Criterion};
use sampling::{Params, Sampler};

/// (label, parameters): greedy, and the samplers of a chat front end.
fn settings() -> [(&'static str, Params); 5] {
    let warm = Params { temperature: 0.8, seed: 7, ..Params::default() };
    [
        ("greedy", Params::default()),
        ("top_k_40", Params { top_k: 40, ..warm }),
        ("top_p_0.95", Params { top_p: 0.95, ..warm }),
        ("min_p_0.05", Params { min_p: 0.05, ..warm }),
        ("top_p_0.95_penalty_1.1", Params { top_p: 0.95, repetition_penalty: 1.1, ..warm }),
    ]
}

/// `len` logits from a fixed linear congruential sequence, spread over about [-8, 8).
fn logits(len: usize) -> Vec<f32> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    (0..len)
        .map(|_| {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 16.0 - 8.0
        })
        .collect()
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    let history: Vec<i64> = (0..512i64).map(|i| (i * 2_654_435_761) % 32_000).collect();
    for vocab in [128_256usize, 32_000] {
        let row = logits(vocab);
        let mut group = criterion.benchmark_group(format!("pick_vocab_{vocab}"));
        for (label, params) in settings() {
            let sampler = Sampler::new(params).expect("valid parameters");
            let mut step = 0u64;
            group.bench_function(BenchmarkId::from_parameter(label), |b| {
                b.iter(|| {
                    step += 1;
                    sampler.pick(&row, &history, step)
                })
            });
        }
        group.finish();
    }
    criterion.final_summary();
}
