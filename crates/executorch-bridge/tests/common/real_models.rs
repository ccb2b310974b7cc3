//! The real-model fixtures (`fixtures/executorch/real/`, written by `cargo xtask export-pte`: Hugging Face
//! Llama and Qwen2 exported with transformers' recipe, and the hand-written Llama-style decoder, in f32 and
//! the half types) with torch eager's tokens and logits, and the check every runtime's run is held to.
//! Shared by executorch-bridge's and delegate-host's tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// One committed program and what torch eager made of it.
pub struct RealProgram {
    /// `llama_f32.pte` and so on.
    pub name: String,
    pub path: PathBuf,
    /// `f32`, `f16` or `bf16`.
    pub dtype: String,
    /// Eager's greedy tokens: the one after the prompt, then one per decode step.
    pub tokens: Vec<i64>,
    /// Eager's last logits row after the prompt and after each step (f32; the half model's rows for a half
    /// program).
    pub logits: Vec<Vec<f32>>,
    /// For a half program: the f32 arithmetic of its own weights, fed eager's tokens.
    pub oracle: Option<Vec<Vec<f32>>>,
    /// For a half program: eager's own largest error against the oracle, relative to the oracle's largest
    /// magnitude.
    pub eager_error: f32,
    /// How many nodes the partitioner left outside the delegate.
    pub outside: usize,
}

/// The fixtures: the prompt, the decode steps and every program.
pub struct RealFixtures {
    pub prompt: Vec<i64>,
    pub steps: usize,
    pub programs: Vec<RealProgram>,
}

/// Reads `fixtures/executorch/real/` under `root` (committed: a missing file fails, it is not skipped).
pub fn load(root: &Path) -> RealFixtures {
    let dir = root.join("fixtures/executorch/real");
    let text = std::fs::read_to_string(dir.join("expected.json")).expect("real/expected.json is committed");
    let expected: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let prompt = serde_json::from_value(expected["prompt"].clone()).expect("prompt");
    let steps = expected["steps"].as_u64().expect("steps") as usize;
    let mut programs = Vec::new();
    for (name, meta) in expected["programs"].as_object().expect("programs") {
        let rows = |key: &str| meta[key].as_str().map(|file| read_rows(&dir.join(file)));
        programs.push(RealProgram {
            name: name.clone(),
            path: dir.join(name),
            dtype: meta["dtype"].as_str().expect("dtype").to_owned(),
            tokens: serde_json::from_value(meta["tokens"].clone()).expect("tokens"),
            logits: rows("logits").expect("logits"),
            oracle: rows("oracle"),
            eager_error: meta["eager_vs_oracle"].as_f64().unwrap_or(0.0) as f32,
            outside: meta["outside"].as_array().expect("outside").len(),
        });
    }
    RealFixtures { prompt, steps, programs }
}

fn read_rows(path: &Path) -> Vec<Vec<f32>> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let file = npyz::NpyFile::new(&bytes[..]).expect("an .npy file");
    let width = file.shape()[1] as usize;
    let values: Vec<f32> = file.into_vec::<f32>().expect("f32 rows");
    values.chunks(width).map(<[f32]>::to_vec).collect()
}

/// The largest `|a - b|` over all rows, relative to the largest `|b|`.
pub fn relative_error(got: &[Vec<f32>], want: &[Vec<f32>]) -> f32 {
    let scale = want.iter().flatten().fold(0f32, |m, v| m.max(v.abs())).max(f32::MIN_POSITIVE);
    let worst = got.iter().zip(want).flat_map(|(g, w)| g.iter().zip(w)).map(|(a, b)| (a - b).abs());
    worst.fold(0f32, f32::max) / scale
}

/// Holds a run's tokens and logits rows to the fixture:
/// - f32: eager's tokens, and logits within 1e-4 of eager's largest magnitude (summation order only);
/// - f16 / bf16: eager's tokens in that type, and logits within twice eager's own error against the f32
///   oracle (the same weights computed in f32), at least 1% (f16) / 4% (bf16): the program may be no worse
///   than PyTorch's own half-precision run of the same module.
pub fn check(program: &RealProgram, tokens: &[i64], logits: &[Vec<f32>]) -> Result<(), String> {
    let name = &program.name;
    if tokens != program.tokens {
        return Err(format!("{name}: tokens {tokens:?}, eager's {:?}", program.tokens));
    }
    if logits.len() != program.logits.len() {
        return Err(format!("{name}: {} logits rows, eager has {}", logits.len(), program.logits.len()));
    }
    let (error, bound) = match &program.oracle {
        None => (relative_error(logits, &program.logits), 1e-4),
        Some(oracle) => {
            let floor = if program.dtype == "f16" { 0.01 } else { 0.04 };
            (relative_error(logits, oracle), (2.0 * program.eager_error).max(floor))
        }
    };
    if error > bound {
        return Err(format!("{name}: logits differ by {error} (relative), more than {bound}"));
    }
    Ok(())
}
