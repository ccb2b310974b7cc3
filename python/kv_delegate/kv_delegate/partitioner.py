"""``ReferencePartitioner``: tags the nodes the reference delegate runs and reports the ones it leaves out."""

from __future__ import annotations

import logging
import re
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
from executorch.exir.backend.utils import tag_constant_data, tag_mutated_buffer
from torch.export import ExportedProgram
from torch.export.graph_signature import OutputKind
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from .lowering import op_name
from .names import CACHE_META, OUTPUT_NAME_META, REFERENCE_BACKEND, TENSORRT_BACKEND

log = logging.getLogger("kv_delegate")

#: Edge operators the lowering folds into reference-graph ops (see lowering.py for the patterns).
SUPPORTED_OPS: Dict[str, str] = {
    "aten.embedding.default": "gather",
    "aten.index_select.default": "gather",
    "aten.add.Tensor": "add, or positions (input_pos + arange)",
    "aten.arange.start_step": "positions / causal mask (folded)",
    "aten.arange.default": "positions / causal mask (folded)",
    "aten.view_copy.default": "layout (folded)",
    "aten.permute_copy.default": "layout (folded)",
    "aten.clone.default": "layout (folded)",
    "aten.alias_copy.default": "layout (folded)",
    "dim_order_ops._clone_dim_order.default": "layout (folded)",
    "aten.le.Tensor": "causal mask (folded)",
    "aten.mm.default": "mat_mul",
    "aten.rms_norm.default": "rms_norm",
    "aten.index_put.default": "kv_cache_update",
    "aten.index_copy.default": "kv_cache_update",
    "aten.scaled_dot_product_attention.default": "causal_attention",
}


def cache_out_name(cache: str) -> str:
    """The reference-graph name of a cache's updated value: ``k_cache_0`` -> ``k_cache_out_0`` (kv-example's)."""
    match = re.fullmatch(r"(.*)_(\d+)", cache)
    return f"{match.group(1)}_out_{match.group(2)}" if match else f"{cache}_out"


class _Support(OperatorSupportBase):
    """Node support: the op is in :data:`SUPPORTED_OPS`; records every rejection."""

    def __init__(self, rejected: List[Tuple[str, str]]) -> None:
        super().__init__()
        self.rejected = rejected

    def is_node_supported(self, submodules: object, node: torch.fx.Node) -> bool:
        if node.op != "call_function":
            return False
        name = op_name(node)
        if name in SUPPORTED_OPS:
            return True
        self.rejected.append((node.name, name))
        return False


class ReferencePartitioner(Partitioner):
    """Partitions an edge program for ``ReferenceBackend``.

    Args:
        owned_state: move the mutable buffers the delegate updates into the delegate
            (``tag_mutated_buffer``): they become reference-graph ``state`` and leave the call's arguments.
        output_names: names of the method's user outputs, in order (e.g. ``["logits"]``); the blob binds the
            delegate outputs that produce them under these names (default: the node names).
    """

    #: The backend the partitions are for.
    backend_id = REFERENCE_BACKEND

    def __init__(self, owned_state: bool = False, output_names: Sequence[str] = ()) -> None:
        super().__init__()
        self.owned_state = owned_state
        self.output_names = list(output_names)
        self.delegation_spec = DelegationSpec(self.backend_id, [])
        self._rejected: List[Tuple[str, str]] = []

    def ops_to_not_decompose(
        self, ep: ExportedProgram
    ) -> Tuple[List[torch._ops.OpOverload], Optional[Callable[[torch.fx.Node], bool]]]:
        """Keeps ``aten.rms_norm`` and ``aten.scaled_dot_product_attention`` whole (one reference-graph op each),
        when they have the form the lowering takes (a weight and eps; a mask, no causal flag, no dropout)."""

        def keep(node: torch.fx.Node) -> bool:
            if node.target == torch.ops.aten.rms_norm.default:
                return len(node.args) >= 4 and node.args[2] is not None and node.args[3] is not None
            if node.target == torch.ops.aten.scaled_dot_product_attention.default:
                mask = node.args[3] if len(node.args) > 3 else node.kwargs.get("attn_mask")
                return (
                    mask is not None
                    and not node.kwargs.get("is_causal", False)
                    and node.kwargs.get("dropout_p", 0.0) == 0.0
                    and node.kwargs.get("scale") is None
                    and len(node.args) <= 4
                )
            return True

        return ([torch.ops.aten.rms_norm.default, torch.ops.aten.scaled_dot_product_attention.default], keep)

    def unsupported(self) -> List[Tuple[str, str]]:
        """``(node, operator)`` of every node the last :meth:`partition` left outside the delegate."""
        return list(self._rejected)

    def _annotate(self, ep: ExportedProgram) -> None:
        """Names the caches after their buffers and the user outputs after ``output_names``."""
        sig = ep.graph_signature
        buffers = sig.inputs_to_buffers
        mutated = set(sig.buffers_to_mutate.values())
        for node in ep.graph.nodes:
            if op_name(node) in ("aten.index_put.default", "aten.index_copy.default") and node.args:
                target = buffers.get(getattr(node.args[0], "name", None))
                if target in mutated:
                    node.meta[CACHE_META] = {"cache": target, "out": cache_out_name(target)}
        outputs = ep.graph.output_node().args[0]
        user = [arg for spec, arg in zip(sig.output_specs, outputs) if spec.kind == OutputKind.USER_OUTPUT]
        for name, arg in zip(self.output_names, user):
            if isinstance(arg, torch.fx.Node):
                arg.meta[OUTPUT_NAME_META] = name

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        """Tags every supported node (connected groups become one delegate each), then the constants they
        read, then (``owned_state``) the caches; logs the nodes left outside."""
        self._rejected = []
        self._annotate(exported_program)
        support = _Support(self._rejected)
        partitions = CapabilityBasedPartitioner(
            exported_program.graph_module, support, allows_single_node_partition=True
        ).propose_partitions()
        tags: Dict[str, DelegationSpec] = {}
        for partition in partitions:
            tag = f"{self.backend_id}_{partition.id}"
            for node in partition.nodes:
                node.meta["delegation_tag"] = tag
            tags[tag] = self.delegation_spec
        tag_constant_data(exported_program)
        if self.owned_state:
            tag_mutated_buffer(exported_program)
        for node, op in self._rejected:
            log.warning("kv_delegate: not delegated to %s: %s (%s)", self.backend_id, node, op)
        log.info("kv_delegate: %d partition(s) for %s, %d node(s) left outside", len(tags), self.backend_id,
                 len(self._rejected))
        return PartitionResult(tagged_exported_program=exported_program, partition_tags=tags)


class TensorRTPartitioner(ReferencePartitioner):
    """:class:`ReferencePartitioner` for ``TensorRTBackend`` (same ops). A TensorRT engine keeps no state between
    executions, so ``owned_state`` is refused."""

    backend_id = TENSORRT_BACKEND

    def __init__(self, owned_state: bool = False, output_names: Sequence[str] = ()) -> None:
        if owned_state:
            raise ValueError("TensorRTBackend cannot own caches: export them as program buffers")
        super().__init__(owned_state=False, output_names=output_names)
