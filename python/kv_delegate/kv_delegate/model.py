"""The example decoder as a ``torch.nn.Module`` for ``torch.export``: kv-example's ``tiny`` model with the
weights of ``gpu/torch_baseline.py`` (SplitMix64, bit-identical to Rust's), shaped to the fixture contract.

    forward(tokens: i64 [T], input_pos: i64 [1]) -> logits: f32 [T, vocab]

Caches are registered buffers ``k_cache_{l}`` / ``v_cache_{l}`` f32 ``[heads, max_len, head_dim]``, updated in
place with ``index_copy_`` (a program mutable buffer once exported). Attention is
``F.scaled_dot_product_attention`` with a boolean causal mask over the whole cache; RMS norm is ``F.rms_norm``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, List

import torch
import torch.nn.functional as F

from . import generate

#: kv-example's ``Config::tiny()``.
TINY: Dict[str, Any] = {
    "vocab": 64,
    "heads": 2,
    "head_dim": 16,
    "max_len": 16,
    "layers": 1,
    "prompt": [1, 7, 3, 12],
    "seed": 0x6B760001,
    "dtype": "f32",
    "rms_eps": 1e-5,
}

#: The repository root (this file is python/kv_delegate/kv_delegate/model.py).
REPO_ROOT = Path(__file__).resolve().parents[3]


def torch_baseline() -> ModuleType:
    """``gpu/torch_baseline.py`` imported as a module (the SplitMix64 weights and the eager reference)."""
    name = "kv_torch_baseline"
    if name in sys.modules:
        return sys.modules[name]
    path = REPO_ROOT / "gpu" / "torch_baseline.py"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def k_cache_name(layer: int) -> str:
    """The key cache buffer of ``layer``: ``k_cache_{layer}`` (kv-example's name)."""
    return f"k_cache_{layer}"


def v_cache_name(layer: int) -> str:
    """The value cache buffer of ``layer``: ``v_cache_{layer}``."""
    return f"v_cache_{layer}"


class Decoder(torch.nn.Module):
    """kv-example's decoder (crates/kv-example/src/model.rs), op for op, f32.

    Weights are parameters named as kv-example's graph constants with ``.`` replaced by ``_``; caches are
    buffers. One call processes ``T`` tokens at positions ``input_pos .. input_pos + T``.
    """

    def __init__(self, cfg: Dict[str, Any] = TINY) -> None:
        super().__init__()
        self.cfg = dict(cfg)
        self.heads, self.head_dim = cfg["heads"], cfg["head_dim"]
        self.max_len, self.layers = cfg["max_len"], cfg["layers"]
        self.dim = self.heads * self.head_dim
        self.eps = float(cfg.get("rms_eps", 1e-5))
        tb = torch_baseline()
        rng = "numpy" if tb.np is not None else "torch"
        for name, shape, values in tb.weight_tensors(cfg, rng):
            param = torch.nn.Parameter(values.reshape(shape).clone(), requires_grad=False)
            self.register_parameter(name.replace(".", "_"), param)
        cache = (self.heads, self.max_len, self.head_dim)
        for layer in range(self.layers):
            self.register_buffer(k_cache_name(layer), torch.zeros(cache))
            self.register_buffer(v_cache_name(layer), torch.zeros(cache))

    def weight(self, name: str) -> torch.Tensor:
        """The parameter of kv-example's constant ``name`` (e.g. ``layer0.wq``)."""
        return getattr(self, name.replace(".", "_"))

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        """Logits ``[T, vocab]``; writes cache rows ``input_pos .. input_pos + T`` of every layer in place."""
        t, heads, head_dim = tokens.shape[0], self.heads, self.head_dim
        positions = input_pos + torch.arange(t, dtype=torch.int64)
        x = F.embedding(tokens, self.weight("tok_emb")) + F.embedding(positions, self.weight("pos_emb"))
        rows = torch.arange(self.max_len, dtype=torch.int64)
        visible = rows.view(1, self.max_len) <= positions.view(t, 1)  # query t sees rows 0 ..= pos + t
        for layer in range(self.layers):
            p = f"layer{layer}."
            h = F.rms_norm(x, (self.dim,), self.weight(p + "norm"), self.eps)
            q = torch.mm(h, self.weight(p + "wq"))
            k = torch.mm(h, self.weight(p + "wk"))
            v = torch.mm(h, self.weight(p + "wv"))
            k_cache = getattr(self, k_cache_name(layer))
            v_cache = getattr(self, v_cache_name(layer))
            k_cache.index_copy_(1, positions, k.view(t, heads, head_dim).transpose(0, 1))
            v_cache.index_copy_(1, positions, v.view(t, heads, head_dim).transpose(0, 1))
            qh = q.view(t, heads, head_dim).transpose(0, 1)
            a = F.scaled_dot_product_attention(qh, k_cache, v_cache, attn_mask=visible)
            # An explicit contiguous copy before the view: sdpa's output strides differ between tracing passes.
            merged = a.transpose(0, 1).clone(memory_format=torch.contiguous_format).view(t, self.dim)
            x = x + torch.mm(merged, self.weight(p + "wo"))
            x = self.mlp(x, p)
        h = F.rms_norm(x, (self.dim,), self.weight("final_norm"), self.eps)
        return torch.mm(h, self.weight("w_out"))

    def mlp(self, x: torch.Tensor, prefix: str) -> torch.Tensor:
        """What follows a layer's attention (``prefix`` is ``layer{N}.``): nothing in this decoder."""
        return x

    def reset_caches(self) -> None:
        """Zeroes every cache (a fresh program's buffers)."""
        for layer in range(self.layers):
            getattr(self, k_cache_name(layer)).zero_()
            getattr(self, v_cache_name(layer)).zero_()


def greedy(model: Decoder, steps: int) -> tuple[List[int], torch.Tensor]:
    """Torch eager's run protocol of the fixtures (:func:`kv_delegate.generate.greedy`): the prompt in one
    call, then ``steps`` decode steps feeding back the argmax of the last logits row. Returns the ``steps + 1``
    tokens and the last logits rows ``[steps + 1, vocab]``."""
    model.reset_caches()
    prompt = model.cfg["prompt"]
    call = lambda tokens, pos: model(torch.tensor(tokens, dtype=torch.int64), torch.tensor([pos]))[-1]  # noqa: E731
    try:
        return generate.greedy(call, prompt, steps, chunk=len(prompt))
    finally:
        model.reset_caches()


class GeluDecoder(Decoder):
    """The decoder with a GeLU MLP after each layer's attention, ``x + gelu(rms_norm(x) @ w_up) @ w_down``,
    the GeLU written out with the error function (``0.5 u (1 + erf(u / sqrt 2))``): ``aten.erf``, which the
    reference graph does not run, so an export leaves it outside the delegate (it runs on ExecuTorch's kernel)
    and delegates the rest. ``w_up`` ``[dim, 2 dim]`` and ``w_down`` ``[2 dim, dim]``
    are seeded (``torch.Generator``, seed ``cfg["seed"]``), scaled by 0.1."""

    def __init__(self, cfg: Dict[str, Any] = TINY) -> None:
        super().__init__(cfg)
        gen = torch.Generator().manual_seed(int(cfg["seed"]))
        for layer in range(self.layers):
            for name, shape in (("mlp_norm", (self.dim,)), ("w_up", (self.dim, 2 * self.dim)),
                                ("w_down", (2 * self.dim, self.dim))):
                values = 1.0 + 0.1 * torch.randn(shape, generator=gen) if name == "mlp_norm" else \
                    0.1 * torch.randn(shape, generator=gen)
                self.register_parameter(f"layer{layer}_{name}", torch.nn.Parameter(values, requires_grad=False))

    def mlp(self, x: torch.Tensor, prefix: str) -> torch.Tensor:
        """The GeLU MLP after each layer's attention."""
        h = F.rms_norm(x, (self.dim,), self.weight(prefix + "mlp_norm"), self.eps)
        u = torch.mm(h, self.weight(prefix + "w_up"))
        gelu = 0.5 * u * (1.0 + torch.erf(u * 0.7071067811865476))
        return x + torch.mm(gelu, self.weight(prefix + "w_down"))
