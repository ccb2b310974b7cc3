"""Exports kv-example's ``tiny`` decoder as ExecuTorch programs for ``ReferenceBackend``, every variant, plus
torch eager's tokens and logits: the fixtures of ``fixtures/executorch/``.

    python -m kv_delegate.export DIR [--backend reference|tensorrt] [--only NAME ...]

Writes ``DIR/<design>_<methods>[_planned].pte``, ``DIR/expected.json`` and ``DIR/logits.npy`` (the contract is
in fixtures/executorch/README.md), and ``DIR/outside/gelu_1m.pte`` with ``DIR/outside/expected.json`` and
``DIR/outside/logits.npy``: the decoder with a GeLU MLP, whose ``aten.erf`` (its GeLU written with the error function) stays outside the delegate. Needs torch, executorch 1.5.1 and the packer (``$KV_DELEGATE_PACK``).
``--backend tensorrt`` writes ``tensorrt_buffers_*.pte`` instead (TensorRT-RTX engines built by ``$KV_TRT_PACK``;
no owned variant), and its ``expected.json`` gives each program's ``backend``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import torch
from importlib.metadata import version as dist_version
from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
from executorch.exir.passes import MemoryPlanningPass

from .model import TINY, Decoder, GeluDecoder, greedy
from .partitioner import ReferencePartitioner, TensorRTPartitioner
from .planning import KvAliasMemoryPlanningPass

log = logging.getLogger("kv_delegate")

#: Decode steps after prefill (13 tokens, positions 0..15 of the tiny model).
STEPS = 12


@dataclass(frozen=True)
class Variant:
    """One exported program."""

    design: str  # "buffers" | "owned"
    two_methods: bool
    planned: bool
    backend: str = "reference"  # "reference" | "tensorrt"

    @property
    def methods(self) -> List[str]:
        return ["prefill", "decode"] if self.two_methods else ["forward"]

    @property
    def file(self) -> str:
        prefix = "tensorrt_" if self.backend == "tensorrt" else ""
        return f"{prefix}{self.design}_{'2m' if self.two_methods else '1m'}{'_planned' if self.planned else ''}.pte"


#: What is exported. ``owned_2m`` is not: each method's delegate instance owns its own state, so prefill's
#: caches are invisible to decode (ExecuTorch has no way to share one delegate instance between methods).
VARIANTS: Tuple[Variant, ...] = (
    Variant("buffers", False, False),
    Variant("buffers", False, True),
    Variant("buffers", True, False),
    Variant("buffers", True, True),
    Variant("owned", False, False),
)


def _export(model: Decoder, rows: int) -> torch.export.ExportedProgram:
    tokens = torch.zeros(rows, dtype=torch.int64)
    input_pos = torch.zeros(1, dtype=torch.int64)
    return torch.export.export(model, (tokens, input_pos), strict=False)


#: The program with an operator outside the delegate (``aten.erf``, on ExecuTorch's kernel).
OUTSIDE_FILE = "gelu_1m.pte"
#: The subdirectory of the programs with operators outside the delegate (their own ``expected.json``).
OUTSIDE_DIR = "outside"


def expected_json(tokens: List[int], programs: Dict[str, object]) -> Dict[str, object]:
    """``expected.json``: the versions that exported, the prompt and eager's tokens, and each program."""
    return {
        "torch": torch.__version__,
        "executorch": dist_version("executorch"),
        "prompt": list(TINY["prompt"]),
        "steps": STEPS,
        "tokens": tokens,
        "logits": "logits.npy",
        "programs": programs,
    }


