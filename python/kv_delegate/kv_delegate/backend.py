"""``ReferenceBackend``: the ExecuTorch ``BackendDetails`` of the CPU reference delegate (class name = backend id)."""

from __future__ import annotations

import logging
from typing import Dict, List

from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from executorch.exir.backend.compile_spec_schema import CompileSpec
from torch.export import ExportedProgram

from .lowering import Lowered, lower
from .names import ALIASES_META, REFERENCE_BACKEND
from .pack import pack

log = logging.getLogger("kv_delegate")


class ReferenceBackend(BackendDetails):
    """Lowers a delegated subgraph to a reference-graph payload in a native blob.

    The blob's bindings are the delegate's arguments in ExecuTorch's order, taken from the subprogram: its user
    inputs in placeholder order, then its outputs in output order (buffer mutations first, as ExecuTorch
    arranges them), leaving out delegate-owned state (``tag_mutated_buffer``), which becomes ref-graph ``state``.
    """

    @staticmethod
    def preprocess(edge_program: ExportedProgram, compile_specs: List[CompileSpec]) -> PreprocessResult:
        """The processed bytes: the native blob ``delegate-pack`` writes."""
        lowered = lower(edge_program)
        log.info(
            "kv_delegate: %s lowers %d ops; bindings %s%s",
            REFERENCE_BACKEND,
            len(lowered.description.ops),
            [f"{b.role}:{b.name}" for b in lowered.bindings],
            f"; state {lowered.description.state}" if lowered.description.state else "",
        )
        return PreprocessResult(
            processed_bytes=pack(lowered, REFERENCE_BACKEND),
            _delegate_info_meta={ALIASES_META: aliased_outputs(lowered)},
        )


def aliased_outputs(lowered: Lowered) -> Dict[int, int]:
    """``{output index: input index}`` of the delegate's outputs that are a ``kv_cache_update`` of one of its
    inputs (the blob declares the alias; the delegate writes those rows in place)."""
    outs = [b.name for b in lowered.bindings if b.role == "output"]
    ins = [b.name for b in lowered.bindings if b.role == "input"]
    result: Dict[int, int] = {}
    for op in lowered.description.ops:
        if op["op"] == "kv_cache_update" and op["out"] in outs and op["cache"] in ins:
            result[outs.index(op["out"])] = ins.index(op["cache"])
    return result
