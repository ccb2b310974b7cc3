"""The operators the partitioner asks ExecuTorch to keep whole (``ops_to_not_decompose``): which node may be kept,
where a node of the edge program came from, and the edge program ExecuTorch will make of an ATen program when
some kept nodes are decomposed after all (the partitioner's first pass, :meth:`ReferencePartitioner._decide`).

ExecuTorch has no portable kernel for ``scaled_dot_product_attention`` or ``rms_norm``: a node kept whole must be
claimed by the delegate, or decomposed before the edge program is made. The partitioner decides which on the
program itself, before ExecuTorch decomposes it, by making that edge program here and partitioning it.
"""

from __future__ import annotations

import copy
from typing import Iterable, Optional, Set, Tuple

import torch
from torch.export import ExportedProgram

from .lowering import op_name

SDPA = torch.ops.aten.scaled_dot_product_attention.default
RMS_NORM = torch.ops.aten.rms_norm.default
#: The operators ``ops_to_not_decompose`` may keep whole (ExecuTorch has no portable kernel for them).
KEPT_WHOLE = ("aten.scaled_dot_product_attention.default", "aten.rms_norm.default")

#: ATen operators that only change a view of their input (skipped when looking for what produced a value).
VIEWS = ("aten.alias", "aten.clone", "aten.view", "aten._to_copy", "aten.contiguous", "aten.expand",
         "aten.unsqueeze", "aten.squeeze", "aten.reshape", "aten._unsafe_view")


def _producer(node: object, skip: Tuple[str, ...] = VIEWS) -> Optional[torch.fx.Node]:
    """The first producer of ``node`` that is not a copy or view (aten graph, before decomposition)."""
    for _ in range(12):
        if not isinstance(node, torch.fx.Node) or node.op != "call_function":
            return node if isinstance(node, torch.fx.Node) else None
        name = op_name(node)
        if not any(name.startswith(s + ".") for s in skip):
            return node
        node = node.args[0]
    return None


def keeps_sdpa(node: torch.fx.Node) -> bool:
    """Whether ``aten.scaled_dot_product_attention`` has a form the lowering takes: ``q`` ``[.., H, T, Dh]``,
    ``k``/``v`` cache updates (directly, or repeated per query-head group as transformers' ``repeat_kv`` and
    ``repeat_interleave`` do, or with ``enable_gqa``), an explicit causal mask ``le(...)`` (or its ``&`` with a
    sliding window's part), no dropout, no ``is_causal``, batch 1, f32, f16 or bf16. Any other ``sdpa`` is
    decomposed by ExecuTorch."""
    args = list(node.args)
    mask = args[3] if len(args) > 3 else node.kwargs.get("attn_mask")
    extra = dict(zip(("dropout_p", "is_causal", "scale", "enable_gqa"), args[4:]))
    extra.update({k: v for k, v in node.kwargs.items() if k != "attn_mask"})
    if not isinstance(mask, torch.fx.Node) or extra.get("dropout_p", 0.0) != 0.0 or extra.get("is_causal", False):
        return False
    vals = [a.meta.get("val") if isinstance(a, torch.fx.Node) else None for a in args[:3]]
    if not all(isinstance(v, torch.Tensor) and v.dim() in (3, 4) and v.dim() == vals[0].dim() for v in vals):
        return False
    q, k, v = vals
    if q.dtype not in (torch.float32, torch.float16, torch.bfloat16) or (q.dim() == 4 and q.shape[0] != 1):
        return False
    if k.shape != v.shape or q.shape[-3] % k.shape[-3] != 0:
        return False
    for cache in args[1:3]:
        update = _producer(cache)
        if update is None or not op_name(update).startswith(("aten.index_put", "aten.index_copy")):
            return False
    producer = _producer(mask)
    # `le`/`ge` (the causal mask), or `&` of it with a sliding window's part (which the lowering folds away).
    masks = ("aten.le.", "aten.ge.", "aten.bitwise_and.", "aten.logical_and.")
    return producer is not None and op_name(producer).startswith(masks)


