"""Exports real decoders (issue 18) for ``ReferenceBackend`` with torch eager's tokens and logits beside them:
the fixtures of ``fixtures/executorch/real/``.

    python -m kv_delegate.export_real DIR [--only MODEL_DTYPE ...] [--prefill-chunk T]

Models (random weights from a fixed seed; no hub here): Hugging Face ``LlamaForCausalLM`` (untied lm_head) and
``Qwen2ForCausalLM`` (biased q/k/v, tied embeddings), both with grouped-query attention and exported with
transformers' own ExecuTorch recipe (``TorchExportableModuleWithStaticCache``, StaticCache,
``forward(input_ids i64 [1, 1], cache_position i64 [1]) -> logits [1, 1, vocab]``), and the hand-written
:class:`~kv_delegate.llama_style.LlamaStyle` (``forward(tokens i64 [T], input_pos i64 [1])``), and the
LayerNorm families of issue 46 (Phi, StableLM, GPT-NeoX, GPT-2, Starcoder2, Falcon) with random biases and norm
gains (:data:`RANDOM_VECTORS`), and attention written by hand (Gemma 2 with logit soft-capping, Llama with
``attn_implementation="eager"``). Each in f32,
and the Hugging Face models also in f16 and bf16 (weights, caches and activations in that type). Every method
also returns the greedy next token (:class:`WithNextToken`), which the runtimes' device loop feeds back.

Writes ``DIR/<model>_<dtype>.pte`` (and ``.cuda.pte``: the same program for ``CudaBackend``),
``DIR/<model>_<dtype>.logits.npy`` (f32 ``[1 + steps, vocab]``: the last
logits row after the prompt and after each decode step, from torch eager running the same module) and
``DIR/expected.json`` (versions, prompt, steps, each program's eager tokens, its f32 oracle, what stayed
outside the delegate). The half-precision oracle is the f32 model with the half model's weights (rounded to
the half type, then computed in f32): the program is checked against the f32 arithmetic of its own weights.

With ``--prefill-chunk T`` every program also has a method ``prefill`` of ``T`` tokens a call over the same caches
(its one-token method then named ``decode``: :mod:`kv_delegate.methods`), and ``expected.json`` names ``T``; eager's
tokens are the same run protocol's (the prompt one token per call), which a chunked prefill must give. Write them
into a directory of their own (``fixtures/executorch/prefill/``), as ``expected.json`` is written whole.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from importlib.metadata import version as dist_version
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

from . import generate
from .llama_style import CONFIG as HAND_CONFIG
from .llama_style import LlamaStyle
from .methods import Example, hf_example, method_rows, to_program
from .partitioner import CudaPartitioner, ReferencePartitioner

#: The prompt, and the greedy decode steps after it (positions 0 .. 35 of the 64 the caches hold).
PROMPT = [1, 7, 3, 12]
STEPS = 32
MAX_LEN = 64
SEED = 18
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
#: Hugging Face model sizes: small enough to commit, GQA on (4 query heads over 2 KV heads); weights drawn
#: wider than the default 0.02 so that greedy decoding does not settle on one token.
HF_SIZES = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=MAX_LEN, initializer_range=0.5)
#: The Hugging Face models by name: class, config class, config beyond :data:`HF_SIZES`. The fixtures hold
#: llama and qwen2; the others (Qwen3's per-head q/k norms, Phi-3's fused ``qkv_proj`` and ``gate_up_proj``,
#: Gemma's ``(1 + w)`` norms and GeLU MLP, Mistral's sliding-window mask) are exported by the tests.
HF_MODELS: Dict[str, Tuple[str, str, Dict[str, object]]] = {
    "llama": ("LlamaForCausalLM", "LlamaConfig", {"tie_word_embeddings": False}),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", {"tie_word_embeddings": True}),
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", {"head_dim": 16}),
    "phi3": ("Phi3ForCausalLM", "Phi3Config", {"pad_token_id": 0}),
    "gemma": ("GemmaForCausalLM", "GemmaConfig", {"head_dim": 16}),
    "mistral": ("MistralForCausalLM", "MistralConfig", {}),
    # LayerNorm families (issue 46): partial rotary embeddings, parallel attention + MLP residuals, tanh-GeLU
    # written with pow(x, 3), biases everywhere; GPT-2 with learned positions and a fused c_attn. The ones
    # without grouped-query attention get as many KV heads as query heads.
    "phi": ("PhiForCausalLM", "PhiConfig", {"partial_rotary_factor": 0.5, "pad_token_id": 5}),
    "stablelm": ("StableLmForCausalLM", "StableLmConfig", {"partial_rotary_factor": 0.25, "use_qkv_bias": True}),
    "neox": ("GPTNeoXForCausalLM", "GPTNeoXConfig", {"rotary_pct": 0.25, "num_key_value_heads": 4}),
    "gpt2": ("GPT2LMHeadModel", "GPT2Config", {"num_key_value_heads": 4}),
    "starcoder2": ("Starcoder2ForCausalLM", "Starcoder2Config", {}),
    "falcon": ("FalconForCausalLM", "FalconConfig", {"num_key_value_heads": 4, "new_decoder_architecture": False,
                                                     "multi_query": False, "parallel_attn": True, "bias": True}),
    # Attention written by hand (issue 46): Gemma 2's eager attention (bmm, scale, logit soft-capping, the mask
    # added as floats, softmax, bmm) with final-logit soft-capping, alternating sliding-window and full layers
    # (a window as long as the cache), and Llama with transformers' eager attention. Gemma 2's caps are small and
    # its scores large (query_pre_attn_scalar = head_dim, untied lm_head) so that each cap changes the tokens or
    # the logits of these random weights (with Gemma 2's own 50 and 30 nothing here reaches them).
    "gemma2": ("Gemma2ForCausalLM", "Gemma2Config", {"head_dim": 16, "query_pre_attn_scalar": 16,
                                                     "attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0,
                                                     "sliding_window": MAX_LEN, "tie_word_embeddings": False,
                                                     "initializer_range": 0.3}),
    "llama_eager": ("LlamaForCausalLM", "LlamaConfig", {"attn_implementation": "eager"}),
}
#: The models whose one-dimensional parameters (biases, norm gains) are drawn at random around their defaults,
#: as trained models have them (Hugging Face initialises biases to 0 and gains to 1, which tests neither): a
#: lowering that drops a bias or a gain gives other tokens.
RANDOM_VECTORS = {"phi", "stablelm", "neox", "gpt2", "starcoder2", "falcon", "gemma2"}
#: What is exported: (model, dtype).
PROGRAMS: Tuple[Tuple[str, str], ...] = (
    ("llama", "f32"), ("llama", "f16"), ("llama", "bf16"),
    ("qwen2", "f32"), ("qwen2", "f16"), ("qwen2", "bf16"),
    ("hand", "f32"),
    ("phi", "f32"), ("phi", "bf16"), ("neox", "f32"), ("neox", "f16"), ("stablelm", "f32"), ("gpt2", "f32"),
    ("starcoder2", "f32"), ("falcon", "f32"),
    ("gemma2", "f32"), ("gemma2", "f16"), ("llama_eager", "f32"), ("llama_eager", "f16"),
)

Step = Callable[[int, int], torch.Tensor]


def hf_model(kind: str, dtype: torch.dtype) -> torch.nn.Module:
    """The seeded Hugging Face model in ``dtype``, set up for transformers' StaticCache export recipe."""
    import transformers

    torch.manual_seed(SEED)
    model_class, config_class, extra = HF_MODELS[kind]
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**{**HF_SIZES, **extra}))
    if kind in RANDOM_VECTORS:
        with torch.no_grad():
            for param in model.parameters():
                if param.dim() == 1:
                    param.add_(torch.randn(param.shape) * 0.2)
    return with_static_cache(model.to(dtype).eval(), MAX_LEN)


