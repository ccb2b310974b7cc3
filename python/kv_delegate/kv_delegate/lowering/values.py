"""The values the lowering gives fx nodes: reference-graph tensors, constants known at export, and the symbolic
values that fold into a consumer (index arithmetic, the causal mask, head views, grouped-query cache views).

A symbolic value never reaches the reference graph by itself: a consumer folds it into one op (``positions``
into ``kv_cache_update``, ``CausalMask`` into ``causal_attention``), or :meth:`Lowerer.tensor` materialises it
with ordinary ops (``positions`` + ``reshape``, ``reshape`` + ``permute``), or the node does not lower.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple, Union

import torch


@dataclass(frozen=True)
class Tensor:
    """A reference-graph tensor."""

    name: str


@dataclass(eq=False)
class Known:
    """A value known at export: a weight, a buffer the program never mutates, a lifted constant, or what an op
    computes from such values alone (folded with torch at export). Declared as a reference-graph constant only
    when a consumer needs it as a tensor.

    ``transposed_of``: this value is ``other.T`` of a rank-2 ``other`` (a ``torch.nn.Linear`` weight seen by
    ``mm``), so ``mat_mul`` can read ``other`` with ``transpose_b`` instead of storing a transposed copy.
    """

    value: torch.Tensor
    name: str
    transposed_of: Optional["Known"] = None
    #: ``L`` when the value is ``arange(0, L)`` along its last axis (every other extent 1): known from how it
    #: was made, since the partitioner's dry run folds fake tensors whose values cannot be read.
    arange: Optional[int] = None
    #: With ``arange``: the value is ``arange(0, L) + offset`` for this known one-element ``offset`` (``None``:
    #: no offset). The dry run cannot read a fake offset, so the mask carries it as arithmetic on positions.
    offset: Optional["Known"] = None


@dataclass(frozen=True)
class Positions:
    """``position[0] + arange(count)`` (i64), shaped ``shape``: the reference graph's ``positions``. ``position``
    names an i64 ``[1]`` tensor."""

    position: str
    count: int
    shape: Tuple[int, ...]


@dataclass(frozen=True)
class FirstElement:
    """Element 0 of the i64 tensor ``source`` (``cache_position[0]``, what transformers' StaticCache selects),
    shaped ``shape`` (one element)."""

    source: str
    shape: Tuple[int, ...]


@dataclass(frozen=True)
class ShiftedPositions:
    """``positions - back`` for a constant ``back`` (a sliding window's lower edge), shaped like ``positions``;
    ``back`` a number, or a known one-element value (whose bytes the partitioner's fake program does not hold)."""

    positions: Positions
    back: Union[int, "Known"]


@dataclass(frozen=True)
class AllTrue:
    """A boolean mask known to be true everywhere a position can be (shape ``shape``): a sliding window at least
    as long as the cache, which never hides a row the cache holds."""

    shape: Tuple[int, ...]


@dataclass(frozen=True)
class CausalMask:
    """``arange(rows) <= positions``, broadcast to ``shape`` (last two axes ``[count, rows]``): row ``t`` sees
    cache rows ``0 ..= position + t``."""

    position: str
    count: int
    rows: int
    shape: Tuple[int, ...]


@dataclass(frozen=True)
class HeadView:
    """A ``[T, H * Dh]`` tensor seen as ``[T, H, Dh]`` (``heads_first=False``) or ``[H, T, Dh]``."""

    source: str
    heads: int
    head_dim: int
    heads_first: bool


@dataclass(frozen=True)
class CacheGroups:
    """An updated cache ``[.., Hkv, L, Dh]`` on its way to being repeated ``groups`` times per KV head
    (``repeat_kv``: ``unsqueeze`` -> ``expand`` -> ``clone`` -> ``view``), shaped ``shape``; ``merged`` once the
    view has folded the groups into the head axis, when ``causal_attention`` reads it as grouped-query attention
    without materialising the repeats."""

    cache: str
    groups: int
    shape: Tuple[int, ...]
    merged: bool
    #: The group axis before the KV-head axis (``k.unsqueeze(0).expand(g, Hkv, L, Dh)``): query head ``h`` reads
    #: KV head ``h % Hkv``, not ``h // groups``; attention then permutes the query heads around it.
    tiled: bool = False


@dataclass(frozen=True)
class AdditiveMask:
    """A causal mask as an additive float tensor, ``where(mask, 0, very negative)`` (eager attention's
    ``attention_mask``), shaped ``shape``: added to the scores, it hides what ``mask`` hides."""

    mask: CausalMask
    shape: Tuple[int, ...]


@dataclass(frozen=True)
class HiddenMask:
    """Where a causal mask hides (``~mask``, ``logical_not(mask)``), shaped ``shape``: what ``masked_fill``
    fills."""

    mask: CausalMask
    shape: Tuple[int, ...]


@dataclass(frozen=True)
class KeysT:
    """An updated key cache (or its repeats per query-head group, as :class:`CacheGroups`) with its last two axes
    swapped, ``[.., H, Dh, L]``: the right operand of eager attention's ``q @ k^T``."""

    cache: str
    groups: int
    tiled: bool
    shape: Tuple[int, ...]


@dataclass(frozen=True)
class Scores:
    """Eager attention on its way to one ``causal_attention``: ``q @ k^T`` of the query tensor ``query`` and the
    keys of ``cache`` (repeated ``groups`` times per KV head, ``tiled`` as :class:`CacheGroups`), shaped
    ``shape``, times ``scale``; with ``tanh`` the scaled scores have been through ``tanh`` (a multiplication by
    ``c`` then makes it the soft-capping ``c * tanh(s / c)``: ``softcap``); ``mask`` once the causal mask is
    applied; ``probs`` once the softmax is. ``scale`` or ``softcap`` is ``nan`` when a factor's value is not
    known (the partitioner's dry run sees fake constants; preprocess reads them)."""

    query: str
    cache: str
    groups: int
    tiled: bool
    shape: Tuple[int, ...]
    scale: float = 1.0
    softcap: Optional[float] = None
    tanh: bool = False
    mask: Optional[CausalMask] = None
    probs: bool = False


Value = Union[Tensor, Known, Positions, ShiftedPositions, AllTrue, FirstElement, CausalMask, HeadView, CacheGroups,
              AdditiveMask, HiddenMask, KeysT, Scores, None]


def kind(value: object) -> str:
    """What the lowering made of a value, in the user's words (never an internal class name)."""
    if isinstance(value, Tensor):
        return f"tensor '{value.name}'"
    if isinstance(value, Known):
        return f"a value known at export ({list(value.value.shape)})"
    if isinstance(value, Positions):
        return f"the positions input_pos + arange({value.count}) of shape {list(value.shape)}"
    if isinstance(value, FirstElement):
        return f"element 0 of '{value.source}'"
    if isinstance(value, CausalMask):
        return f"a causal mask of {value.count} x {value.rows}"
    if isinstance(value, ShiftedPositions):
        back = value.back.name if isinstance(value.back, Known) else value.back
        return f"the positions input_pos + arange({value.positions.count}) minus {back}"
    if isinstance(value, AllTrue):
        return f"a mask that is true everywhere ({list(value.shape)})"
    if isinstance(value, HeadView):
        order = "[H, T, Dh]" if value.heads_first else "[T, H, Dh]"
        return f"'{value.source}' seen as {order} with H = {value.heads}, Dh = {value.head_dim}"
    if isinstance(value, CacheGroups):
        return f"the cache '{value.cache}' repeated {value.groups} times per KV head"
    if isinstance(value, AdditiveMask):
        return f"a causal mask of {value.mask.count} x {value.mask.rows} as additive float values"
    if isinstance(value, HiddenMask):
        return f"where a causal mask of {value.mask.count} x {value.mask.rows} hides"
    if isinstance(value, KeysT):
        return f"the cache '{value.cache}' transposed (the keys of q @ k^T)"
    if isinstance(value, Scores):
        stage = "probabilities" if value.probs else "masked scores" if value.mask else "scores"
        return f"attention {stage} of '{value.query}' over the cache '{value.cache}'"
    if value is None:
        return "a value computed outside this delegate or not a tensor"
    return type(value).__name__
