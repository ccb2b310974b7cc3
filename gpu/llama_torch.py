#!/usr/bin/env python3
"""PyTorch beside `bench_hf_decode` and `bench_export_decode`: the decoder they measured, through Hugging Face
transformers.

The shape, dtype, cache length and position come from the JSON `bench_hf_decode` printed (its one source is
the Rust preset, e.g. `--preset llama-1b`: 16 layers, hidden 2048, 32 query / 8 KV heads of 64, SwiGLU 8192,
vocabulary 128 256, tied embeddings, bf16) or `bench_export_decode` printed (the same keys). The model is
transformers' `LlamaForCausalLM` with random weights drawn by transformers from a fixed seed (not ours: the
timing does not depend on their values), no biases, and transformers' `StaticCache`; a JSON whose `bias` is
true (`--preset qwen-0.5b`, the exported Qwen2.5-0.5B graph) gets `Qwen2ForCausalLM` (biased q/k/v). One
decode step at the held position is run as transformers' users run it: plain eager, and
`torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)` (CUDA graphs), the recipe of
transformers' static-cache documentation. A StaticCache step attends over all `max_len` rows, masked by the
position, so it costs the same at any position; its layers write each step's K and V row at their own running
length (transformers 5.17's `StaticLayer` does not take the row from `cache_position`), so the cache is reset
before each variant and a variant's calls must fit in the cache.

    ./bench_hf_decode --preset llama-1b > llama-1b.json
    python3 gpu/llama_torch.py --shape llama-1b.json [--steps 100] [--eager-steps 20]

Prints one JSON object: each variant's timing from `torch_baseline.time_cuda` (GPU µs per step over
back-to-back steps between two CUDA events, as `bench_hf_decode` measures ours), with the versions that made
it. `bench_hf_decode --preset tiny`'s JSON (a 40-row cache: `--steps 10 --eager-steps 5`) checks the script in
seconds."""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_baseline import time_cuda  # noqa: E402

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
SEED = 0
# Calls of a variant besides its timed steps: warm-up (the compiled one's compiles and captures), then the host
# clock's (`time_cuda`'s host_iters).
WARM_EAGER, HOST_EAGER = 3, 3
WARM, HOST = 5, 20


def build(shape: dict):
    """The seeded model of `shape` (bench_hf_decode's JSON) on the GPU, and an empty StaticCache for it."""
    import transformers

    sizes = dict(
        vocab_size=shape["vocab"], hidden_size=shape["dim"], intermediate_size=shape["ffn"],
        num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"], head_dim=shape["head_dim"], max_position_embeddings=shape["max_len"],
        tie_word_embeddings=shape["tied"])
    if shape.get("bias", False):  # Qwen2: biased q/k/v projections, nothing else biased
        config, model_class = transformers.Qwen2Config(**sizes), transformers.Qwen2ForCausalLM
    else:
        config = transformers.LlamaConfig(**sizes, attention_bias=False, mlp_bias=False)
        model_class = transformers.LlamaForCausalLM
    torch.manual_seed(SEED)
    with torch.device("cuda"):
        model = model_class(config)
    model = model.to(DTYPES[shape["dtype"]]).eval()
    cache = transformers.StaticCache(config=config, max_cache_len=shape["max_len"])
    return model, cache


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", required=True, help="the JSON bench_hf_decode printed")
    ap.add_argument("--steps", type=int, default=100, help="compiled steps timed")
    ap.add_argument("--eager-steps", type=int, default=20, help="eager steps timed (each is tens of ms)")
    args = ap.parse_args()
    with open(args.shape) as f:
        shape = json.load(f)
    calls = {"eager": (WARM_EAGER, args.eager_steps, HOST_EAGER), "compiled": (WARM, args.steps, HOST)}
    for name, counts in calls.items():
        if sum(counts) > shape["max_len"]:
            ap.error(f"{name}: {sum(counts)} calls (warm-up, timed, host-timed) do not fit a cache of "
                     f"{shape['max_len']} rows; lower --steps or --eager-steps")
    import transformers

    model, cache = build(shape)
    token = torch.tensor([[1]], device="cuda")
    position = torch.tensor([shape["position"]], device="cuda")

    def step():
        # One decode step, masked at the held position; its K and V rows are written into the cache in place.
        return model(input_ids=token, past_key_values=cache, cache_position=position, use_cache=True).logits

    with torch.inference_mode():
        cache.reset()
        eager = time_cuda(step, args.eager_steps, warm=WARM_EAGER, host_iters=HOST_EAGER)
        cache.reset()
        model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)

        def compiled_step():
            torch.compiler.cudagraph_mark_step_begin()
            return step()

        compiled = time_cuda(compiled_step, args.steps, warm=WARM, host_iters=HOST)
    print(json.dumps({
        "layers": shape["layers"], "dim": shape["dim"], "dtype": shape["dtype"], "position": shape["position"],
        "max_len": shape["max_len"], "parameters": sum(p.numel() for p in model.parameters()),
        "eager": eager, "compiled_reduce_overhead": compiled, "torch": torch.__version__,
        "transformers": transformers.__version__, "device": torch.cuda.get_device_name(0),
    }))


if __name__ == "__main__":
    main()