def keeps_rms_norm(node: torch.fx.Node) -> bool:
    """Whether ``aten.rms_norm`` has the form the lowering takes: a weight, an explicit eps, over the last axis."""
    args = list(node.args)
    if len(args) < 4 or args[2] is None or args[3] is None:
        return False
    val = args[0].meta.get("val") if isinstance(args[0], torch.fx.Node) else None
    return (
        isinstance(val, torch.Tensor)
        and val.dtype in (torch.float32, torch.float16, torch.bfloat16)
        and list(args[1]) == [val.shape[-1]]
    )


def has_form(node: torch.fx.Node, supported: Iterable[str]) -> bool:
    """Whether ``node`` (an ATen ``sdpa`` or ``rms_norm``) has a form the lowering takes whole and a rule in
    ``supported``."""
    if op_name(node) not in supported:
        return False
    return keeps_sdpa(node) if node.target == SDPA else keeps_rms_norm(node)


def source(node: torch.fx.Node) -> str:
    """The name of the node of the first traced program that ``node`` comes from (``from_node``, kept by every
    decomposition and pass since): the same in the ATen program and in the edge program ExecuTorch makes of it."""
    sources = node.meta.get("from_node") or []
    name = node.name
    while sources:
        name = sources[-1].name
        sources = sources[-1].from_node
    return name


def kept_origin(node: torch.fx.Node) -> Optional[Tuple[str, str, str]]:
    """``(source, name, operator)`` of the ``sdpa`` or ``rms_norm`` node that ``node`` is (the one kept whole) or
    was made from (a part of one decomposed): its :func:`source` name (the key :meth:`_decide` uses), its name in
    the ATen program (what the user sees in ``ep.graph``) and its operator; ``None`` for any other node."""
    found = None
    sources = node.meta.get("from_node") or []
    while sources:
        target = str(sources[-1].target).replace("::", ".")
        op = next((op for op in KEPT_WHOLE if target.endswith(op)), None)
        if op is not None:
            found = (sources[-1].name, op)
        sources = sources[-1].from_node
    if found is None and op_name(node) in KEPT_WHOLE:
        found = (node.name, op_name(node))
    return None if found is None else (source(node), found[0], found[1])


def edge_program(program: ExportedProgram, kept: Set[str]) -> ExportedProgram:
    """The edge program ExecuTorch makes of ``program`` (an ATen program already decomposed but for ``sdpa`` and
    ``rms_norm``, as ``ops_to_not_decompose``'s check sees it), keeping whole the nodes whose :func:`source` is in
    ``kept`` and decomposing the others: ExecuTorch's own steps (``_gen_edge_manager_for_partitioners``) with the
    default ``EdgeCompileConfig``, on a copy of ``program`` (the weights shared, not copied)."""
    from executorch.exir.capture._config import EdgeCompileConfig
    from executorch.exir.program._program import (
        _generate_edge_program,
        _register_no_decomp_op,
        _restore_transformed_ops_to_aten_ops,
        aten_op_to_transform_op,
    )
    from executorch.exir.tracer import _default_decomposition_table

    memo = {id(t): t for t in list(program.state_dict.values()) + list(program.constants.values())}
    program = copy.deepcopy(program, memo)
    whole = [n for n in program.graph.nodes if n.op == "call_function" and n.target in (SDPA, RMS_NORM)]
    preserved = {n.target for n in whole if source(n) in kept}
    if any(source(n) not in kept for n in whole):
        # ExecuTorch's second pass: the nodes kept whole are hidden from the decomposition as a copy of their
        # operator, the others decomposed. (With nothing to decompose it changes nothing: skipped.)
        for node in whole:
            if source(node) in kept:
                _register_no_decomp_op(node.target)
                node.target = aten_op_to_transform_op[node.target]
        program = program.run_decompositions(_default_decomposition_table())
        _restore_transformed_ops_to_aten_ops(program)
    return _generate_edge_program(EdgeCompileConfig(), program, preserve_ops=list(preserved))
