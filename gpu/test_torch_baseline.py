#!/usr/bin/env python3
"""CPU checks of gpu/torch_baseline.py (no GPU needed): `python3 gpu/test_torch_baseline.py` (or pytest).

Set KV_BASELINE_INPUTS to a directory written by
`cargo run -p kv-example --example baseline_inputs -- tiny DIR` to also compare the weights with Rust's, bit for
bit."""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_baseline as tb  # noqa: E402

# Config::tiny() as Config::to_json writes it.
TINY = {"vocab": 64, "heads": 2, "head_dim": 16, "max_len": 16, "layers": 1, "prompt": [1, 7, 3, 12],
        "seed": 1802895361, "dtype": "f32", "rms_eps": 1e-5}
# `delegate-host run <tiny program.toml> --steps 12` on the reference delegate (and the f64 oracle's).
TINY_TOKENS = [52, 19, 9, 6, 53, 30, 29, 53, 26, 44, 20, 63, 13]


class _Replay:
    def __init__(self, fn):
        self.replay = fn


def _fake_capture(fn):
    """capture() on the CPU: the warm-up's two runs, then a 'graph' that reruns fn."""
    fn()
    fn()
    return _Replay(fn)


def test_tiny_tokens_equal_the_reference_delegates():
    model = tb.Model(TINY, torch.float32, torch.device("cpu"))
    for variant in ("naive", "sdpa"):
        assert tb.generate_eager(model, 12, variant) == TINY_TOKENS, variant


def test_the_graph_loop_gives_the_eager_tokens():
    tb_capture, tb.capture = tb.capture, _fake_capture
    try:
        model = tb.Model(TINY, torch.float32, torch.device("cpu"))
        for variant in ("naive", "sdpa"):
            assert tb.generate_graph(model, 12, variant) == TINY_TOKENS, variant
    finally:
        tb.capture = tb_capture


def test_the_numpy_and_torch_generators_draw_the_same_bits():
    if tb.np is None:
        return
    cfg = dict(TINY, layers=2, seed=0xFFFF_FFFF_FFFF_FFF0)  # a seed that wraps at once
    pairs = zip(tb.weight_tensors(cfg, "numpy"), tb.weight_tensors(cfg, "torch"))
    for (name, _, a), (_, _, b) in pairs:
        assert torch.equal(a.view(torch.int32), b.view(torch.int32)), name


def test_first_weights_are_splitmix64s():
    # SplitMix64(seed).next() for seed 0 is 0xe220a8397b1dcdaf; the first weight is tok_emb[0] at scale 0.5.
    (_, _, tok_emb), = [next(tb.weight_tensors(dict(TINY, seed=0), "torch"))]
    unit = (0xE220A8397B1DCDAF >> 40) / 2**24
    assert tok_emb[0].item() == (2 * unit - 1) * 0.5


def test_weights_are_rusts():
    inputs = os.environ.get("KV_BASELINE_INPUTS")
    if not inputs:
        return
    with open(os.path.join(inputs, "config.json")) as f:
        cfg = json.load(f)
    for rng in ("numpy", "torch") if tb.np is not None else ("torch",):
        n, err = tb.check_weights(cfg, os.path.join(inputs, "weights.f32"), rng)
        assert err is None and n > 0, (rng, err)


if __name__ == "__main__":
    for name, fn in list(globals().items()):
        if name.startswith("test_"):
            fn()
            print("ok", name)
