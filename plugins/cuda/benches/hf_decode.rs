//! `hf_decode`: GPU time per decode step of a Hugging Face-form decoder on the CUDA delegate, replayed as a
//! CUDA graph at a held position, and the bytes that step must read (its floor, over a bandwidth measured in
//! the same run, is `gpu/run.sh bench`'s). The decoder is `tests/support/hf.rs`'s: RMSNorm, grouped-query
//! attention over head-major caches updated in place, rotate-half RoPE, SwiGLU; random seeded weights.
//!
//! ```text
//! hf_decode [--preset llama-1b|tiny] [--position P] [--max-len L] [--steps N]
//! ```
//!
//! `llama-1b` is Llama-3.2-1B's shape (16 layers, hidden 2048, 32 query and 8 KV heads of 64, SwiGLU 8192,
//! vocabulary 128 256, tied embeddings, no biases, bf16; norms as `rms_norm` ops, as the Python lowering
//! fuses them); `tiny` is the GPU tests' model. Needs a GPU; prints one JSON object.

use std::process::ExitCode;

use cuda_rt::{Allocation, Context, Device, Event, Stream};
use delegate_abi::host::{ArgList, Instance, Plugin, Slot};
use delegate_abi::{CudaStream, DTypeCode, InitContext};
use host_runtime::cuda::{push_raw, push_raw_input, Access, RawInput, RawMemory};
use ref_graph::{ElemType, Graph};

#[path = "../tests/support/hf.rs"]
mod hf;

use hf::Hf;

struct Args {
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
        other => return Err(format!("unknown preset {other} (llama-1b or tiny)")),
    };
    if position < 0 || position as u64 >= cfg.max_len {
        return Err(format!("position {position} is outside the {}-row cache", cfg.max_len));
    }
    Ok(Args { cfg, position, steps: steps.max(1) })
}

/// The bytes a decode step at `position` must read: every weight once (an untied embedding table only its
/// one row) and the valid K and V prefix of every layer.
fn bytes_per_step(graph: &Graph, cfg: &Hf, position: i64) -> u64 {
    let weights: u64 = graph.constants().map(|(id, _)| graph.tensor(id).nbytes() as u64).sum();
    let embed = if cfg.tied { 0 } else { (cfg.vocab - 1) * cfg.dim * cfg.dtype.size_bytes() as u64 };
    let kv = 2 * cfg.layers as u64 * cfg.kv_heads * (position as u64 + 1) * cfg.head_dim;
    weights - embed + kv * cfg.dtype.size_bytes() as u64
}

/// The decode call's arguments, all device memory: ids, position, caches (in place), logits, next token.
struct Io {
    ids: Allocation<Device>,
    pos: Allocation<Device>,
    caches: Vec<Allocation<Device>>,
    logits: Allocation<Device>,
    next: Allocation<Device>,
}

fn text(err: impl std::fmt::Display) -> String {
    err.to_string()
}

fn call(instance: &mut Instance, graph: &Graph, io: &mut Io, stream: &Stream) -> Result<(), String> {
    let shape = |name: &str| -> Vec<i64> {
        graph
            .tensor(graph.find(name).expect("a tensor of the decoder"))
            .shape
            .iter()
            .map(|&d| d as i64)
            .collect()
    };
    let dtype = graph.tensor(graph.find(hf::LOGITS).expect("logits")).dtype;
    let code = DTypeCode::try_from(dtype.dtype()).map_err(|e| format!("{e:?}"))?;
    let cache_shape = shape(&hf::k_cache(0));
    let mut list = ArgList::new();
    let Io { ids, pos, caches, logits, next } = io;
    push_raw_input(&mut list, RawInput::device(ids), DTypeCode::I64, &shape(hf::IDS)).map_err(text)?;
    push_raw_input(&mut list, RawInput::device(pos), DTypeCode::I64, &[1]).map_err(text)?;
    let slots: Vec<Slot> = caches
        .iter_mut()
        .map(|c| push_raw(&mut list, RawMemory::device(c), code, &cache_shape, Access::InOut))
        .collect::<Result<_, _>>()
        .map_err(text)?;
    push_raw(&mut list, RawMemory::device(logits), code, &shape(hf::LOGITS), Access::Write).map_err(text)?;
    push_raw(&mut list, RawMemory::device(next), DTypeCode::I64, &[1], Access::Write).map_err(text)?;
    for slot in slots {
        list.push_output_in_place(slot, code, &cache_shape).map_err(text)?;
    }
    // SAFETY: `stream` is a live stream of the device's primary context, alive until it is synchronised.
    let raw = unsafe { CudaStream::from_raw(stream.as_ref().as_raw()) };
    instance.execute(&mut list, raw).map(|_| ()).map_err(text)
}

