"""What the partitioner leaves outside the delegate, and why, in the user's words.

A node is outside for a cause of its own (its operator has no lowering rule, or its rule refuses its form), or
because of another node left outside: the graph is split there, so what it reads (a causal mask, the positions, a
cache) is computed in another delegate call or by ExecuTorch, or what it computes is read there. The reason of
such a node names the nodes of the first kind that split the graph; the parts of an ``sdpa`` or ``rms_norm`` that
runs decomposed name that node and why it was not taken whole.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Dict, Iterable, List, NamedTuple, Optional, Set, Tuple

import torch

from .keep_whole import kept_origin, source
from .lowering import _DTYPES, op_name


class Outside(NamedTuple):
    """A node left outside the delegate: its name, operator, value (dtype and shape) and why, in the user's
    words."""

    node: str
    op: str
    value: str
    reason: str

    def __str__(self) -> str:
        return f"'{self.node}' ({self.op}, {self.value}): {self.reason}"


def value_of(node: torch.fx.Node) -> str:
    """A node's value as the reasons show it: ``f32 [1, 64]``, or a tuple of them."""
    val = node.meta.get("val")
    if isinstance(val, (list, tuple)):
        return "(" + ", ".join(_tensor(v) for v in val) + ")"
    return _tensor(val) if isinstance(val, torch.Tensor) else "no tensor value"


def _tensor(val: object) -> str:
    if isinstance(val, torch.Tensor):
        return f"{_DTYPES.get(val.dtype, str(val.dtype).replace('torch.', ''))} {list(val.shape)}"
    return type(val).__name__


def reason_of(node: torch.fx.Node, reason: str) -> str:
    """``reason`` without the node's name in front (the lowering's messages name it; :class:`Outside` does)."""
    prefix = f"'{node.name}': "
    return reason[len(prefix):] if reason.startswith(prefix) else reason


def no_rule(op: str) -> str:
    """Why a node whose operator the lowering has no rule for is outside."""
    return f"{op} is not an operator the reference graph runs"


def is_outside(node: torch.fx.Node, claimed: Set[str]) -> bool:
    """Whether ``node`` computes something ExecuTorch runs (a ``getitem`` only picks an output)."""
    return node.op == "call_function" and node.name not in claimed and op_name(node) not in ("_operator.getitem",
                                                                                              "getitem")


def decomposed_part(node: torch.fx.Node, decomposed: Dict[str, str]) -> bool:
    """Whether ``node`` is a part of a node kept whole that the first pass decomposed (``decomposed``, by
    :func:`~kv_delegate.keep_whole.kept_origin` key): it is outside because of another cause."""
    origin = kept_origin(node)
    return origin is not None and origin[0] in decomposed


def at_split(graph: torch.fx.Graph, groups: Dict[str, List[str]], names: Iterable[str]) -> Set[str]:
    """Those of ``names`` (nodes of ``groups``) whose group reads a value computed outside it, or computes one
    read outside it: a refusal there may be caused by the split (a causal mask whose positions come from another
    delegate call is no causal mask to the lowering), not by the node itself."""
    nodes = {node.name: node for node in graph.nodes}
    wanted = set(names)
    split_groups = set()
    for tag, members in groups.items():
        inside = set(members)
        for name in members:
            node = nodes[name]
            if any(other.op == "call_function" and other.name not in inside
                   for other in list(node.all_input_nodes) + list(node.users)):
                split_groups.add(tag)
                break
    return {name for tag in split_groups for name in groups[tag] if name in wanted}


def with_causes(graph: torch.fx.Graph, refused: Dict[str, str], split: Set[str], claimed: Set[str],
                decomposed: Dict[str, str], causes: Set[str]) -> Tuple[Dict[str, str], Set[str]]:
    """``refused`` with the reason of every node refused at a split (``split``: :func:`at_split`) naming what
    splits the graph, and the :func:`~kv_delegate.keep_whole.source` names of those causes: every node outside
    for a cause of its own, that is with no rule, refused where its group was whole, or a cause already
    (``causes``, from an earlier partition of the program); an ``sdpa`` or ``rms_norm`` decomposed for its form
    counts as one node, one decomposed because of the split (``decomposed``) as none."""
    found: Set[str] = set()
    named: "OrderedDict[str, List[str]]" = OrderedDict()
    for node in graph.nodes:
        if not is_outside(node, claimed) or decomposed_part(node, decomposed):
            continue
        if node.name in refused and node.name in split and source(node) not in causes:
            continue
        found.add(source(node))
        origin = kept_origin(node)
        name, op = (origin[1], origin[2]) if origin is not None else (node.name, op_name(node))
        if name not in named.setdefault(op, []):
            named[op].append(name)
    said = ", ".join(f"{op} ('{names[0]}'" + (f" and {len(names) - 1} more)" if len(names) > 1 else ")")
                     for op, names in named.items())
    suffix = f"; the graph is split here by what the delegate does not take: {said}" if said else ""
    nodes = {node.name: node for node in graph.nodes}
    reasons = {name: reason + suffix if name in split and source(nodes[name]) not in found else reason
               for name, reason in refused.items()}
    return reasons, found


def part_of(node: torch.fx.Node, decomposed: Dict[str, str], supported: Iterable[str]) -> Optional[str]:
    """Why ``node``, a part of a decomposed ``sdpa`` or ``rms_norm``, is outside: that node, and why it was not
    kept whole (``decomposed``: by :func:`~kv_delegate.keep_whole.kept_origin` key, why the delegate refused it)."""
    origin = kept_origin(node)
    if origin is None:
        return None
    key, name, op = origin
    if key in decomposed:
        why = decomposed[key]
    elif op not in supported:
        why = no_rule(op)
    else:
        why = "it is not in a form the delegate takes whole"
    return f"part of '{name}' ({op}), which runs decomposed on ExecuTorch's kernels: {why}"
