"""Hollow exported graphs for the GPU benchmark (issue 45 item 3): a model of a real size exported as users
export it, written without its weights, so that it can be carried to a GPU machine and filled there.

    python -m kv_delegate.export_bench --shape llama-1b|qwen2.5-0.5b|tiny-26m --out FILE.rgd [--max-len 2048]

The model is a Hugging Face ``LlamaForCausalLM`` or ``Qwen2ForCausalLM`` of the shape (:data:`SHAPES`, bf16,
transformers' own initialisation from a fixed seed) exported with transformers' ExecuTorch recipe
(``TorchExportableModuleWithStaticCache``, StaticCache of ``--max-len`` positions, plus the greedy next token)
through ``to_edge_transform_and_lower`` and the :class:`~kv_delegate.partitioner.CudaPartitioner`, as
``export_hf.export_decode`` exports a checkpoint. What the delegate would carry, the reference-graph payload's
JSON description, is written out; its constant section is not: while this module exports, the lowering records
a constant over :data:`KEEP_MAX` bytes by its offset and size only (its values are never read or copied), so
neither the payload's constant section nor the blob and program that would hold it again are ever built (the
Llama-3.2-1B shape, 2.5 GB of weights, exports in about 5 minutes at 9 GB peak). Constants up to
:data:`KEEP_MAX` bytes (norm weights, biases, ``inv_freq`` and the lowering's scalars) keep their bytes. The
CUDA bench
(``plugins/cuda/benches/export_decode.rs``) fills the rest from a seed and runs the step.

Two things differ from a full export, both because no constant section exists here: the partitioner's dry run
does not have ``delegate-pack`` check each group (the lowering alone decides what is claimed; the graph is
checked by the same rules when the bench or its test packs it), and no ``.pte`` is written.

The file (``.rgd``) is JSON: ``format`` (:data:`FORMAT`), ``shape`` (the sizes, as ``bench_hf_decode`` prints
them), ``made_by`` (versions), ``outside`` (what the partitioner left outside: nothing, for these models),
``bindings`` (the delegate's arguments in ExecuTorch's order), ``description`` (the payload's JSON description,
its ``constants`` at the offsets the lowering gave them) and ``kept`` (``{constant: hex of its bytes}``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import resource
import sys
import time
from importlib.metadata import version as dist_version
from pathlib import Path
from typing import Any, Dict, Iterator, List, Sequence, Tuple

#: The file's ``format`` field.
FORMAT = "kv-delegate hollow graph 1"
#: Constants of at most this many bytes keep their values in the file.
KEEP_MAX = 64 << 10
SEED = 45
#: The shapes by name: (transformers model class, config class, config). Llama-3.2-1B, Qwen2.5-0.5B, and the
#: 26.2 M-parameter Llama of issue 45.
SHAPES: Dict[str, Tuple[str, str, Dict[str, Any]]] = {
    "llama-1b": ("LlamaForCausalLM", "LlamaConfig", dict(
        vocab_size=128_256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, rope_theta=500_000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=True)),
    "qwen2.5-0.5b": ("Qwen2ForCausalLM", "Qwen2Config", dict(
        vocab_size=151_936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, head_dim=64, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True)),
    "tiny-26m": ("LlamaForCausalLM", "LlamaConfig", dict(
        vocab_size=4096, hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
        num_key_value_heads=2, head_dim=64, tie_word_embeddings=True)),
}


class Hollow:
    """The size of a constant whose bytes are not kept."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes

    def __len__(self) -> int:
        return self.nbytes


class SparseBytes:
    """A constant section that stores only kept constants: the lowering's ``Description.data`` while exporting
    hollow. ``len`` and offsets are those of the full section; a slice inside a kept constant gives its bytes,
    any other zeros (the lowering reads back only one-element constants)."""

    def __init__(self) -> None:
        self.length = 0
        self.kept: Dict[int, bytes] = {}

    def __len__(self) -> int:
        return self.length

    def extend(self, raw: Any) -> None:
        if isinstance(raw, Hollow):
            self.kept.pop(self.length, None)  # the alignment padding before it, if any
        elif len(raw):
            self.kept[self.length] = bytes(raw)
        self.length += len(raw)

    def __getitem__(self, index: slice) -> bytes:
        start, stop = index.start or 0, index.stop
        for offset, raw in self.kept.items():
            if offset <= start and stop <= offset + len(raw):
                return raw[start - offset:stop - offset]
        return bytes(stop - start)

    def __bytes__(self) -> bytes:
        raise RuntimeError("a hollow export has no constant section to write")


@contextlib.contextmanager
def hollow_lowering(captured: List[Any]) -> Iterator[None]:
    """While active: the lowering keeps only constants of at most :data:`KEEP_MAX` bytes, the partitioner's dry
    run has no packer, and the backend appends each lowered subgraph to ``captured`` instead of packing it."""
    from . import backend, partitioner
    from .lowering import description
    from .pack import PackError

    def constant_bytes(value: Any) -> Any:
        nbytes = value.numel() * value.element_size()
        return Hollow(nbytes) if nbytes > KEEP_MAX else keep_bytes(value)

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        plain_init(self, *args, **kwargs)
        self.data = SparseBytes()

    def no_packer(*_: Any) -> str:
        raise PackError("a hollow export checks no group with the packer")

    def capture(lowered: Any, *_: Any, **__: Any) -> bytes:
        captured.append(lowered)
        return b""

    keep_bytes, plain_init = description.constant_bytes, description.Description.__init__
    saved = [(description, "constant_bytes"), (description.Description, "__init__"), (partitioner, "packer"),
             (backend, "pack")]
    originals = [getattr(owner, name) for owner, name in saved]
    for (owner, name), new in zip(saved, [constant_bytes, init, no_packer, capture]):
        setattr(owner, name, new)
    try:
        yield
    finally:
        for (owner, name), old in zip(saved, originals):
            setattr(owner, name, old)


