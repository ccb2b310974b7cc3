//! `hf_decode`: GPU time per decode step of a Hugging Face-form decoder on the CUDA delegate, replayed as a
//! CUDA graph at a held position, and the bytes that step must read (its floor, over a bandwidth measured in
//! the same run, is `gpu/run.sh bench`'s). The decoder is `tests/support/hf.rs`'s: RMSNorm, grouped-query
//! attention over head-major caches updated in place, rotate-half RoPE, SwiGLU; random seeded weights.
//!
//! ```text
//! hf_decode [--preset llama-1b|qwen-0.5b|tiny-26m|tiny] [--position P] [--max-len L] [--steps N]
//! ```
//!
//! `llama-1b` is Llama-3.2-1B's shape (16 layers, hidden 2048, 32 query and 8 KV heads of 64, SwiGLU 8192,
//! vocabulary 128 256, tied embeddings, no biases, bf16; norms as `rms_norm` ops, as the Python lowering
//! fuses them); `qwen-0.5b` Qwen2.5-0.5B's and `tiny-26m` issue 45's 26 M-parameter Llama (the shapes
//! `export_decode` runs exported); `tiny` is the GPU tests' model. Needs a GPU; prints one JSON object
//! (`support/report.rs`).

use std::process::ExitCode;

use ref_graph::ElemType;

#[path = "../tests/support/hf.rs"]
mod hf;
mod support;

use hf::Hf;

struct Args {
    name: String,
    cfg: Hf,
    position: i64,
    steps: usize,
}

fn parse() -> Result<Args, String> {
    let mut preset = "llama-1b".to_owned();
    let (mut position, mut max_len, mut steps) = (1024i64, 2048u64, 100usize);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |v: String| v.parse::<u64>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--preset" => preset = value()?,
            "--position" => position = number(value()?)? as i64,
            "--max-len" => max_len = number(value()?)?,
            "--steps" => steps = number(value()?)? as usize,
            "--bench" => {} // what `cargo bench` passes
            other => return Err(format!("unknown argument {other}")),
        }
    }
    let cfg = match preset.as_str() {
        "llama-1b" => Hf::llama_1b(max_len),
        "tiny" => Hf::tiny(ElemType::Bf16),
        other => export_shape(other, max_len)
            .ok_or_else(|| format!("unknown preset {other} (llama-1b, qwen-0.5b, tiny-26m or tiny)"))?,
    };
    if position < 0 || position as u64 >= cfg.max_len {
        return Err(format!("position {position} is outside the {}-row cache", cfg.max_len));
    }
    Ok(Args { name: preset, cfg, position, steps: steps.max(1) })
}

/// The presets of the other shapes `export_decode` runs exported (issue 45).
fn export_shape(preset: &str, max_len: u64) -> Option<Hf> {
    match preset {
        "qwen-0.5b" => Some(Hf::qwen_0_5b(max_len)),
        "tiny-26m" => Some(Hf::tiny_26m(max_len)),
        _ => None,
    }
}

fn run(args: Args) -> Result<String, String> {
    let cfg = &args.cfg;
    let started = std::time::Instant::now();
    let graph = hf::build(cfg, 1);
    let build_s = started.elapsed().as_secs_f64();
    let timed = support::decode::time_decode(&graph, args.position, args.steps)?;
    let sizes = support::report::Sizes {
        name: args.name,
        layers: cfg.layers as u64,
        dim: cfg.dim,
        heads: cfg.heads,
        kv_heads: cfg.kv_heads,
        head_dim: cfg.head_dim,
        ffn: cfg.ffn,
        vocab: cfg.vocab,
        max_len: cfg.max_len,
        dtype: cfg.dtype.to_string(),
        tied: cfg.tied,
        bias: cfg.bias,
    };
    let graph_kind = serde_json::json!({ "graph": "hand-built" });
    Ok(support::report::json(&sizes, &graph, args.position as u64, args.steps, &timed, build_s, graph_kind))
}

fn main() -> ExitCode {
    support::report::finish("hf_decode", parse().and_then(run))
}
