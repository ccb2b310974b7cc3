//! The JSON line a decode bench prints: the model's sizes, the timing and the bytes a step must read (the keys
//! `gpu/run.sh`, `gpu/llama_torch.py` and `gpu/export_bench.py` read).

use std::process::ExitCode;

use ref_graph::Graph;

/// A model's sizes, as both benches describe the graph they time (a hollow graph's file holds them too).
pub use super::hollow::Sizes;

/// The bench's JSON object for `graph` timed at `position`; `extra` adds keys of the bench's own.
pub fn json(
    sizes: &Sizes,
    graph: &Graph,
    position: u64,
    steps: usize,
    timed: &super::decode::Timed,
    build_s: f64,
    extra: serde_json::Value,
) -> String {
    let parameters: u64 = graph.constants().map(|(id, _)| graph.tensor(id).numel() as u64).sum();
    let mut value = serde_json::json!({
        "name": sizes.name, "layers": sizes.layers, "dim": sizes.dim, "heads": sizes.heads,
        "kv_heads": sizes.kv_heads, "head_dim": sizes.head_dim, "ffn": sizes.ffn, "vocab": sizes.vocab,
        "max_len": sizes.max_len, "dtype": sizes.dtype, "tied": sizes.tied, "bias": sizes.bias,
        "parameters": parameters, "ops": graph.ops().len(), "position": position, "steps": steps,
        "gpu_us_per_step": (timed.gpu_us_per_step * 10.0).round() / 10.0,
        "bytes_per_step": super::traffic::bytes_per_step(graph, position),
        "launches_per_step": timed.launches,
        "empty_chain_us_per_step": (timed.empty_chain_us * 10.0).round() / 10.0,
        "relay_chain_us_per_step": (timed.relay_chain_us * 10.0).round() / 10.0,
        "build_and_init_s": ((build_s + timed.init_s) * 10.0).round() / 10.0,
    });
    if let (Some(object), serde_json::Value::Object(more)) = (value.as_object_mut(), extra) {
        object.extend(more);
    }
    value.to_string()
}

/// A bench's exit: its JSON line on stdout, or its error on stderr named after the bench `name`.
pub fn finish(name: &str, result: Result<String, String>) -> ExitCode {
    match result {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("{name}: {err}");
            ExitCode::FAILURE
        }
    }
}