def model(shape: str, max_len: int) -> Any:
    """The seeded bf16 model of ``shape``, set up for transformers' StaticCache recipe with ``max_len``
    positions."""
    import torch
    import transformers

    from .export_real import with_static_cache

    model_class, config_class, sizes = SHAPES[shape]
    config = getattr(transformers, config_class)(**sizes, max_position_embeddings=max_len)
    torch.manual_seed(SEED)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # built in bf16: no f32 copy of the weights, ever
    try:
        built = getattr(transformers, model_class)(config)
    finally:
        torch.set_default_dtype(default)
    return with_static_cache(built.to(torch.bfloat16).eval(), max_len)


def sizes(shape: str, max_len: int, parameters: int) -> Dict[str, Any]:
    """The shape as ``bench_hf_decode`` prints it (``gpu/llama_torch.py`` reads these keys)."""
    model_class, _, s = SHAPES[shape]
    return {
        "name": shape, "model": model_class, "layers": s["num_hidden_layers"], "dim": s["hidden_size"],
        "heads": s["num_attention_heads"], "kv_heads": s["num_key_value_heads"], "head_dim": s["head_dim"],
        "ffn": s["intermediate_size"], "vocab": s["vocab_size"], "max_len": max_len, "dtype": "bf16",
        "tied": s["tie_word_embeddings"], "bias": model_class == "Qwen2ForCausalLM",
        "rope_theta": s.get("rope_theta", 10_000.0), "rms_norm_eps": s.get("rms_norm_eps", 1e-6),
        "parameters": parameters,
    }


@contextlib.contextmanager
def capturing(captured: List[Any]) -> Iterator[None]:
    """While active: the backend appends each lowered subgraph to ``captured``, then packs it as usual (the
    full export :func:`hollow_lowering` stands in for, for comparison)."""
    from . import backend

    pack = backend.pack

    def capture(lowered: Any, *args: Any, **kwargs: Any) -> bytes:
        captured.append(lowered)
        return pack(lowered, *args, **kwargs)

    backend.pack = capture
    try:
        yield
    finally:
        backend.pack = pack


def lower_decode(hf: Any, hollow: bool = True) -> Tuple[Any, List[Any]]:
    """The lowered subgraph of ``hf``'s decode method (transformers' StaticCache recipe plus the greedy next token,
    ``to_edge_transform_and_lower`` with the :class:`~kv_delegate.partitioner.CudaPartitioner`, as
    ``export_hf.export_decode`` exports), hollow (:func:`hollow_lowering`) or in full; and what stayed outside."""
    import torch
    from executorch.exir import to_edge_transform_and_lower
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    from .export_real import WithNextToken
    from .partitioner import CudaPartitioner

    module = WithNextToken(TorchExportableModuleWithStaticCache(hf).eval()).eval()
    kwargs = {"input_ids": torch.tensor([[1]]), "cache_position": torch.tensor([0])}
    partitioner = CudaPartitioner(output_names=["logits", "next_token"])
    captured: List[Any] = []
    with torch.no_grad(), (hollow_lowering if hollow else capturing)(captured):
        ep = torch.export.export(module, (), kwargs, strict=True)
        to_edge_transform_and_lower(ep, partitioner=[partitioner])
    if len(captured) != 1:
        raise RuntimeError(f"the export made {len(captured)} delegate calls; the bench runs one")
    return captured[0], partitioner.unsupported()


def kept_hex(description: Any) -> Dict[str, str]:
    """``{constant: hex of its bytes}`` of the constants a hollow lowering kept."""
    kept = description.data.kept
    return {c["tensor"]: kept[c["offset"]].hex() for c in description.constants if c["offset"] in kept}


def export_hollow(shape: str, max_len: int) -> Dict[str, Any]:
    """The hollow file's content for ``shape`` (module docs)."""
    hf = model(shape, max_len)
    parameters = sum(p.numel() for p in hf.parameters())
    lowered, outside = lower_decode(hf)
    return {
        "format": FORMAT,
        "shape": sizes(shape, max_len, parameters),
        "made_by": {name: dist_version(name) for name in ("torch", "executorch", "transformers")},
        "outside": [o._asdict() for o in outside],
        "bindings": [{"name": b.name, "role": b.role} for b in lowered.bindings],
        "description": lowered.description.json(),
        "kept": kept_hex(lowered.description),
    }


def peak_rss_mib() -> float:
    """This process's peak resident memory so far (Linux reports ``ru_maxrss`` in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kv_delegate.export_bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True, help="the model's sizes")
    ap.add_argument("--max-len", type=int, default=2048, help="positions the caches hold (default 2048)")
    ap.add_argument("--out", type=Path, required=True, help="the hollow graph to write (.rgd)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    for noisy in ("executorch", "torch", "transformers", "kv_delegate"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    if args.max_len < 1:
        ap.error(f"--max-len {args.max_len}: must be at least 1")
    start = time.monotonic()
    content = export_hollow(args.shape, args.max_len)
    args.out.write_text(json.dumps(content, separators=(",", ":")) + "\n")
    for o in content["outside"]:
        print(f"outside the delegate: {o}")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes; {len(content['description']['ops'])} ops, "
          f"{content['shape']['parameters'] / 1e6:.1f} M parameters) in {time.monotonic() - start:.1f} s, "
          f"peak memory {peak_rss_mib():.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
