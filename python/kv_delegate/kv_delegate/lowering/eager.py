"""Attention written by hand (transformers' ``eager_attention_forward``, any model): ``q @ k^T`` over the (repeated)
key cache, a scale (``mul``/``div``), Gemma 2's logit soft-capping (``tanh(s / c) * c``), the causal mask added as
a float mask (``where(mask, 0, min)``) or applied with ``where``, ``softmax`` (with casts around it), and ``@`` the
(repeated) value cache: folded into one ``causal_attention`` (:class:`~.values.Scores` carries it along), as
``sdpa`` is.

The layout ops on the way (``permute``, ``view``, ``expand``, ``clone``, casts) and the arithmetic (``mul``,
``div``, ``add``, ``tanh``) keep their ordinary rules for every other value: :meth:`EagerAttention.eager_rules`
wraps them."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable, Dict, Optional

import torch

from .common import LoweringError, describe, meta_shape, op_name, val_shape
from .values import (AdditiveMask, AllTrue, CacheGroups, CausalMask, HiddenMask, Known, KeysT, Scores, Tensor, Value,
                     kind)

#: Ordinary operators that eager attention's values pass through (the ordinary rule takes any other value).
_PASSING = ("aten.permute_copy.default", "aten.view_copy.default", "aten.view.default", "aten.expand_copy.default",
            "aten.clone.default", "dim_order_ops._clone_dim_order.default", "aten.alias_copy.default",
            "aten._to_copy.default", "dim_order_ops._to_dim_order_copy.default", "aten.mul.Tensor",
            "aten.mul.Scalar", "aten.div.Tensor", "aten.div.Scalar", "aten.add.Tensor", "aten.tanh.default")

#: A mask value at most this is "hidden" (transformers fills with the dtype's minimum; -inf also counts).
_HIDDEN = -1.0e4


class EagerAttention:
    """Mixed into :class:`..walk.Walk` (with :class:`..attention.Attention`, whose emitters it reuses)."""

    def eager_rules(self, ordinary: Dict[str, Callable[[torch.fx.Node], Value]]) -> Dict[str, Any]:
        rules: Dict[str, Any] = {
            "aten.bmm.default": self.bmm,
            "aten._softmax.default": self.softmax,
            "aten.where.self": self.where,
            "aten.logical_not.default": self.hidden,
            "aten.bitwise_not.default": self.hidden,
            "aten.masked_fill.Scalar": self.masked_fill,
            "aten.masked_fill.Tensor": self.masked_fill,
        }
        for name in _PASSING:
            if name in ordinary:
                rules[name] = lambda node, base=ordinary[name]: self.eager_or(node, base)
        return rules

    def eager_or(self, node: torch.fx.Node, ordinary: Callable[[torch.fx.Node], Value]) -> Value:
        """``node``'s value when it takes one of eager attention's values, else what ``ordinary`` makes of it."""
        args = [self.value(a) for a in node.args[:2]]
        eager = (KeysT, Scores, AdditiveMask, HiddenMask)
        if any(isinstance(a, eager) for a in args):
            return self.eager_step(node, args)
        if isinstance(args[0], Tensor) and args[0].name in self.cache_outputs and _transposes(node):
            return KeysT(args[0].name, 1, False, val_shape(node))
        if isinstance(args[0], CacheGroups) and args[0].merged and _layout(node):
            try:
                return ordinary(node)
            except LoweringError:
                return self.merged_cache_layout(node, args[0])
        return ordinary(node)

    # -- the cache operands ------------------------------------------------------------------------------------
    def merged_cache_layout(self, node: torch.fx.Node, value: CacheGroups) -> Value:
        """A repeated cache seen without (or with) a leading axis of 1, expanded to its own shape, or transposed."""
        shape = val_shape(node)
        if _transposes(node):
            return KeysT(value.cache, value.groups, value.tiled, shape)
        if [d for d in shape if d != 1] == [d for d in value.shape if d != 1] and shape[-3:] == value.shape[-3:]:
            return replace(value, shape=shape)
        raise LoweringError(f"'{node.name}': {kind(value)} seen as {list(shape)} is not [.., heads, L, Dh]")

    # -- scores --------------------------------------------------------------------------------------------------
    def eager_step(self, node: torch.fx.Node, args: list) -> Value:
        name = op_name(node)
        op = name.split(".")[1]
        first = args[0]
        if op in ("view_copy", "view", "expand_copy", "clone", "_clone_dim_order", "alias_copy", "_to_copy",
                  "_to_dim_order_copy"):
            return self.reshaped(node, first)
        if op == "tanh" and isinstance(first, Scores) and _linear(first):
            return replace(first, tanh=True)
        if op in ("mul", "div"):
            return self.scaled(node, op, args)
        if op == "add":
            return self.masked(node, args)
        raise LoweringError(f"'{node.name}': {kind(first)} does not fold into {name} (eager attention is q @ k^T, a "
                            "scale, an optional tanh soft-capping, the causal mask, softmax, @ v)")

    def reshaped(self, node: torch.fx.Node, value: Value) -> Value:
        """A view, expand to its own shape, copy or cast of an eager value: the same value, shaped as ``node``."""
        shape = val_shape(node)
        old = value.shape
        same_rows = shape[-2:] == old[-2:] and [d for d in shape if d != 1] == [d for d in old if d != 1]
        if not same_rows:
            raise LoweringError(f"'{node.name}': {kind(value)} {list(old)} seen as {list(shape)} (only unit axes may "
                                "change)")
        if isinstance(value, (AdditiveMask, HiddenMask)):
            return type(value)(value.mask, shape)
        return replace(value, shape=shape)

    def scaled(self, node: torch.fx.Node, op: str, args: list) -> Value:
        scores, factor = (args[0], args[1]) if isinstance(args[0], Scores) else (args[1], args[0])
        if not isinstance(scores, Scores) or (op == "div" and scores is not args[0]):
            raise LoweringError(f"'{node.name}': {op} of {kind(args[0])} and {kind(args[1])} is not a scale of the "
                                "attention scores")
        c = _factor(factor)
        if c is None:
            raise LoweringError(f"'{node.name}': the attention scores {op} {describe(node.args[1])}, not a number")
        if op == "div":
            c = 1.0 / c if c == c else c
        if scores.tanh and scores.softcap is None and scores.mask is None:
            # c * tanh(a s) = c * tanh((a c) s / c): soft-capping at c with the scale a c.
            return replace(scores, tanh=False, softcap=c, scale=scores.scale * c)
        if not _linear(scores):
            raise LoweringError(f"'{node.name}': the attention scores are scaled after the soft-capping, the mask "
                                "or the softmax")
        if c == c and not c > 0:
            raise LoweringError(f"'{node.name}': the attention scores are scaled by {c}, not a positive number")
        return replace(scores, scale=scores.scale * c)

    def masked(self, node: torch.fx.Node, args: list) -> Value:
        scores, mask = (args[0], args[1]) if isinstance(args[0], Scores) else (args[1], args[0])
        if not isinstance(scores, Scores) or not isinstance(mask, AdditiveMask):
            raise LoweringError(f"'{node.name}': {kind(args[0])} + {kind(args[1])} is not the attention scores plus "
                                "the causal mask")
        return self.with_mask(node, scores, mask.mask)

    def with_mask(self, node: torch.fx.Node, scores: Scores, mask: CausalMask) -> Scores:
        if scores.tanh or scores.mask is not None or scores.probs:
            raise LoweringError(f"'{node.name}': the causal mask is applied to {kind(scores)} twice, or between tanh "
                                "and its scale")
        if tuple(scores.shape[-2:]) != (mask.count, mask.rows):
            raise LoweringError(f"'{node.name}': the mask covers {mask.count} x {mask.rows}, the scores are "
                                f"{list(scores.shape)}")
        return replace(scores, mask=mask)

    def where(self, node: torch.fx.Node) -> Value:
        """``where(mask, 0, min)`` (or ``where(~mask, min, 0)``, a decomposed ``masked_fill``): the causal mask as
        additive float values; ``where(mask, scores, min)`` (or ``where(~mask, min, scores)``): the mask applied
        to the scores."""
        cond, a, b = (self.value(x) for x in node.args[:3])
        if isinstance(cond, CausalMask):
            keep, fill, fill_arg = a, b, node.args[2]
        elif isinstance(cond, HiddenMask):
            cond, keep, fill, fill_arg = cond.mask, b, a, node.args[1]
        else:
            raise LoweringError(f"'{node.name}': where over {kind(cond)}, not the causal mask")
        if not _hidden(fill):
            raise LoweringError(f"'{node.name}': where fills hidden positions with {describe(fill_arg)}, not a very "
                                "negative number")
        if isinstance(keep, Scores):
            return self.with_mask(node, keep, cond)
        if _factor(keep) == 0.0 or (isinstance(keep, Known) and keep.value.dtype != torch.bool and _all_zero(keep)):
            return AdditiveMask(cond, val_shape(node))
        raise LoweringError(f"'{node.name}': where keeps {kind(keep)} where the mask shows, neither 0 (a float "
                            "mask) nor the attention scores")

    def hidden(self, node: torch.fx.Node) -> Value:
        """``~mask``: where the causal mask hides (for ``masked_fill``)."""
        mask = self.value(node.args[0])
        if not isinstance(mask, CausalMask):
            raise LoweringError(f"'{node.name}': not of {kind(mask)}, not of the causal mask")
        return HiddenMask(mask, val_shape(node))

    def masked_fill(self, node: torch.fx.Node) -> Value:
        """``scores.masked_fill(~mask, min)``: the mask applied to the scores; ``zeros.masked_fill(~mask, min)``:
        the causal mask as additive float values."""
        x, where, fill = self.value(node.args[0]), self.value(node.args[1]), self.value(node.args[2])
        if not isinstance(where, HiddenMask):
            raise LoweringError(f"'{node.name}': masked_fill where {kind(where)}, not where the causal mask hides")
        if not _hidden(fill):
            raise LoweringError(f"'{node.name}': masked_fill with {describe(node.args[2])}, not a very negative "
                                "number")
        if isinstance(x, Scores):
            return self.with_mask(node, x, where.mask)
        if isinstance(x, Known) and not x.value.dtype == torch.bool and _all_zero(x):
            return AdditiveMask(where.mask, val_shape(node))
        raise LoweringError(f"'{node.name}': masked_fill of {kind(x)}, neither the attention scores nor zeros")

    def bmm(self, node: torch.fx.Node) -> Value:
        a, b = self.value(node.args[0]), self.value(node.args[1])
        if isinstance(b, KeysT):
            query = self.tensor(node.args[0], "self (the queries)", node)
            return Scores(query, b.cache, b.groups, b.tiled, val_shape(node))
        if isinstance(a, Scores) and a.probs:
            return self.eager_attention(node, a)
        raise LoweringError(f"'{node.name}': bmm of {kind(a)} and {kind(b)} is not eager attention's q @ k^T or "
                            "softmax(scores) @ v (a general bmm does not lower)")

    def softmax(self, node: torch.fx.Node) -> Value:
        scores = self.value(node.args[0])
        dim = node.args[1]
        if not isinstance(scores, Scores) or scores.probs or scores.tanh:
            raise LoweringError(f"'{node.name}': softmax of {kind(scores)}, not of the attention scores")
        if dim not in (-1, len(scores.shape) - 1):
            raise LoweringError(f"'{node.name}': softmax over dim {dim}, not over the cache rows")
        if scores.mask is None:
            raise LoweringError(f"'{node.name}': softmax of attention scores without the causal mask")
        return replace(scores, probs=True)

    def eager_attention(self, node: torch.fx.Node, probs: Scores) -> Value:
        """``softmax(scores) @ v``: one ``causal_attention``, shaped as ``node``."""
        v, groups, tiled = self._cache(node.args[1], "value", node)
        if (groups, tiled) != (probs.groups, probs.tiled):
            raise LoweringError(f"'{node.name}': the keys and the values are repeated over the query heads in "
                                "different orders")
        k_shape = self.desc.shapes[probs.cache][1]
        if self.desc.shapes[v][1] != k_shape or probs.shape[-1] != k_shape[-2]:
            raise LoweringError(f"'{node.name}': the value cache {list(self.desc.shapes[v][1])} is not the key "
                                f"cache's shape {list(k_shape)}")
        dtype, q_shape = self.desc.shapes[probs.query]
        # causal_attention takes head-major queries [1, Hq, T, Dh] with rank-4 caches.
        lead = (1,) * (len(k_shape) - 3)
        q = self.reshape(probs.query, lead + q_shape[-3:], f"{node.name}_q")
        scale = probs.scale if probs.scale == probs.scale else 1.0  # unknown at the dry run
        softcap = None if probs.softcap is None else probs.softcap if probs.softcap == probs.softcap else 1.0
        out_dtype, shape = meta_shape(node)
        if tiled:
            out = self.tiled_attention(node, q, probs.cache, v, groups, probs.mask.position, scale, softcap)
        else:
            out = self.desc.op("causal_attention", self.desc.fresh(f"{node.name}_attention"), dtype,
                               self.desc.shapes[q][1], q=q, k=probs.cache, v=v, position=probs.mask.position,
                               scale=float(scale), softcap=softcap)
        return Tensor(self.reshape(self.cast(out, out_dtype, f"{node.name}_cast"), shape, node.name))


def _layout(node: torch.fx.Node) -> bool:
    """Whether ``node`` only changes layout (a view, an expand, a copy, a permute)."""
    return any(op in op_name(node) for op in ("view", "expand", "clone", "alias", "permute"))


def _transposes(node: torch.fx.Node) -> bool:
    """Whether ``node`` is a permute swapping the last two axes alone."""
    if "permute" not in op_name(node):
        return False
    dims = [int(d) for d in node.args[1]]
    rank = len(dims)
    dims = [d + rank if d < 0 else d for d in dims]
    return dims == list(range(rank - 2)) + [rank - 1, rank - 2]


def _linear(scores: Scores) -> bool:
    """Whether the scores are still ``q @ k^T`` times a scale (no tanh, cap, mask or softmax yet)."""
    return not (scores.tanh or scores.softcap is not None or scores.mask is not None or scores.probs)


def _factor(value: Value) -> Optional[float]:
    """A number's value: a Python number or a known one-element tensor; ``nan`` for a known one whose value the
    partitioner's dry run cannot read; ``None`` for anything else."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, Known) and value.value.numel() == 1 and value.value.dtype != torch.bool:
        from torch._subclasses.fake_tensor import FakeTensor

        return math.nan if isinstance(value.value, FakeTensor) else float(value.value.reshape(()).item())
    return None


def _all_zero(value: Known) -> bool:
    """Whether a known value is zero everywhere (``False`` when the dry run cannot read it)."""
    from torch._subclasses.fake_tensor import FakeTensor

    return not isinstance(value.value, FakeTensor) and bool((value.value == 0).all())


def _hidden(value: Value) -> bool:
    """Whether ``value`` is a number at most :data:`_HIDDEN` (or unreadable at the dry run)."""
    c = _factor(value)
    return c is not None and (c != c or c <= _HIDDEN)
