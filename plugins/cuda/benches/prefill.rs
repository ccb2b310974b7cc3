//! `prefill`: time to first token of a prompt on the CUDA delegate, for prompts of several lengths, beside
//! the compute floor measured in the same run. The decoder is `tests/support/hf.rs`'s hand-built Hugging Face
//! form (Llama-3.2-1B's shape by default), its prefill graph built with one row per prompt token (the chunk is
//! the whole prompt: one call, its products GEMMs on tensor cores); the call is captured as a CUDA graph and
//! replayed at position 0 (each replay rewrites the same cache rows), so a figure is the GPU time of the call
//! that writes the prompt's cache rows and picks the first token (`support/decode.rs`).
//!
//! ```text
//! prefill [--preset llama-1b|qwen-0.5b|tiny-26m|tiny] [--lengths 128,1024,4096] [--steps N] [--check]
//! ```
//!
//! The floor of a prompt of `T` tokens is `2 x parameters x T` FLOPs at the bf16 dense rate a large cuBLAS
//! GEMM (`8192^3`, bf16 in, f32 accumulation) reaches in this run. `--check` builds every graph and prints
//! the JSON without a GPU (no timing). Prints one JSON object; `gpu/run.sh prefill-bench` puts PyTorch's
//! compiled prefill beside it (`gpu/prefill_torch.py`).

use std::process::ExitCode;

use cuda_rt::{Allocation, Blas, Context, Device, Event, GemmEx, GemmType, Sgemm, Stream};
use ref_graph::ElemType;

#[path = "../tests/support/hf.rs"]
mod hf;
mod support;

use hf::Hf;

struct Args {
    preset: String,
    lengths: Vec<u64>,
    steps: usize,
    check: bool,
}

fn parse() -> Result<Args, String> {
    let mut args = Args { preset: "llama-1b".into(), lengths: vec![128, 1024, 4096], steps: 5, check: false };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--preset" => args.preset = value()?,
            "--lengths" => {
                args.lengths = value()?
                    .split(',')
                    .map(|v| v.trim().parse::<u64>().map_err(|e| format!("--lengths {v}: {e}")))
                    .collect::<Result<_, _>>()?;
            }
            "--steps" => args.steps = value()?.parse::<usize>().map_err(|e| format!("--steps: {e}"))?.max(1),
            "--check" => args.check = true,
            "--bench" => {} // what `cargo bench` passes
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if args.lengths.is_empty() || args.lengths.contains(&0) {
        return Err("--lengths takes one or more prompt lengths of at least one token".into());
    }
    Ok(args)
}

/// The preset's sizes with a cache of `max_len` rows.
fn shape(preset: &str, max_len: u64) -> Result<Hf, String> {
    match preset {
        "llama-1b" => Ok(Hf::llama_1b(max_len)),
        "qwen-0.5b" => Ok(Hf::qwen_0_5b(max_len)),
        "tiny-26m" => Ok(Hf::tiny_26m(max_len)),
        "tiny" => Ok(Hf { max_len, ..Hf::tiny(ElemType::Bf16) }),
        other => Err(format!("unknown preset {other} (llama-1b, qwen-0.5b, tiny-26m or tiny)")),
    }
}

fn text(err: impl std::fmt::Display) -> String {
    err.to_string()
}

