"""The rules that make a decoder's attention: the causal mask, the in-place cache update and attention itself
(grouped-query attention read from the caches without materialising the repeats)."""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch

from .common import LoweringError, describe, meta_shape, op_name
from .eager import EagerAttention
from .rules import is_arange
from .values import AllTrue, CacheGroups, CausalMask, HeadView, Known, Positions, ShiftedPositions, Tensor, Value, kind


class Attention(EagerAttention):
    """Mixed into :class:`..walk.Walk`."""

    def attention_rules(self) -> dict:
        return {
            **self.eager_rules(self.ordinary_rules()),
            "aten.le.Tensor": self.le,
            "aten.ge.Tensor": self.le,
            "aten.gt.Tensor": self.window,
            "aten.bitwise_and.Tensor": self.mask_and,
            "aten.logical_and.default": self.mask_and,
            "aten.index_put.default": self.index_put,
            "aten.index_copy.default": self.index_copy,
            "aten.scaled_dot_product_attention.default": self.sdpa,
        }

    def le(self, node: torch.fx.Node) -> Value:
        a, b = self.value(node.args[0]), self.value(node.args[1])
        rows, pos = (a, b) if op_name(node).startswith("aten.le") else (b, a)
        length = is_arange(rows)
        if length is not None and isinstance(pos, Positions) and pos.shape and pos.shape[-1] == 1:
            shape = tuple(int(d) for d in node.meta["val"].shape)
            if shape[-2:] == (pos.count, length):
                return CausalMask(self.shifted(pos.position, rows.offset, node), pos.count, length, shape)
        raise LoweringError(
            f"'{node.name}': {describe(node.args[0])} <= {describe(node.args[1])} is not the causal mask "
            "arange(L) <= (input_pos + arange(T))[:, None]"
        )

    def window(self, node: torch.fx.Node) -> Value:
        """``arange(L) > positions - W``, a sliding window's lower edge: true wherever the cache has a row when
        the window is at least the cache's length (a position is below ``L``, so ``j > p - W`` for every row ``j``).
        A shorter window is not lowered."""
        rows, low = self.value(node.args[0]), self.value(node.args[1])
        length = is_arange(rows)
        if length is not None and isinstance(low, ShiftedPositions):
            # `j + c > p - W` for every row j >= 0 and position p < L when W + c >= L. The partitioner's dry run
            # sees fake constants: it claims the node, and preprocess, which reads them, refuses a window shorter
            # than the cache naming it.
            back, offset = _number(low.back), 0 if rows.offset is None else _number(rows.offset)
            if back is None or offset is None or back + offset >= length:
                return AllTrue(tuple(int(d) for d in node.meta["val"].shape))
            raise LoweringError(f"'{node.name}': a sliding window of {back} positions is shorter than the cache of "
                                f"{length}; causal_attention has no window")
        raise LoweringError(
            f"'{node.name}': {describe(node.args[0])} > {describe(node.args[1])} is not a sliding window at least as "
            "long as the cache (arange(L) > positions - W with W >= L)"
        )

    def mask_and(self, node: torch.fx.Node) -> Value:
        """``mask & all-true`` is ``mask`` (the sliding window's part of transformers' mask, folded away)."""
        a, b = self.value(node.args[0]), self.value(node.args[1])
        for keep, other in ((a, b), (b, a)):
            if _all_true(other) and isinstance(keep, (CausalMask, AllTrue)):
                return keep
        raise LoweringError(f"'{node.name}': {describe(node.args[0])} & {describe(node.args[1])} is not a causal mask "
                            "and a mask that is true everywhere")

    def shifted(self, position: str, offset: Optional[Known], node: torch.fx.Node) -> str:
        """``position - offset``: ``arange(L) + c <= p + t`` is ``arange(L) <= (p - c) + t``."""
        if offset is None:
            return position
        return self.desc.op("sub", self.desc.fresh(f"{node.name}_position"), "i64", [1], a=position,
                            b=self.cast(self.known(offset), "i64", f"{node.name}_offset"))

    def _cache_update(self, node: torch.fx.Node, cache: Any, index: Any, update: Any) -> Value:
        pos = self.value(index)
        if not isinstance(pos, Positions):
            raise LoweringError(f"'{node.name}': the row index is {kind(pos)}, not input_pos + arange(T)")
        cache_name = self.tensor(cache, "cache", node)
        upd = self.value(update)
        if isinstance(upd, HeadView) and upd.heads_first:
            update_name = upd.source  # token-major [T, H * Dh]
        elif isinstance(upd, Tensor) or upd is not None:
            update_name = self.tensor(update, "values", node)  # head-major [.., H, T, Dh]
        else:
            raise LoweringError(f"'{node.name}': the cache update's values {describe(update)} are {kind(upd)}")
        out = self.out(node, "kv_cache_update", cache=cache_name, update=update_name, position=pos.position)
        self.cache_outputs[out.name] = cache_name
        return out

    def index_put(self, node: torch.fx.Node) -> Value:
        cache, indices, update = node.args[0], list(node.args[1]), node.args[2]
        accumulate = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)
        _, shape = meta_shape(node)
        row_axis = len(shape) - 2
        if accumulate or len(indices) != row_axis + 1 or any(i is not None for i in indices[:-1]):
            raise LoweringError(f"'{node.name}': index_put is not a row write cache[.., positions, :] = values")
        return self._cache_update(node, cache, indices[-1], update)

    def index_copy(self, node: torch.fx.Node) -> Value:
        cache, dim, index, update = node.args
        _, shape = meta_shape(node)
        if dim not in (len(shape) - 2, -2):
            raise LoweringError(f"'{node.name}': index_copy along dim {dim}, cache rows are dim {len(shape) - 2}")
        return self._cache_update(node, cache, index, update)

    def _cache(self, arg: Any, what: str, node: torch.fx.Node) -> Tuple[str, int, bool]:
        """An attention key or value operand: an updated cache, or one repeated per query-head group; with the
        number of groups and whether they are tiled (see :class:`CacheGroups`)."""
        value = self.value(arg)
        if isinstance(value, CacheGroups) and value.merged:
            return value.cache, value.groups, value.tiled
        if isinstance(value, Tensor) and value.name in self.cache_outputs:
            return value.name, 1, False
        raise LoweringError(f"'{node.name}': the {what} {describe(arg)} is not a cache update's output in this "
                            f"delegate ({kind(value)})")

    def sdpa(self, node: torch.fx.Node) -> Value:
        mask = node.args[3] if len(node.args) > 3 else node.kwargs.get("attn_mask")
        rest = dict(zip(("dropout_p", "is_causal", "scale", "enable_gqa"), node.args[4:]))
        rest.update({key: val for key, val in node.kwargs.items() if key != "attn_mask"})
        if rest.get("dropout_p", 0.0) != 0.0 or rest.get("is_causal", False):
            raise LoweringError(f"'{node.name}': attention with dropout or is_causal (the mask must be explicit)")
        m = self.value(mask) if isinstance(mask, torch.fx.Node) else None
        if not isinstance(m, CausalMask):
            raise LoweringError(f"'{node.name}': the mask {describe(mask)} is not the causal mask over the cache "
                                f"({kind(m)})")
        k, groups, tiled = self._cache(node.args[1], "key", node)
        v, v_groups, v_tiled = self._cache(node.args[2], "value", node)
        if self.desc.shapes[k][1][-2] != m.rows:
            raise LoweringError(f"'{node.name}': the mask covers {m.rows} rows, the cache is "
                                f"{list(self.desc.shapes[k][1])}")
        if (groups, tiled) != (v_groups, v_tiled):
            raise LoweringError(f"'{node.name}': the keys and the values are repeated over the query heads in "
                                "different orders")
        scale: Optional[float] = rest.get("scale")
        if tiled:
            q_name = self.tensor(node.args[0], "query", node)
            scale = None if scale is None else float(scale)
            return Tensor(self.tiled_attention(node, q_name, k, v, groups, m.position, scale, None))
        q = self.value(node.args[0])
        if isinstance(q, HeadView) and q.heads_first:
            dtype, q_shape = self.desc.shapes[q.source]
            name = self.desc.op("causal_attention", self.desc.fresh(f"{node.name}_out"), dtype, q_shape,
                                q=q.source, k=k, v=v, position=m.position, scale=None if scale is None else float(scale))
            return HeadView(name, q.heads, q.head_dim, heads_first=True)
        return self.out(node, "causal_attention", q=self.tensor(node.args[0], "query", node), k=k, v=v,
                        position=m.position, scale=None if scale is None else float(scale))

    def tiled_attention(self, node: torch.fx.Node, query: str, k: str, v: str, groups: int, position: str,
                        scale: Optional[float], softcap: Optional[float]) -> str:
        """Attention of ``query`` (head-major) whose query head ``h`` reads KV head ``h % Hkv`` (caches repeated in
        tiled order), as ``causal_attention``, which reads KV head ``h // groups``: the query heads are reordered
        so that those of one KV head are adjacent (``[g, Hkv]`` -> ``[Hkv, g]``), and the output's heads back."""
        kv_heads = self.desc.shapes[k][1][-3]
        q = self.heads_swapped(query, groups, kv_heads, f"{node.name}_q")
        dtype, shape = self.desc.shapes[q]
        out = self.desc.op("causal_attention", self.desc.fresh(f"{node.name}_grouped"), dtype, shape, q=q, k=k, v=v,
                           position=position, scale=scale, softcap=softcap)
        return self.heads_swapped(out, kv_heads, groups, node.name)

    def heads_swapped(self, name: str, outer: int, inner: int, base: str) -> str:
        """``[.., outer * inner, T, Dh]`` with its head axis read as ``[outer, inner]`` and written as
        ``[inner, outer]``."""
        _, shape = self.desc.shapes[name]
        lead, rest, r = shape[:-3], shape[-2:], len(shape) - 3
        split = self.reshape(name, lead + (outer, inner) + rest, f"{base}_heads")
        swapped = self.permute(split, list(range(r)) + [r + 1, r, r + 2, r + 3], f"{base}_swapped")
        return self.reshape(swapped, shape, f"{base}_merged")


def _all_true(value: Value) -> bool:
    """Whether ``value`` is true everywhere: :class:`AllTrue`, or a known boolean tensor of ``True``."""
    if isinstance(value, AllTrue):
        return True
    if isinstance(value, Known) and value.value.dtype == torch.bool:
        from torch._subclasses.fake_tensor import FakeTensor

        return not isinstance(value.value, FakeTensor) and bool(value.value.all())
    return False


def _number(value: object) -> Optional[int]:
    """An integer constant's value; ``None`` for a fake one (the partitioner's dry run)."""
    if isinstance(value, Known):
        from torch._subclasses.fake_tensor import FakeTensor

        return None if isinstance(value.value, FakeTensor) else int(value.value.reshape(()).item())
    return int(value)