def export_outside(dir: Path) -> Dict[str, object]:
    """Writes ``outside/``: :data:`OUTSIDE_FILE` (:class:`~kv_delegate.model.GeluDecoder`, one method,
    planned), ``logits.npy`` and ``expected.json`` (eager's tokens, what stayed outside and why)."""
    dir = dir / OUTSIDE_DIR
    dir.mkdir(parents=True, exist_ok=True)
    model = GeluDecoder(TINY).eval()
    tokens, logits = greedy(model, STEPS)
    data, summary = export_variant(model, Variant("buffers", False, True))
    (dir / OUTSIDE_FILE).write_bytes(data)
    np.save(dir / "logits.npy", logits.numpy().astype(np.float32))
    outside = [o._asdict() for o in summary["unsupported"]]
    expected = expected_json(tokens, {OUTSIDE_FILE: {"design": "buffers", "methods": ["forward"], "planned": True,
                                                     "outside": outside}})
    (dir / "expected.json").write_text(json.dumps(expected, indent=2) + "\n")
    print(f"kv_delegate: wrote {OUTSIDE_DIR}/{OUTSIDE_FILE} ({len(data)} bytes; eager tokens {tokens}; outside the delegate: "
          f"{[str(o) for o in summary['unsupported']]})")
    return expected


def export_variant(model: Decoder, variant: Variant) -> Tuple[bytes, Dict[str, object]]:
    """The ``.pte`` bytes of ``variant`` and a summary (partitioner report, aliased outputs)."""
    kind = TensorRTPartitioner if variant.backend == "tensorrt" else ReferencePartitioner
    partitioner = kind(owned_state=variant.design == "owned", output_names=["logits"])
    rows = {"forward": 1, "prefill": len(model.cfg["prompt"]), "decode": 1}
    with torch.no_grad():
        programs = {name: _export(model, rows[name]) for name in variant.methods}
        edge = to_edge_transform_and_lower(programs, partitioner=[partitioner])
        share = variant.two_methods
        planner = (KvAliasMemoryPlanningPass if variant.planned else MemoryPlanningPass)(
            share_mutable_buffers=share
        )
        program = edge.to_executorch(
            ExecutorchBackendConfig(emit_mutable_buffer_names=True, memory_planning_pass=planner)
        )
    aliased = list(getattr(planner, "aliased", []))
    expected_aliases = 2 * model.layers * len(variant.methods) if variant.planned else 0
    if len(aliased) != expected_aliases:
        raise RuntimeError(f"{variant.file}: {len(aliased)} KV outputs aliased, expected {expected_aliases}")
    return program.buffer, {"unsupported": partitioner.unsupported(), "aliased": aliased}


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", type=Path, help="output directory (created)")
    ap.add_argument("--backend", choices=["reference", "tensorrt"], default="reference",
                    help="the delegate the programs are for (tensorrt: buffers variants only)")
    ap.add_argument("--only", action="append", default=[], help="export only this file name (repeatable)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for noisy in ("executorch", "torch"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    args.dir.mkdir(parents=True, exist_ok=True)

    model = Decoder(TINY).eval()
    tokens, logits = greedy(model, STEPS)
    print(f"kv_delegate: torch {torch.__version__}, executorch {dist_version('executorch')}; eager tokens {tokens}")
    programs: Dict[str, Dict[str, object]] = {}
    variants = VARIANTS
    if args.backend == "tensorrt":
        variants = tuple(
            Variant(v.design, v.two_methods, v.planned, "tensorrt") for v in VARIANTS if v.design == "buffers"
        )
    for variant in variants:
        if args.only and variant.file not in args.only:
            continue
        model.reset_caches()
        data, summary = export_variant(model, variant)
        (args.dir / variant.file).write_bytes(data)
        print(f"kv_delegate: wrote {variant.file} ({len(data)} bytes; methods {variant.methods}; "
              f"not delegated: {summary['unsupported'] or 'nothing'}; aliased KV outputs: {len(summary['aliased'])})")
        programs[variant.file] = {"design": variant.design, "methods": variant.methods, "planned": variant.planned}
        if variant.backend == "tensorrt":
            programs[variant.file]["backend"] = "TensorRTBackend"

    if args.backend == "reference" and (not args.only or OUTSIDE_FILE in args.only):
        export_outside(args.dir)

    np.save(args.dir / "logits.npy", logits.numpy().astype(np.float32))
    expected = expected_json(tokens, programs)
    (args.dir / "expected.json").write_text(json.dumps(expected, indent=2) + "\n")
    print(f"kv_delegate: wrote expected.json and logits.npy {tuple(logits.shape)} into {args.dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