def with_static_cache(model: torch.nn.Module, max_len: int) -> torch.nn.Module:
    """``model`` set up for transformers' StaticCache export recipe: batch 1, ``max_len`` positions, on the CPU.
    The recipe refuses a model whose generation config does not say ``use_cache``; a checkpoint's
    ``generation_config.json`` usually leaves it unset (Llama-3.2's does), and the export always caches."""
    model.generation_config.use_cache = True
    model.generation_config.cache_implementation = "static"
    model.generation_config.cache_config = {"batch_size": 1, "max_cache_len": max_len, "device": "cpu"}
    return model


def hf_module(kind: str, dtype: torch.dtype) -> torch.nn.Module:
    """transformers' exportable module (the model plus its StaticCache as buffers)."""
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    return TorchExportableModuleWithStaticCache(hf_model(kind, dtype)).eval()


class WithNextToken(torch.nn.Module):
    """``module``'s method, also returning the greedy next token (``argmax`` of the last logits row, i64): the
    output the runtimes' device loop feeds back so that no step reads the logits on the host."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.inner = module

    def forward(self, *args: torch.Tensor, **kwargs: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        logits = self.inner(*args, **kwargs)
        return logits, logits.reshape(-1, logits.shape[-1])[-1:].argmax(-1)


def hand_module(dtype: torch.dtype) -> torch.nn.Module:
    return LlamaStyle({**HAND_CONFIG, "max_len": MAX_LEN}).to(dtype).eval()


def module(kind: str, dtype: torch.dtype) -> torch.nn.Module:
    return hand_module(dtype) if kind == "hand" else hf_module(kind, dtype)


def step_fn(kind: str, m: torch.nn.Module) -> Step:
    """One call of the method: ``(token, position) -> the logits row``, as the runtimes call it."""
    if kind == "hand":
        return lambda tok, pos: m(torch.tensor([tok]), torch.tensor([pos]))[-1]
    return lambda tok, pos: m(input_ids=torch.tensor([[tok]]), cache_position=torch.tensor([pos]))[0, -1]


def greedy(step: Step) -> Tuple[List[int], torch.Tensor]:
    """The run protocol in eager (:func:`kv_delegate.generate.greedy`): the prompt one token per call, then
    :data:`STEPS` greedy steps; the tokens and the f32 logits rows ``[1 + STEPS, vocab]``."""
    return generate.greedy(generate.one_token(step), PROMPT, STEPS)


def oracle(kind: str, dtype: torch.dtype, tokens: List[int]) -> torch.Tensor:
    """The f32 logits of the ``dtype`` model's weights computed in f32, fed ``tokens`` (teacher forcing)."""
    weights = module(kind, dtype).state_dict()
    m = module(kind, torch.float32)
    m.load_state_dict({k: v.float() for k, v in weights.items()}, strict=False)
    step = step_fn(kind, m)
    feed = PROMPT + tokens[:-1]
    with torch.no_grad():
        rows = [step(tok, pos).float() for pos, tok in enumerate(feed)]
    return torch.stack(rows[len(PROMPT) - 1:])


