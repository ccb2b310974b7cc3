//! The device loop's sampler kernel (`src/cuda/sample.cu`) run on the CPU, compared with the contract's
//! oracle, `sampling::Sampler::pick`: the kernel's selection of the candidates (a radix select by block
//! reductions, ties at the threshold taken in id order by warp ballots), its bitonic sort, its sums and its
//! draw give the host's token, for every element type the kernel reads, every parameter and the corner rows
//! (ties, NaN, infinities, signed zeros, f16 subnormals, vocabularies around the candidate bound).
//!
//! The emulation (`support/sample_emulation.cpp`) runs one CUDA block as 1024 threads of the host C++
//! compiler (`$CXX`, else `c++`, C++20). Without one the test says so and checks nothing, unless
//! `KV_REQUIRE_CXX` is set; the GPU itself is compared in `tests/device_loop.rs`.

use std::path::Path;
use std::process::Command;

use sampling::{Params, Sampler};

#[path = "support/sampler_params.rs"]
mod sampler_params;

/// One draw: the row, the parameters, the history and the step.
struct Case {
    logits: Vec<f32>,
    /// 0 f32, 1 f16, 2 bf16: the row as the kernel reads it (the oracle reads the same values widened).
    dtype: u32,
    params: Params,
    history: Vec<i64>,
    step: u32,
}

/// xorshift64: the cases' deterministic randomness.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// The device loop's parameter sets, and two more cuts: a single candidate, and a wide nucleus under a
/// high floor.
fn parameter_sets() -> Vec<Params> {
    let mut sets = sampler_params::parameter_sets();
    sets.extend([
        Params { temperature: 1.0, top_k: 1, seed: 5, ..Params::default() },
        Params { temperature: 3.0, top_p: 0.99, min_p: 0.2, seed: 99, ..Params::default() },
    ]);
    sets
}

/// A row of `vocab` logits of `kind`: 0 ties (41 levels), 1 distinct, 2 NaNs and negative infinities among
/// ties, 3 signed zeros and one positive infinity, 4 values around f16's subnormals.
fn row(kind: usize, vocab: usize, state: &mut u64) -> Vec<f32> {
    let mut row: Vec<f32> = (0..vocab)
        .map(|_| {
            let r = next(state);
            match kind {
                0 => (r % 41) as f32 * 0.25 - 5.0,
                1 => ((r >> 11) as f64 / (1u64 << 53) as f64 * 20.0 - 10.0) as f32,
                2 if r % 7 == 0 => f32::NAN,
                2 if r % 11 == 0 => f32::NEG_INFINITY,
                2 => (r % 9) as f32 - 4.0,
                3 if r % 2 == 0 => 0.0,
                3 => -0.0,
                _ => (r % 64) as f32 * 1e-6,
            }
        })
        .collect();
    if kind == 3 && vocab > 5 {
        row[vocab / 2] = f32::INFINITY;
    }
    row
}

fn cases() -> Vec<Case> {
    let mut state = 0x1234_5678_9abc_def0u64;
    let mut cases = Vec::new();
    for (i, params) in parameter_sets().into_iter().enumerate() {
        for (j, vocab) in [1usize, 7, 1024, 1025, 3000].into_iter().enumerate() {
            let kind = (i + j) % 5;
            let dtype = ((i + 2 * j) % 3) as u32;
            let logits = row(kind, vocab, &mut state)
                .into_iter()
                .map(|l| match dtype {
                    1 => half::f16::from_f32(l).to_f32(),
                    2 => half::bf16::from_f32(l).to_f32(),
                    _ => l,
                })
                .collect();
            let history = (0..next(&mut state) % 20)
                .map(|_| (next(&mut state) % (vocab as u64 + 3)) as i64 - 1)
                .collect();
            let step = (next(&mut state) % 1000) as u32;
            cases.push(Case { logits, dtype, params, history, step });
        }
    }
    cases
}

fn encode(cases: &[Case]) -> Vec<u8> {
    let mut out = (cases.len() as u32).to_le_bytes().to_vec();
    for c in cases {
        let p = &c.params;
        out.extend((c.logits.len() as u32).to_le_bytes());
        out.extend(c.dtype.to_le_bytes());
        out.extend(p.temperature.to_le_bytes());
        out.extend((p.top_k as u32).to_le_bytes());
        for value in [p.top_p, p.min_p, p.repetition_penalty] {
            out.extend(value.to_le_bytes());
        }
        out.extend(p.seed.to_le_bytes());
        out.extend(c.step.to_le_bytes());
        out.extend((c.history.len() as u32).to_le_bytes());
        for id in &c.history {
            out.extend(id.to_le_bytes());
        }
        for &l in &c.logits {
            match c.dtype {
                1 => out.extend(half::f16::from_f32(l).to_bits().to_le_bytes()),
                2 => out.extend(half::bf16::from_f32(l).to_bits().to_le_bytes()),
                _ => out.extend(l.to_le_bytes()),
            }
        }
    }
    out
}

/// Builds the emulation in `dir`, or `None` without a C++20 compiler (unless `KV_REQUIRE_CXX` is set).
fn build(dir: &Path) -> Option<std::path::PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let compiler = std::env::var("CXX").unwrap_or_else(|_| "c++".to_owned());
    let exe = dir.join("sample_emulation");
    let source = root.join("src/cuda/sample.cu");
    let built = Command::new(&compiler)
        .args(["-std=c++20", "-O1", "-ffp-contract=off", "-pthread"])
        .arg(format!("-DKV_SAMPLE_SOURCE=\"{}\"", source.display()))
        .arg(root.join("tests/support/sample_emulation.cpp"))
        .arg("-o")
        .arg(&exe)
        .output();
    match built {
        Ok(out) if out.status.success() => Some(exe),
        Ok(out) => {
            panic!("{compiler} could not build the emulation: {}", String::from_utf8_lossy(&out.stderr))
        }
        Err(err) => {
            assert!(
                std::env::var_os("KV_REQUIRE_CXX").is_none(),
                "KV_REQUIRE_CXX is set but {compiler}: {err}"
            );
            eprintln!("this test needs a C++20 compiler ({compiler}: {err}); nothing was checked");
            None
        }
    }
}

#[test]
fn the_sampler_kernel_emulated_on_the_cpu_picks_the_host_samplers_tokens() {
    let dir = tempfile::tempdir().expect("temp dir");
    let Some(exe) = build(dir.path()) else { return };
    let cases = cases();
    let (input, output) = (dir.path().join("cases.bin"), dir.path().join("tokens.bin"));
    std::fs::write(&input, encode(&cases)).expect("cases");
    let status = Command::new(&exe).arg(&input).arg(&output).status().expect("runs");
    assert!(status.success(), "{status}");
    let tokens = std::fs::read(&output).expect("tokens");
    assert_eq!(tokens.len(), cases.len() * 8);
    let mut disagree = Vec::new();
    for (c, token) in cases.iter().zip(tokens.chunks_exact(8)) {
        let kernel = i64::from_le_bytes(token.try_into().expect("8 bytes"));
        let host =
            Sampler::new(c.params).expect("valid").pick(&c.logits, &c.history, u64::from(c.step)) as i64;
        if kernel != host {
            disagree.push(format!(
                "vocab {} dtype {} {:?} step {}: kernel {kernel}, host {host}",
                c.logits.len(),
                c.dtype,
                c.params,
                c.step
            ));
        }
    }
    assert!(disagree.is_empty(), "{} of {} cases:\n{}", disagree.len(), cases.len(), disagree.join("\n"));
}
