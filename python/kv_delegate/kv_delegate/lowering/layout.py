"""The rules for layout ops (view, unsqueeze, squeeze, expand, permute, slice, select, cat, copy): most fold
into a symbolic value or a ``reshape``; the rest become ``permute``, ``slice`` and ``concat``."""

from __future__ import annotations

import math
from typing import Any, Sequence, Tuple

import torch

from .common import LoweringError, describe, meta_shape, val_shape
from .values import CacheGroups, CausalMask, FirstElement, HeadView, Positions, Tensor, Value, kind


def _dim(dim: int, rank: int) -> int:
    return dim + rank if dim < 0 else dim


class Layout:
    """Mixed into :class:`..walk.Walk`."""

    def reshape_value(self, value: Value, shape: Tuple[int, ...], node: torch.fx.Node) -> Value:
        """``value`` seen as ``shape`` (same elements in the same order)."""
        numel = math.prod(shape)
        if isinstance(value, Positions) and numel == value.count:
            return Positions(value.position, value.count, shape)
        if isinstance(value, FirstElement) and numel == 1:
            return FirstElement(value.source, shape)
        if isinstance(value, CausalMask) and numel == math.prod(value.shape):
            return CausalMask(value.position, value.count, value.rows, shape)
        if isinstance(value, CacheGroups):
            return self.merge_groups(value, shape, node)
        if isinstance(value, HeadView) and not value.heads_first and shape == self.desc.shapes[value.source][1]:
            return Tensor(value.source)
        if isinstance(value, Tensor):
            _, current = self.desc.shapes[value.name]
            if current == shape:
                return value
            if value.name in self.cache_outputs and len(shape) == len(current) + 1 and tuple(
                d for d in shape if d != 1
            ) == tuple(d for d in current if d != 1):
                return CacheGroups(value.name, 1, shape, merged=False)
            splits_rows = len(current) == 2 and len(shape) == 3 and shape[0] == current[0]
            if splits_rows and shape[1] * shape[2] == current[1]:
                return HeadView(value.name, shape[1], shape[2], heads_first=False)
        name = self.materialize_for(value, node)
        return Tensor(self.reshape(name, shape, node.name))

    def materialize_for(self, value: Value, node: torch.fx.Node) -> str:
        try:
            return self.materialize(value, node)
        except LoweringError as err:
            raise LoweringError(f"'{node.name}': {kind(value)} does not fold into this layout change ({err})") from err

    def merge_groups(self, value: CacheGroups, shape: Tuple[int, ...], node: torch.fx.Node) -> Value:
        """``repeat_kv``'s last step: ``[.., Hkv, g, L, Dh]`` viewed as ``[.., Hkv * g, L, Dh]``."""
        cache_shape = self.desc.shapes[value.cache][1]
        heads = cache_shape[-3]
        if shape[:-3] == cache_shape[:-3] and shape[-3] == heads * value.groups and shape[-2:] == cache_shape[-2:]:
            return CacheGroups(value.cache, value.groups, shape, merged=True, tiled=value.tiled)
        if math.prod(shape) == math.prod(value.shape) and value.groups == 1:
            return CacheGroups(value.cache, 1, shape, merged=False)
        raise LoweringError(f"'{node.name}': the repeated cache '{value.cache}' viewed as {list(shape)} is not "
                            "[.., heads * groups, L, Dh]")

    def view(self, node: torch.fx.Node) -> Value:
        shape = val_shape(node)
        return self.reshape_value(self.value(node.args[0]), shape, node)

    def same(self, node: torch.fx.Node) -> Value:
        # A copy changes layout at most; values are the reference graph's business.
        return self.value(node.args[0])

    def expand(self, node: torch.fx.Node) -> Value:
        value = self.value(node.args[0])
        shape = val_shape(node)
        if isinstance(value, CausalMask):
            return CausalMask(value.position, value.count, value.rows, shape)
        if isinstance(value, CacheGroups) and not value.merged:
            grown = [i for i, (a, b) in enumerate(zip(value.shape, shape)) if a != b]
            if len(value.shape) == len(shape) and len(grown) == 1 and value.shape[grown[0]] == 1:
                # `[.., Hkv, g, L, Dh]` (repeat_kv) or, with the group axis before the KV heads, tiled.
                tiled = grown[0] < len(shape) - 3 and self.desc.shapes[value.cache][1][-3] > 1
                return CacheGroups(value.cache, shape[grown[0]], shape, merged=False, tiled=tiled)
        if self.type_of(value) is not None and self.type_of(value)[1] == shape:
            return value
        raise LoweringError(f"'{node.name}': expand of {describe(node.args[0])} to {list(shape)} would materialise "
                            f"a broadcast ({kind(value)})")

    def permute_rule(self, node: torch.fx.Node) -> Value:
        value, dims = self.value(node.args[0]), [int(d) for d in node.args[1]]
        if isinstance(value, HeadView) and dims == [1, 0, 2]:
            return HeadView(value.source, value.heads, value.head_dim, not value.heads_first)
        name = self.materialize_for(value, node)
        return Tensor(self.permute(name, dims, node.name))

    def slice(self, node: torch.fx.Node) -> Value:
        args = list(node.args) + [None] * (5 - len(node.args))
        x, dim, start, end, step = args[:5]
        name = self.tensor(x, "self", node)
        dtype, shape = self.desc.shapes[name]
        dim = _dim(int(dim or 0), len(shape))
        extent = shape[dim]
        start = max(0, min(extent, _dim(int(start or 0), extent)))
        end = extent if end is None else max(0, min(extent, _dim(int(end), extent)))
        step = int(step or 1)
        if step != 1:
            return Tensor(self.strided_slice(name, dim, start, end, step, node))
        if (start, end) == (0, extent):
            return Tensor(name)
        return self.out(node, "slice", input=name, axis=dim, start=start, end=end)

    def strided_slice(self, name: str, dim: int, start: int, end: int, step: int, node: torch.fx.Node) -> str:
        """``x[.., start:end:step, ..]`` as a reshape that splits the axis into ``[extent / step, step]``, a slice
        of one element of the new inner axis, and a reshape back (the interleaved RoPE's ``x[..., ::2]``)."""
        dtype, shape = self.desc.shapes[name]
        extent = shape[dim]
        if step < 1 or extent % step or start >= step or -(-(extent - start) // step) != extent // step or end != extent:
            raise LoweringError(f"'{node.name}': slice {start}:{end}:{step} of an axis of {extent} is not every "
                                f"{step}-th element from one of the first {step}")
        split = shape[:dim] + (extent // step, step) + shape[dim + 1:]
        grouped = self.reshape(name, split, f"{node.name}_groups")
        picked = self.desc.op("slice", self.desc.fresh(f"{node.name}_picked"), dtype,
                              split[:dim + 1] + (1,) + split[dim + 2:], input=grouped, axis=dim + 1, start=start,
                              end=start + 1)
        _, out_shape = meta_shape(node)
        return self.reshape(picked, out_shape, node.name)

    def select(self, node: torch.fx.Node) -> Value:
        x, dim, index = node.args[:3]
        value = self.value(x)
        if isinstance(value, Tensor):
            dtype, shape = self.desc.shapes[value.name]
            if dtype == "i64" and len(shape) == 1 and _dim(int(dim), 1) == 0 and _dim(int(index), shape[0]) == 0:
                return FirstElement(value.name, ())
        name = self.tensor(x, "self", node)
        dtype, shape = self.desc.shapes[name]
        dim = _dim(int(dim), len(shape))
        index = _dim(int(index), shape[dim])
        part = self.desc.op("slice", self.desc.fresh(f"{node.name}_slice"), dtype,
                            shape[:dim] + (1,) + shape[dim + 1:], input=name, axis=dim, start=index, end=index + 1)
        _, out_shape = meta_shape(node)
        return Tensor(self.reshape(part, out_shape, node.name))

    def cat(self, node: torch.fx.Node) -> Value:
        parts: Sequence[Any] = node.args[0]
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        dtype, shape = meta_shape(node)
        names = [self.operand(p, dtype, f"part{i}", node) for i, p in enumerate(parts)]
        dim = _dim(int(dim), len(shape))
        joined = names[0]
        for i, part in enumerate(names[1:], start=1):
            a, b = self.desc.shapes[joined][1], self.desc.shapes[part][1]
            out_shape = a[:dim] + (a[dim] + b[dim],) + a[dim + 1:]
            base = node.name if i == len(names) - 1 else f"{node.name}_part{i}"
            joined = self.desc.op("concat", self.desc.fresh(base), dtype, out_shape, a=joined, b=part, axis=dim)
        return Tensor(joined)

    def split(self, node: torch.fx.Node) -> Value:
        """``split_with_sizes`` / ``split`` (Phi-3's fused ``gate_up`` and ``qkv_proj``, ``chunk``): one slice per
        part, as a tuple that ``getitem`` picks from."""
        x, sizes = node.args[0], node.args[1]
        dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)
        name = self.tensor(x, "self", node)
        dtype, shape = self.desc.shapes[name]
        dim = _dim(int(dim), len(shape))
        if isinstance(sizes, int):
            sizes = [min(sizes, shape[dim] - start) for start in range(0, shape[dim], sizes)]
        parts, start = [], 0
        for i, size in enumerate(sizes):
            end = start + int(size)
            if (start, end) == (0, shape[dim]):
                parts.append(Tensor(name))
            else:
                part_shape = shape[:dim] + (end - start,) + shape[dim + 1:]
                parts.append(Tensor(self.desc.op("slice", self.desc.fresh(f"{node.name}_{i}"), dtype, part_shape,
                                                 input=name, axis=dim, start=start, end=end)))
            start = end
        return tuple(parts)

    def getitem(self, node: torch.fx.Node) -> Value:
        parts, index = self.value(node.args[0]), node.args[1]
        if not isinstance(parts, tuple) or not isinstance(index, int):
            raise LoweringError(f"'{node.name}': item {index} of {describe(node.args[0])}, which is not a split")
        return parts[index]

    def copy(self, node: torch.fx.Node) -> Value:
        dst, src = node.args[0], node.args[1]
        shape = val_shape(node)
        value = self.value(src)
        kept = self.type_of(value)
        if isinstance(value, (Positions, FirstElement)) or (kept is not None and math.prod(kept[1]) == math.prod(shape)):
            return self.reshape_value(value, shape, node)
        raise LoweringError(f"'{node.name}': copy of {describe(src)} into {describe(dst)} broadcasts")