def example(kind: str) -> Example:
    """The method's inputs for ``rows`` tokens a call: the hand-written decoder's ``(tokens [T], input_pos [1])``,
    else transformers' recipe (:func:`~kv_delegate.methods.hf_example`)."""
    if kind == "hand":
        return lambda rows: ((torch.zeros(rows, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)), {})
    return hf_example


def export(kind: str, dtype: torch.dtype, cuda: bool = False,
           prefill_chunk: Optional[int] = None) -> Tuple[bytes, List[object]]:
    """The ``.pte`` of ``kind`` in ``dtype`` for ``ReferenceBackend`` (``CudaBackend`` with ``cuda``; caches
    written in place), with a ``prefill`` method of ``prefill_chunk`` tokens when given
    (:mod:`kv_delegate.methods`), and what the partitioner left outside."""
    m = WithNextToken(module(kind, dtype)).eval()
    partitioner = (CudaPartitioner if cuda else ReferencePartitioner)(output_names=["logits", "next_token"])
    program = to_program(m, method_rows(prefill_chunk), partitioner, example(kind), strict=kind != "hand")
    return program.buffer, partitioner.unsupported()


def export_one(dir: Path, kind: str, dtype_name: str, prefill_chunk: Optional[int] = None) -> Dict[str, object]:
    dtype = DTYPES[dtype_name]
    name = f"{kind}_{dtype_name}"
    tokens, logits = greedy(step_fn(kind, module(kind, dtype)))
    data, outside = export(kind, dtype, prefill_chunk=prefill_chunk)
    (dir / f"{name}.pte").write_bytes(data)
    cuda, _ = export(kind, dtype, cuda=True, prefill_chunk=prefill_chunk)
    (dir / f"{name}.cuda.pte").write_bytes(cuda)
    np.save(dir / f"{name}.logits.npy", logits.numpy().astype(np.float32))
    entry: Dict[str, object] = {"model": kind, "dtype": dtype_name, "tokens": tokens, "logits": f"{name}.logits.npy",
                                "cuda": f"{name}.cuda.pte", "outside": [o._asdict() for o in outside]}
    if prefill_chunk is not None:
        entry["prefill_chunk"] = prefill_chunk
    if dtype != torch.float32:
        reference = oracle(kind, dtype, tokens)
        np.save(dir / f"{name}.oracle.npy", reference.numpy().astype(np.float32))
        entry["oracle"] = f"{name}.oracle.npy"
        entry["eager_vs_oracle"] = float((logits - reference).abs().max() / reference.abs().max())
    print(f"kv_delegate: wrote {name}.pte ({len(data)} bytes; eager tokens {tokens}; outside: {len(outside)})")
    return entry


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", type=Path, help="output directory (created)")
    ap.add_argument("--only", action="append", default=[], help="export only MODEL_DTYPE, e.g. llama_f32")
    ap.add_argument("--prefill-chunk", type=int, metavar="T",
                    help="programs with methods 'prefill' (T tokens a call) and 'decode' over the same caches")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for noisy in ("executorch", "torch", "transformers"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    args.dir.mkdir(parents=True, exist_ok=True)
    programs = {f"{k}_{d}.pte": export_one(args.dir, k, d, args.prefill_chunk) for k, d in PROGRAMS
                if not args.only or f"{k}_{d}" in args.only}
    expected = {
        "torch": torch.__version__,
        "executorch": dist_version("executorch"),
        "transformers": dist_version("transformers"),
        "prompt": PROMPT,
        "steps": STEPS,
        "max_len": MAX_LEN,
        "programs": programs,
    }
    (args.dir / "expected.json").write_text(json.dumps(expected, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
