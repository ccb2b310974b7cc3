"""A Llama-style decoder written as users write one (the forms of issue 18's "Why"), for partitioner tests and the real-model fixtures.

``forward(tokens: i64 [T], input_pos: i64 [1]) -> logits f32 [T, vocab]`` (the fixtures' protocol), with
``nn.Embedding`` and ``nn.Linear`` layers, RMSNorm decomposed (``pow``/``mean``/``+ eps``/``rsqrt``/``*``),
rotary embeddings in the ``rotate_half`` form (or, with ``rope_interleaved``, the interleaved form) with cos/sin
from ``inv_freq`` x positions, grouped-query
attention through ``repeat_interleave`` (or, with ``gqa_tiled``, the tiled order ``expand(g, Hkv, L, Dh)``), one causal mask shared by every layer, a SwiGLU MLP, and caches
``[kv_heads, max_len, head_dim]`` updated with ``index_copy_``. Random weights from a seeded generator.
"""

from __future__ import annotations

from typing import Dict, List

import torch
import torch.nn.functional as F
from torch import nn

from . import generate

CONFIG: Dict[str, int] = {"vocab": 64, "dim": 32, "heads": 4, "kv_heads": 2, "layers": 2, "max_len": 16,
                          "hidden": 48, "seed": 18}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotate_interleaved(x: torch.Tensor) -> torch.Tensor:
    """The interleaved form (GPT-J, Meta's original Llama): pairs ``(x0, x1)`` become ``(-x1, x0)``."""
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


class Layer(nn.Module):
    def __init__(self, cfg: Dict[str, int]) -> None:
        super().__init__()
        dim, heads, kv_heads = cfg["dim"], cfg["heads"], cfg["kv_heads"]
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.rotate = rotate_interleaved if cfg.get("rope_interleaved") else rotate_half
        self.gqa_tiled = bool(cfg.get("gqa_tiled"))
        self.attn_norm, self.mlp_norm = RMSNorm(dim), RMSNorm(dim)
        self.q_proj = nn.Linear(dim, heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, dim, bias=False)
        self.gate = nn.Linear(dim, cfg["hidden"], bias=False)
        self.up = nn.Linear(dim, cfg["hidden"], bias=False)
        self.down = nn.Linear(cfg["hidden"], dim, bias=False)
        cache = (kv_heads, cfg["max_len"], self.head_dim)
        self.register_buffer("k_cache", torch.zeros(cache))
        self.register_buffer("v_cache", torch.zeros(cache))

    def repeat(self, cache: torch.Tensor) -> torch.Tensor:
        """Each KV head's cache for the query heads that read it: query head h reads KV head h // group
        (``repeat_interleave``), or with ``gqa_tiled`` KV head h % kv_heads (the group axis first)."""
        group = self.heads // self.kv_heads
        if self.gqa_tiled:
            return cache.unsqueeze(0).expand(group, *cache.shape).reshape(self.heads, *cache.shape[1:])
        return cache.repeat_interleave(group, dim=0)

    def forward(self, x, positions, cos, sin, mask):
        t = x.shape[0]
        h = self.attn_norm(x)
        q = self.q_proj(h).view(t, self.heads, self.head_dim).transpose(0, 1)
        k = self.k_proj(h).view(t, self.kv_heads, self.head_dim).transpose(0, 1)
        v = self.v_proj(h).view(t, self.kv_heads, self.head_dim).transpose(0, 1)
        q = q * cos + self.rotate(q) * sin
        k = k * cos + self.rotate(k) * sin
        self.k_cache.index_copy_(1, positions, k)
        self.v_cache.index_copy_(1, positions, v)
        keys, values = self.repeat(self.k_cache), self.repeat(self.v_cache)
        a = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        x = x + self.o_proj(a.transpose(0, 1).reshape(t, self.heads * self.head_dim))
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class LlamaStyle(nn.Module):
    def __init__(self, cfg: Dict[str, int] = CONFIG) -> None:
        super().__init__()
        self.cfg = dict(cfg)
        torch.manual_seed(cfg["seed"])
        self.embed = nn.Embedding(cfg["vocab"], cfg["dim"])
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg["layers"]))
        self.norm = RMSNorm(cfg["dim"])
        self.lm_head = nn.Linear(cfg["dim"], cfg["vocab"], bias=False)
        head_dim = cfg["dim"] // cfg["heads"]
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape) * (0.3 if p.dim() > 1 else 0.1) + (1.0 if p.dim() == 1 else 0.0))

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[0]
        positions = input_pos + torch.arange(t, dtype=torch.int64)
        freqs = positions[:, None].float() * self.inv_freq[None, :]
        if self.cfg.get("rope_interleaved"):
            emb = torch.stack((freqs, freqs), dim=-1).flatten(-2)
        else:
            emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[None], emb.sin()[None]
        mask = torch.arange(self.cfg["max_len"])[None, :] <= positions[:, None]
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x, positions, cos, sin, mask)
        return self.lm_head(self.norm(x))

    def reset_caches(self) -> None:
        for layer in self.layers:
            layer.k_cache.zero_()
            layer.v_cache.zero_()


def greedy(model: LlamaStyle, prompt: List[int], steps: int) -> List[int]:
    """The fixtures' run protocol in eager (:func:`kv_delegate.generate.greedy`): ``prompt`` one token at a
    time, then ``steps`` decode steps."""
    model.reset_caches()
    call = lambda tokens, pos: model(torch.tensor(tokens), torch.tensor([pos]))[-1]  # noqa: E731
    try:
        return generate.greedy(call, prompt, steps)[0]
    finally:
        model.reset_caches()
