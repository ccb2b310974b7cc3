"""``KvAliasMemoryPlanningPass``: ExecuTorch's memory planning, then each delegate KV output placed on its
mutable buffer's own storage, and the write-backs that became self-copies removed.

ExecuTorch writes a delegate's updated cache back with ``copy_(buffer, delegate_output)`` (inserted by
``insert_write_back_for_buffers_pass``, emitted as an ``aten::copy_`` kernel call); its planner gives the output
its own storage, so the copy moves the whole cache every call. This pass gives the output the buffer's
``(mem_id, mem_offset)``: the stock runtime then hands the delegate one pointer for the cache input and the
cache output, and the delegate updates rows in place. It only aliases outputs the delegate declares as in-place
updates of that very buffer (``kv_aliases`` in the lowered module's ``_delegate_info_meta``, written by
:class:`kv_delegate.ReferenceBackend`).

A ``copy_`` whose source and destination are then the same memory (same ``mem_id``, offset, dtype and shape)
would still run every call, its kernel copying the cache onto itself; the pass removes it (the graph output it
fed, a buffer mutation that the emitter drops, takes its source instead), so the program has no instruction for
it. Any other ``copy_`` (a source with storage of its own) stays.
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

    ``aliased``: ``(output node, buffer placeholder)`` names of every output placed; ``removed``: ``(copy_
    node, buffer placeholder)`` names of every write-back removed as a self-copy; for logs and checks.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pending: List[Tuple[torch.fx.GraphModule, Optional[ExportGraphSignature]]] = []
        self.aliased: List[Tuple[str, str]] = []
        self.removed: List[Tuple[str, str]] = []

    def run(
        self, graph_module: torch.fx.GraphModule, graph_signature: Optional[ExportGraphSignature] = None
    ) -> PassResult:
        result = super().run(graph_module, graph_signature)
        if self.share_mutable_buffers and graph_signature is not None:
            self._pending.append((graph_module, graph_signature))
        else:
            self._alias(graph_module)
            self._drop_self_copies(graph_module, graph_signature)
        return result

    def run_multimethod(self) -> None:
        super().run_multimethod()
        for graph_module, graph_signature in self._pending:
            self._alias(graph_module)
            self._drop_self_copies(graph_module, graph_signature)
        self._pending = []

    def _drop_self_copies(
        self, graph_module: torch.fx.GraphModule, graph_signature: Optional[ExportGraphSignature]
    ) -> None:
        """Removes every ``copy_(buffer, src)`` whose ``src`` is planned on the buffer's own memory."""
        dropped = False
        for node in list(graph_module.graph.nodes):
            # The write-back as `insert_write_back_for_buffers_pass` inserts it: `aten.copy_.default(buffer, new)`.
            if node.op != "call_function" or node.target is not torch.ops.aten.copy_.default or len(node.args) < 2:
                continue
            buffer, src = node.args[0], node.args[1]
            if not (isinstance(buffer, torch.fx.Node) and isinstance(src, torch.fx.Node)):
                continue
            if not _same_memory(buffer.meta.get("spec"), src.meta.get("spec")):
                continue
            # The copy's one use is the output node (a buffer mutation, dropped by the emitter): the mutation
            # is now its source, which already lives in the buffer.
            name = node.name
            node.replace_all_uses_with(src)
            _rename_output(graph_signature, name, src.name)
            graph_module.graph.erase_node(node)
            self.removed.append((name, buffer.name))
            dropped = True
            log.info("kv_delegate: removed %s, a write-back of %s onto its own memory", name, buffer.name)
        if dropped:
            graph_module.recompile()

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


def _same_memory(dst: Any, src: Any) -> bool:
    """Whether two planned tensor specs are one memory: same ``(mem_id, mem_offset)``, dtype and shape."""
    if dst is None or src is None or dst is src:
        return False
    if getattr(dst, "mem_id", None) is None or getattr(dst, "mem_offset", None) is None:
        return False
    return (
        (dst.mem_id, dst.mem_offset) == (src.mem_id, src.mem_offset)
        and dst.dtype == src.dtype
        and tuple(dst.shape) == tuple(src.shape)
    )


def _rename_output(graph_signature: Optional[ExportGraphSignature], old: str, new: str) -> None:
    """Points the output spec that named node ``old`` at node ``new``."""
    if graph_signature is None:
        return
    for spec in graph_signature.output_specs:
        arg = getattr(spec, "arg", None)
        if getattr(arg, "name", None) == old:
            arg.name = new
