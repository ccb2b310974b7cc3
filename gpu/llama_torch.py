#!/usr/bin/env python3
"""PyTorch beside `bench_hf_decode --preset llama-1b`: the Llama-3.2-1B shape through Hugging Face transformers.

The same shape and dtype as ours (16 layers, hidden 2048, 32 query / 8 KV heads of 64, SwiGLU 8192, vocabulary
128 256, tied embeddings, no biases, bf16), random weights drawn by transformers from a fixed seed (not ours:
the timing does not depend on their values), transformers' StaticCache, and one decode step at a held
position, run as its users run it: plain eager, and `torch.compile(model.forward, mode="reduce-overhead",
fullgraph=True)` (CUDA graphs), the recipe of transformers' static-cache documentation.

    python3 gpu/llama_torch.py [--preset llama-1b|tiny] [--position 1024] [--max-len 2048] [--steps 100]

Prints one JSON object: each variant's GPU µs per step (the mean over `--steps` steps between two CUDA events,
and the median of per-step event pairs), with the versions that made it. `tiny` is a quick check of the
script (a two-layer model)."""
import argparse
import json
import statistics

import torch

PRESETS = {
    "llama-1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=64),
    "tiny": dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16),
}
SEED = 0


def build(preset: str, max_len: int):
    """The seeded model on the GPU in bf16, and an empty StaticCache of `max_len` rows for it."""
    import transformers

    config = transformers.LlamaConfig(**PRESETS[preset], max_position_embeddings=max_len, rms_norm_eps=1e-5,
                                      tie_word_embeddings=True, attention_bias=False, mlp_bias=False)
    torch.manual_seed(SEED)
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM(config)
    model = model.to(torch.bfloat16).eval()
    cache = transformers.StaticCache(config=config, max_cache_len=max_len)
    return model, cache


def gpu_us(step, steps: int, warm: int) -> dict:
    """GPU µs per call of `step`: the mean over `steps` calls between two events, and the median of per-call
    event pairs (a second pass)."""
    for _ in range(warm):
        step()
    torch.cuda.synchronize()
    first, last = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    first.record()
    for _ in range(steps):
        step()
    last.record()
    torch.cuda.synchronize()
    mean = first.elapsed_time(last) * 1e3 / steps
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(steps)]
    for a, b in pairs:
        a.record()
        step()
        b.record()
    torch.cuda.synchronize()
    median = statistics.median(a.elapsed_time(b) * 1e3 for a, b in pairs)
    return {"gpu_us_per_step": mean, "gpu_us_median": median, "steps": steps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="llama-1b")
    ap.add_argument("--position", type=int, default=1024)
    ap.add_argument("--max-len", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--eager-steps", type=int, default=20, help="eager steps (each is tens of ms)")
    args = ap.parse_args()
    if not 0 <= args.position < args.max_len:
        ap.error(f"--position {args.position} is not a row of a cache of {args.max_len}")
    import transformers

    model, cache = build(args.preset, args.max_len)
    parameters = sum(p.numel() for p in model.parameters())
    token = torch.tensor([[1]], device="cuda")
    position = torch.tensor([args.position], device="cuda")

    def step():
        # One decode step at the held position: its K and V rows are written into the cache in place.
        return model(input_ids=token, past_key_values=cache, cache_position=position, use_cache=True).logits

    with torch.inference_mode():
        eager = gpu_us(step, args.eager_steps, warm=3)
        model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)

        def compiled_step():
            torch.compiler.cudagraph_mark_step_begin()
            return step()

        compiled = gpu_us(compiled_step, args.steps, warm=5)
    print(json.dumps({
        "preset": args.preset, "position": args.position, "max_len": args.max_len, "parameters": parameters,
        "dtype": "bf16", "eager": eager, "compiled_reduce_overhead": compiled,
        "torch": torch.__version__, "transformers": transformers.__version__,
        "device": torch.cuda.get_device_name(0),
    }))


if __name__ == "__main__":
    main()