/// The bf16 dense rate (FLOP/s) of one `n x n x n` cuBLAS GEMM, bf16 in and out with f32 accumulation: the
/// mean of `iters` products between two events, after 3 untimed ones. The inputs hold small finite values.
fn bf16_dense_rate(n: usize, iters: usize) -> Result<f64, String> {
    let ctx = Context::open(0).map_err(text)?;
    let mut blas = Blas::new(&ctx).map_err(text)?;
    blas.set_workspace(Allocation::<Device>::zeroed(&ctx, 32 << 20).map_err(text)?);
    let bytes = n * n * 2;
    let values: Vec<u8> = (0..n * n)
        .flat_map(|i| half::bf16::from_f32(((i * 7919) % 1000) as f32 / 1000.0 - 0.5).to_le_bytes())
        .collect();
    let mut a = Allocation::<Device>::zeroed(&ctx, bytes).map_err(text)?;
    a.write(&values).map_err(text)?;
    let mut b = Allocation::<Device>::zeroed(&ctx, bytes).map_err(text)?;
    b.write(&values).map_err(text)?;
    let c = Allocation::<Device>::zeroed(&ctx, bytes).map_err(text)?;
    let gemm = GemmEx {
        dtype: GemmType::Bf16,
        product: Sgemm {
            transpose_a: true,
            transpose_b: false,
            m: n,
            n,
            k: n,
            alpha: 1.0,
            a: a.device_ptr(),
            lda: n,
            b: b.device_ptr(),
            ldb: n,
            beta: 0.0,
            c: c.device_ptr(),
            ldc: n,
        },
    };
    let stream = Stream::new(&ctx).map_err(text)?;
    let mut run = || {
        // SAFETY: `a`, `b` and `c` are this function's device allocations of `n x n` bf16 values, alive until
        // the stream is synchronised below; nothing else touches them.
        unsafe { blas.gemm_ex(stream.as_ref(), &gemm) }.map_err(text)
    };
    for _ in 0..3 {
        run()?;
    }
    let (start, end) = (Event::timed(&ctx).map_err(text)?, Event::timed(&ctx).map_err(text)?);
    start.record(stream.as_ref()).map_err(text)?;
    for _ in 0..iters {
        run()?;
    }
    end.record(stream.as_ref()).map_err(text)?;
    end.synchronize().map_err(text)?;
    let seconds = f64::from(end.elapsed_ms(&start).map_err(text)?) / 1e3 / iters as f64;
    Ok(2.0 * (n as f64).powi(3) / seconds)
}

fn run(args: Args) -> Result<String, String> {
    let probe = 8192;
    let rate = if args.check { None } else { Some(bf16_dense_rate(probe, 20)?) };
    let mut lengths = Vec::new();
    let mut sizes = None;
    for &tokens in &args.lengths {
        let cfg = shape(&args.preset, tokens)?;
        let started = std::time::Instant::now();
        let graph = hf::build(&cfg, tokens);
        let build_s = started.elapsed().as_secs_f64();
        let parameters: u64 = graph.constants().map(|(id, _)| graph.tensor(id).numel() as u64).sum();
        let flops = 2.0 * parameters as f64 * tokens as f64;
        let mut entry = serde_json::json!({
            "tokens": tokens, "chunk": tokens, "parameters": parameters, "floor_flops": flops,
            "build_s": (build_s * 10.0).round() / 10.0,
        });
        if let Some(rate) = rate {
            let timed = support::decode::time_decode(&graph, 0, args.steps)?;
            let us = timed.gpu_us_per_step;
            let floor_us = flops / rate * 1e6;
            let timing = serde_json::json!({
                "ttft_us": (us * 10.0).round() / 10.0,
                "tokens_per_s": (tokens as f64 / us * 1e6).round(),
                "floor_us": (floor_us * 10.0).round() / 10.0,
                "x_floor": (us / floor_us * 1000.0).round() / 1000.0,
                "init_s": (timed.init_s * 10.0).round() / 10.0,
            });
            if let (Some(entry), serde_json::Value::Object(timing)) = (entry.as_object_mut(), timing) {
                entry.extend(timing);
            }
        }
        eprintln!("prefill: {entry}");
        lengths.push(entry);
        sizes.get_or_insert(cfg);
    }
    let cfg = sizes.expect("at least one length");
    Ok(serde_json::json!({
        "name": args.preset, "layers": cfg.layers, "dim": cfg.dim, "heads": cfg.heads,
        "kv_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "ffn": cfg.ffn, "vocab": cfg.vocab, "dtype": cfg.dtype.to_string(),
        "tied": cfg.tied, "bias": cfg.bias, "graph": "hand-built", "chunk": "the whole prompt",
        "max_len": args.lengths.iter().max(), "steps": args.steps, "check": args.check,
        "bf16_dense_flops_per_s": rate,
        "rate_probe": format!("cuBLAS GEMM {probe}^3, bf16, f32 accumulation"),
        "lengths": lengths,
    })
    .to_string())
}

fn main() -> ExitCode {
    support::report::finish("prefill", parse().and_then(run))
}
