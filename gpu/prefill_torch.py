#!/usr/bin/env python3
"""PyTorch beside `bench_prefill`: the prefill of the same prompts on transformers' model of the same shape,
compiled.

The shape, dtype and prompt lengths come from the JSON `bench_prefill` printed (keys as `bench_hf_decode`'s;
`lengths[*].tokens`). The model is `llama_torch.build`'s: transformers' `LlamaForCausalLM` (or
`Qwen2ForCausalLM` for a biased shape) with random weights from a fixed seed, bf16, and per prompt length a
`StaticCache` of as many rows as the prompt (as ours: attention over the prompt's rows alone). A prefill is one call of the whole prompt (token ids all 1, as ours), logits
for every row (transformers' default, as ours), its K and V rows written into the cache; the forward is
`torch.compile(model.forward, fullgraph=True)` (default mode: one compile per prompt length, no CUDA graph,
which a call of milliseconds does not need). The cache is reset before each call (its layers write at their
own running length; the reset is a memset of the cache, microseconds beside the call).

    ./bench_prefill > prefill.json
    python3 gpu/prefill_torch.py --shape prefill.json [--iters 5]

Prints one JSON object: per prompt length, eager's and the compiled forward's `torch_baseline.time_cuda`
timings (GPU µs per call between two CUDA events) and tokens per second, with the versions that made them.
`bench_prefill --preset tiny --lengths 16,32 --check`'s JSON checks the script in seconds."""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_torch import build  # noqa: E402
from torch_baseline import time_cuda  # noqa: E402

WARM_EAGER, WARM = 1, 3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", required=True, help="the JSON bench_prefill printed")
    ap.add_argument("--iters", type=int, default=5, help="calls timed per length and variant")
    ap.add_argument("--no-eager", action="store_true", help="time the compiled forward alone")
    args = ap.parse_args()
    with open(args.shape) as f:
        shape = json.load(f)
    lengths = [entry["tokens"] for entry in shape["lengths"]]
    shape = dict(shape, max_len=max(lengths))
    import transformers

    model, _ = build(shape)
    compiled = torch.compile(model.forward, fullgraph=True)
    results = []
    with torch.inference_mode():
        for tokens in lengths:
            ids = torch.ones((1, tokens), dtype=torch.long, device="cuda")
            positions = torch.arange(tokens, device="cuda")
            cache = transformers.StaticCache(config=model.config, max_cache_len=tokens)

            def call(forward, cache=cache, ids=ids, positions=positions):
                def prefill():
                    cache.reset()
                    return forward(input_ids=ids, past_key_values=cache, cache_position=positions,
                                   use_cache=True).logits
                return prefill

            entry = {"tokens": tokens}
            if not args.no_eager:
                entry["eager"] = time_cuda(call(model.forward), args.iters, warm=WARM_EAGER, host_iters=1)
            entry["compiled"] = time_cuda(call(compiled), args.iters, warm=WARM, host_iters=1)
            for key in ("eager", "compiled"):
                if key in entry:
                    entry[key]["tokens_per_s"] = tokens / entry[key]["gpu_us"] * 1e6
            print(f"prefill_torch: {entry}", file=sys.stderr)
            results.append(entry)
    print(json.dumps({
        "layers": shape["layers"], "dim": shape["dim"], "dtype": shape["dtype"],
        "parameters": sum(p.numel() for p in model.parameters()), "lengths": results,
        "compile": 'torch.compile(model.forward, fullgraph=True)', "torch": torch.__version__,
        "transformers": transformers.__version__, "device": torch.cuda.get_device_name(0),
    }))


if __name__ == "__main__":
    main()
