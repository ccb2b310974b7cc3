"""Lowers a delegated edge subgraph to a reference-graph description (ref-graph payload 1.x JSON).

The lowering evaluates the subgraph symbolically (:mod:`.walk`): every fx node becomes a reference-graph tensor,
a value known at export (weights, ``arange``, anything computed from them alone, folded with torch), or a
*symbolic* value (:mod:`.values`) that folds into one reference-graph op when consumed: the positions
``input_pos + arange(T)`` (or transformers' ``cache_position``), the causal mask built from them, a head split,
a cache repeated per query-head group. So ``index_put(cache, [.., positions], k)`` becomes one ``kv_cache_update``
and ``sdpa(q, repeat_kv(k'), repeat_kv(v'), mask)`` one grouped-query ``causal_attention``; ordinary ops
(:mod:`.rules`, :mod:`.layout`) map to the reference graph's elementwise, reduction, cast and layout ops; and
:mod:`.fuse` turns decomposed RMSNorms and SiLUs back into one op each. Anything that does not lower raises
:class:`LoweringError` naming the node, and the partitioner leaves that node outside.
"""

from __future__ import annotations

from typing import Dict, Optional

import torch
from torch.export import ExportedProgram

from .attention import Attention
from .common import DTYPES, LoweringError, describe, op_name
from .description import CONSTANT_ALIGN, Binding, Description, Lowered
from .layout import Layout
from .rules import Rules
from .walk import Walk

#: Kept for callers of the single-module lowering.
_DTYPES = DTYPES


class _Lowerer(Rules, Layout, Attention, Walk):
    """The lowering of one subgraph: the walk with every rule."""

    def __init__(self, program: ExportedProgram, real: Optional[Dict[str, torch.Tensor]] = None) -> None:
        super().__init__(program, real)
        self.rules = {**self.ordinary_rules(), **self.attention_rules()}


#: Operators that create a value from their arguments alone (folded at export into a known value).
CREATION_OPS = frozenset({
    "aten.arange.start_step",
    "aten.arange.default",
    "aten.full.default",
    "aten.scalar_tensor.default",
    "aten.zeros.default",
    "aten.ones.default",
})


def rule_names() -> frozenset:
    """The edge operators the lowering takes (a rule, or folded at export): the partitioner's candidates."""
    probe = _Lowerer.__new__(_Lowerer)
    return frozenset({**probe.ordinary_rules(), **probe.attention_rules()}) | CREATION_OPS


def lower(program: ExportedProgram, real: Optional[Dict[str, torch.Tensor]] = None) -> Lowered:
    """Lowers a delegated subprogram (what ``BackendDetails.preprocess`` receives). ``real``: the values of
    constants that ``program`` holds as fake tensors, by name (the partitioner's dry run passes the program's)."""
    return _Lowerer(program, real).lower()


__all__ = ["Binding", "CONSTANT_ALIGN", "Description", "Lowered", "LoweringError", "describe", "lower", "op_name",
           "rule_names"]