fn run(args: Args) -> Result<String, String> {
    let cfg = &args.cfg;
    let ctx = Context::open(0).map_err(text)?;
    let started = std::time::Instant::now();
    let graph = hf::build(cfg, 1);
    let blob = hf::blob(&graph, cuda_delegate::BACKEND_ID);
    let plugin = Plugin::embedded(cuda_delegate::delegate_root()).map_err(text)?;
    let mut instance =
        plugin.init(&InitContext { blob: &blob, compile_specs: &[], runtime_specs: &[] }).map_err(text)?;
    drop(blob);
    let build_s = started.elapsed().as_secs_f64();
    let alloc = |bytes: usize| Allocation::<Device>::zeroed(&ctx, bytes).map_err(text);
    let cache_bytes = cfg.cache_shape().iter().product::<u64>() as usize * cfg.dtype.size_bytes();
    let logits = graph.tensor(graph.find(hf::LOGITS).expect("logits")).nbytes();
    let mut io = Io {
        ids: alloc(8)?,
        pos: alloc(8)?,
        caches: (0..2 * cfg.layers).map(|_| alloc(cache_bytes)).collect::<Result<_, _>>()?,
        logits: alloc(logits)?,
        next: alloc(8)?,
    };
    io.ids.write(bytemuck::bytes_of(&1i64)).map_err(text)?;
    io.pos.write(bytemuck::bytes_of(&args.position)).map_err(text)?;
    let stream = Stream::new(&ctx).map_err(text)?;
    // A plain call first (the delegate checks new pointers with the driver once), then one captured.
    call(&mut instance, &graph, &mut io, &stream)?;
    stream.synchronize().map_err(text)?;
    stream.begin_capture().map_err(text)?;
    let captured = call(&mut instance, &graph, &mut io, &stream);
    let step = stream.end_capture().map_err(text)?;
    captured?;
    let (start, end) = (Event::timed(&ctx).map_err(text)?, Event::timed(&ctx).map_err(text)?);
    let replay = || {
        // SAFETY: the captured call's memory (`io`, the instance's own) lives and is touched by nothing else
        // until the stream is synchronised below; the stream is of the graph's context.
        unsafe { step.launch(stream.as_ref()) }.map_err(text)
    };
    for _ in 0..10 {
        replay()?;
    }
    start.record(stream.as_ref()).map_err(text)?;
    for _ in 0..args.steps {
        replay()?;
    }
    end.record(stream.as_ref()).map_err(text)?;
    end.synchronize().map_err(text)?;
    let us = f64::from(end.elapsed_ms(&start).map_err(text)?) * 1e3 / args.steps as f64;
    let params: u64 = graph.constants().map(|(id, _)| graph.tensor(id).numel() as u64).sum();
    Ok(format!(
        "{{\"layers\": {}, \"dim\": {}, \"heads\": {}, \"kv_heads\": {}, \"head_dim\": {}, \"ffn\": {}, \
         \"vocab\": {}, \"max_len\": {}, \"dtype\": \"{}\", \"tied\": {}, \"parameters\": {params}, \
         \"position\": {}, \"steps\": {}, \"gpu_us_per_step\": {us:.1}, \"bytes_per_step\": {}, \
         \"build_and_init_s\": {build_s:.1}}}",
        cfg.layers,
        cfg.dim,
        cfg.heads,
        cfg.kv_heads,
        cfg.head_dim,
        cfg.ffn,
        cfg.vocab,
        cfg.max_len,
        cfg.dtype,
        cfg.tied,
        args.position,
        args.steps,
        bytes_per_step(&graph, cfg, args.position),
    ))
}

fn main() -> ExitCode {
    match parse().and_then(run) {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("hf_decode: {err}");
            ExitCode::FAILURE
        }
    }
}
