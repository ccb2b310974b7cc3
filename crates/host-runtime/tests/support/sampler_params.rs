//! The sampling parameters the device's sampler is compared with the host's on, shared by the device loop's
//! tests (on the GPU) and the sampler kernel's (on the CPU).

use sampling::Params;

/// Temperatures, every cut, the penalty both ways, greedy with a penalty (on the device: the argmax kernel),
/// and a seed with high bits.
pub fn parameter_sets() -> Vec<Params> {
    vec![
        Params { temperature: 1.0, seed: 1, ..Params::default() },
        Params { temperature: 0.7, top_k: 50, top_p: 0.9, seed: 7, ..Params::default() },
        Params { temperature: 1.3, min_p: 0.05, repetition_penalty: 1.3, seed: 42, ..Params::default() },
        Params { temperature: 0.0, repetition_penalty: 1.5, ..Params::default() },
        Params {
            temperature: 2.0,
            top_k: 1024,
            top_p: 0.5,
            repetition_penalty: 0.8,
            seed: u64::MAX - 5,
            ..Params::default()
        },
        Params { temperature: 0.5, top_k: 3, seed: 3, ..Params::default() },
    ]
}
