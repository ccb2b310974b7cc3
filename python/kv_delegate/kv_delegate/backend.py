"""The ExecuTorch ``BackendDetails`` of our delegates (class name = backend id): ``ReferenceBackend`` (the CPU
reference delegate), ``CudaBackend`` (the CUDA delegate, same payload) and ``TensorRTBackend`` (the TensorRT
delegate)."""

from __future__ import annotations

import copy
import logging
from typing import Dict, List, Optional

from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from executorch.exir.backend.compile_spec_schema import CompileSpec
from torch.export import ExportedProgram

from .lowering import Lowered, lower
from .names import ALIASES_META, CUDA_BACKEND, REFERENCE_BACKEND, TENSORRT_BACKEND
from .pack import TRT_PACKER_ENV, pack, pack_file, packer
from .streamed import blob, streaming

log = logging.getLogger("kv_delegate")


def _preprocess(edge_program: ExportedProgram, backend: str, tool: Optional[str]) -> PreprocessResult:
    lowered = lower(edge_program)
    log.info(
        "kv_delegate: %s lowers %d ops; bindings %s%s",
        backend,
        len(lowered.description.ops),
        [f"{b.role}:{b.name}" for b in lowered.bindings],
        f"; state {lowered.description.state}" if lowered.description.state else "",
    )
    return PreprocessResult(
        processed_bytes=(blob(lambda out: pack_file(lowered, backend, out, tool=tool)) if streaming()
                         else pack(lowered, backend, tool=tool)),
        _delegate_info_meta={ALIASES_META: aliased_outputs(lowered)},
    )


def _copy_sharing_weights(cls: type, edge_program: ExportedProgram,
                          compile_specs: List[CompileSpec]) -> ExportedProgram:
    """The program ``preprocess`` gets: ExecuTorch's isolated copy (``copy_exported_program_for_preprocess``)
    without copying its weights and constants. ``preprocess`` only reads them (the lowering streams their bytes
    to the packer), so sharing them leaves the original as it was while a model's weights are not held twice."""
    memo = {id(t): t for t in list(edge_program.state_dict.values()) + list(edge_program.constants.values())}
    return copy.deepcopy(edge_program, memo)


class ReferenceBackend(BackendDetails):
    """Lowers a delegated subgraph to a reference-graph payload in a native blob.

    The blob's bindings are the delegate's arguments in ExecuTorch's order, taken from the subprogram: its user
    inputs in placeholder order, then its outputs in output order (buffer mutations first, as ExecuTorch
    arranges them), leaving out delegate-owned state (``tag_mutated_buffer``), which becomes ref-graph ``state``.
    """

    copy_exported_program_for_preprocess = classmethod(_copy_sharing_weights)

    @staticmethod
    def preprocess(edge_program: ExportedProgram, compile_specs: List[CompileSpec]) -> PreprocessResult:
        """The processed bytes: the native blob ``delegate-pack`` writes."""
        return _preprocess(edge_program, REFERENCE_BACKEND, None)


class CudaBackend(BackendDetails):
    """:class:`ReferenceBackend`'s blob for the CUDA delegate (``plugins/cuda``): the same reference-graph payload,
    bindings and aliases, with backend id ``CudaBackend``."""

    copy_exported_program_for_preprocess = classmethod(_copy_sharing_weights)

    @staticmethod
    def preprocess(edge_program: ExportedProgram, compile_specs: List[CompileSpec]) -> PreprocessResult:
        """The processed bytes: the native blob ``delegate-pack`` writes."""
        return _preprocess(edge_program, CUDA_BACKEND, None)


class TensorRTBackend(BackendDetails):
    """Lowers a delegated subgraph as :class:`ReferenceBackend` does, then builds the reference graph into a
    TensorRT-RTX engine (``kv_example_trt::network_from_graph``, real ``IKVCacheUpdateLayer``s) in a native blob,
    with the same bindings in the same order. The packer is kv-example-trt's ``trt_pack`` example
    (``$KV_TRT_PACK``); building needs the TensorRT-RTX library, not a GPU. Caches are engine I/O of shape
    ``[1, H, L, Dh]`` (the bytes of the program's ``[H, L, Dh]`` buffers); delegate-owned state is refused.
    """

    copy_exported_program_for_preprocess = classmethod(_copy_sharing_weights)

    @staticmethod
    def preprocess(edge_program: ExportedProgram, compile_specs: List[CompileSpec]) -> PreprocessResult:
        """The processed bytes: the native blob ``trt_pack`` writes."""
        return _preprocess(edge_program, TENSORRT_BACKEND, packer(TRT_PACKER_ENV, "trt-pack"))


def aliased_outputs(lowered: Lowered) -> Dict[int, int]:
    """``{output index: input index}`` of the delegate's outputs that are a ``kv_cache_update`` or an ``assign``
    of one of its inputs (the blob declares the alias; the delegate writes those rows, or the whole buffer, in
    place)."""
    outs = [b.name for b in lowered.bindings if b.role == "output"]
    ins = [b.name for b in lowered.bindings if b.role == "input"]
    result: Dict[int, int] = {}
    for op in lowered.description.ops:
        written = {"kv_cache_update": op.get("cache"), "assign": op.get("target")}.get(op["op"])
        if written is not None and op["out"] in outs and written in ins:
            result[outs.index(op["out"])] = ins.index(written)
    return result
