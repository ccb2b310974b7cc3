"""What every part of the lowering shares: the error it raises, how it names operators and operands in the
user's words, and the element types the reference graph holds."""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch

#: torch dtype -> reference-graph element type.
DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.int64: "i64"}


class LoweringError(ValueError):
    """The subgraph holds something the reference graph cannot express; the message names the node.

    ``node`` is the name of the fx node that does not lower (when known) and ``reason`` says why in the user's
    words (operands by node name, operator, dtype and shape), so the partitioner can leave that node outside.
    """

    def __init__(self, message: str, node: Optional[str] = None, reason: Optional[str] = None) -> None:
        super().__init__(message)
        self.node = node
        self.reason = reason or message


def op_name(node: torch.fx.Node) -> str:
    """The operator a node calls, e.g. ``aten.mm.default`` (edge and ATen overloads alike)."""
    target = node.target
    name = str(getattr(target, "_name", None) or getattr(target, "__name__", None) or target).replace("::", ".")
    overload = getattr(target, "_overloadname", None)
    if overload and not name.endswith("." + overload):
        name = f"{name}.{overload}"
    return name


def describe(value: Any) -> str:
    """An operand in the user's words: ``'q' (aten.mm.default, f32 [1, 32])``, or the Python value."""
    if not isinstance(value, torch.fx.Node):
        return repr(value)
    val = value.meta.get("val")
    kind = op_name(value) if value.op == "call_function" else ("a delegate input" if value.op == "placeholder" else value.op)
    if isinstance(val, torch.Tensor):
        dtype = DTYPES.get(val.dtype, str(val.dtype).replace("torch.", ""))
        return f"'{value.name}' ({kind}, {dtype} {list(val.shape)})"
    return f"'{value.name}' ({kind})"


def meta_shape(node: torch.fx.Node) -> Tuple[str, Tuple[int, ...]]:
    """The reference-graph dtype and shape of ``node``'s value."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        raise LoweringError(f"node '{node.name}' ({op_name(node)}) has no tensor value")
    dtype = DTYPES.get(val.dtype)
    if dtype is None:
        raise LoweringError(f"node '{node.name}' ({op_name(node)}) is {val.dtype}")
    return dtype, tuple(int(d) for d in val.shape)


def val_shape(node: torch.fx.Node) -> Tuple[int, ...]:
    """The shape of ``node``'s value, whatever its dtype (a boolean mask too)."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        raise LoweringError(f"node '{node.name}' ({op_name(node)}) has no tensor value")
    return tuple(int(d) for d in val.shape)
