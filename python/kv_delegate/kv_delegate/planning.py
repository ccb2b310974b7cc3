"""``KvAliasMemoryPlanningPass``: ExecuTorch's memory planning, then each delegate KV output placed on its
mutable buffer's own storage.

ExecuTorch writes a delegate's updated cache back with ``copy_(buffer, delegate_output)``; its planner gives
the output its own storage, so the copy moves the whole cache every call. This pass gives the output the
buffer's ``(mem_id, mem_offset)``: the stock runtime then hands the delegate one pointer for the cache input
and the cache output, the delegate updates rows in place, and the ``copy_`` is a self-copy. It only aliases
outputs the delegate declares as in-place updates of that very buffer (``kv_aliases`` in the lowered module's
``_delegate_info_meta``, written by :class:`kv_delegate.ReferenceBackend`); any other ``copy_`` is left alone.
"""

from __future__ import annotations

import logging
import operator
from typing import Any, List, Optional, Tuple

import torch
from executorch.exir.passes import MemoryPlanningPass
from torch.export import ExportGraphSignature
from torch.fx.passes.infra.pass_base import PassResult

from .names import ALIASES_META

log = logging.getLogger("kv_delegate")


def _is_delegate_call(node: Any) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and getattr(
        node.target, "__name__", ""
    ) == "executorch_call_delegate"


def _is_copy(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and "copy_" in str(getattr(node.target, "__name__", node.target))


class KvAliasMemoryPlanningPass(MemoryPlanningPass):
    """:class:`MemoryPlanningPass` (same arguments) plus the KV aliasing. With ``share_mutable_buffers=True``
    the buffers are placed in ``run_multimethod``, so the aliasing runs there, after them.

    ``aliased``: ``(output node, buffer placeholder)`` names of every output placed, for logs and checks.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pending: List[torch.fx.GraphModule] = []
        self.aliased: List[Tuple[str, str]] = []

    def run(
        self, graph_module: torch.fx.GraphModule, graph_signature: Optional[ExportGraphSignature] = None
    ) -> PassResult:
        result = super().run(graph_module, graph_signature)
        if self.share_mutable_buffers and graph_signature is not None:
            self._pending.append(graph_module)
        else:
            self._alias(graph_module)
        return result

    def run_multimethod(self) -> None:
        super().run_multimethod()
        for graph_module in self._pending:
            self._alias(graph_module)
        self._pending = []

    def _alias(self, graph_module: torch.fx.GraphModule) -> None:
        for node in graph_module.graph.nodes:
            if not _is_copy(node) or len(node.args) < 2:
                continue
            buffer, value = node.args[0], node.args[1]
            if not (
                isinstance(buffer, torch.fx.Node)
                and buffer.op == "placeholder"
                and isinstance(value, torch.fx.Node)
                and value.target is operator.getitem
                and _is_delegate_call(value.args[0])
            ):
                continue
            call, index = value.args[0], value.args[1]
            lowered = getattr(graph_module, call.args[0].target)
            aliases = (lowered.meta.get("_delegate_info_meta") or {}).get(ALIASES_META, {})
            if index not in aliases:
                continue
            # The input the delegate updates in place must be this very buffer.
            if call.args[1 + aliases[index]] is not buffer:
                continue
            dst, src = buffer.meta["spec"], value.meta["spec"]
            if dst.shape != src.shape or dst.dtype != src.dtype or dst.mem_id is None:
                continue
            src.mem_id, src.mem_offset = dst.mem_id, dst.mem_offset
            self.aliased.append((value.name, buffer.name))
            log.info("kv_delegate: %s placed on %s (mem_id %s, offset %s)", value.name, buffer.name, dst.mem_id,
                     dst.mem_offset)
