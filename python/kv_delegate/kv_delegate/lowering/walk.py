"""The symbolic evaluation of one delegated subgraph: every fx node gets a value (:mod:`.values`), constants are
folded at export, and symbolic values are materialised with ordinary ops when a consumer needs a tensor."""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from ..names import BUFFER_META, CACHE_META, OUTPUT_NAME_META
from .common import DTYPES, LoweringError, describe, meta_shape, op_name
from .description import Binding, Description, Lowered
from .values import FirstElement, HeadView, Known, Positions, Tensor, Value, kind


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.]", "_", name)


def moves_only_unit_axes(shape: Sequence[int], dims: Sequence[int]) -> bool:
    """Whether permuting ``shape`` by ``dims`` keeps the order of its axes longer than 1 (so the bytes do not
    move and the permute is a reshape)."""
    order = [d for d in dims if shape[d] != 1]
    return order == sorted(order)


class Walk:
    """Values, materialisation and the walk over the graph; the op rules are mixed in (:mod:`.rules`,
    :mod:`.attention`)."""

    rules: Dict[str, Callable[[torch.fx.Node], Value]]

    def __init__(self, program: ExportedProgram, real: Optional[Dict[str, torch.Tensor]] = None) -> None:
        self.program = program
        #: Real values of constants the program holds as fake tensors (the partitioner's dry run).
        self.real = real or {}
        self.desc = Description()
        self.values: Dict[torch.fx.Node, Value] = {}
        self.declared: Dict[int, str] = {}
        self.materialized: Dict[Tuple[str, int], str] = {}
        #: Reference-graph names of kv_cache_update outputs (only attention may read them).
        self.cache_outputs: Dict[str, str] = {}

    # -- values ----------------------------------------------------------------------------------------------
    def value(self, arg: Any) -> Any:
        """The value of an operand: the node's value, or the Python value itself (a scalar, a list)."""
        if isinstance(arg, torch.fx.Node):
            return self.values.get(arg)
        return arg

    def tensor(self, arg: Any, what: str, user: torch.fx.Node) -> str:
        """The reference-graph tensor of operand ``arg`` of ``user``, materialising a symbolic value."""
        value = self.value(arg)
        try:
            return self.materialize(value, user)
        except LoweringError as err:
            raise LoweringError(
                f"'{user.name}' ({op_name(user)}): operand {what} is {describe(arg)}, which the reference graph "
                f"cannot take as a tensor here ({err})"
            ) from err

    def materialize(self, value: Value, user: torch.fx.Node) -> str:
        if isinstance(value, Tensor):
            return value.name
        if isinstance(value, Known):
            return self.known(value)
        if isinstance(value, Positions):
            return self.reshape(self.positions(value), value.shape, f"{user.name}_positions")
        if isinstance(value, FirstElement):
            return self.reshape(self.first(value), value.shape, f"{user.name}_first")
        if isinstance(value, HeadView):
            dtype, (rows, _) = self.desc.shapes[value.source]
            split = self.reshape(value.source, (rows, value.heads, value.head_dim), f"{value.source}_heads")
            return self.permute(split, (1, 0, 2), f"{value.source}_heads_first") if value.heads_first else split
        raise LoweringError(kind(value))

    def known(self, value: Known) -> str:
        """The constant holding ``value`` (declared once)."""
        key = id(value)
        if key not in self.declared:
            self.declared[key] = self.desc.constant(self.desc.fresh(_safe(value.name)), value.value)
        return self.declared[key]

    def positions(self, value: Positions) -> str:
        key = (value.position, value.count)
        if key not in self.materialized:
            name = self.desc.fresh("positions")
            self.materialized[key] = self.desc.op("positions", name, "i64", [value.count],
                                                  position=value.position, count=value.count)
        return self.materialized[key]

    def first(self, value: FirstElement) -> str:
        """An i64 ``[1]`` tensor holding element 0 of ``value.source``."""
        dtype, shape = self.desc.shapes[value.source]
        if shape == (1,):
            return value.source
        flat = self.reshape(value.source, (math.prod(shape),), f"{value.source}_flat")
        return self.desc.op("slice", self.desc.fresh(f"{value.source}_first"), dtype, [1], input=flat, axis=0,
                            start=0, end=1)

    def position_tensor(self, value: Value) -> Optional[str]:
        """The i64 ``[1]`` tensor a position comes from: an i64 ``[1]`` tensor, or element 0 of one."""
        if isinstance(value, FirstElement):
            return self.first(value)
        if isinstance(value, Tensor):
            dtype, shape = self.desc.shapes[value.name]
            if dtype == "i64" and shape == (1,):
                return value.name
        return None

    # -- emitters ----------------------------------------------------------------------------------------------
    def reshape(self, name: str, shape: Sequence[int], base: str) -> str:
        dtype, current = self.desc.shapes[name]
        shape = tuple(int(d) for d in shape)
        if current == shape:
            return name
        return self.desc.op("reshape", self.desc.fresh(base), dtype, shape, input=name, shape=list(shape))

    def permute(self, name: str, dims: Sequence[int], base: str) -> str:
        dtype, shape = self.desc.shapes[name]
        out = tuple(shape[d] for d in dims)
        if list(dims) == list(range(len(shape))):
            return name
        if moves_only_unit_axes(shape, dims):
            return self.reshape(name, out, base)
        return self.desc.op("permute", self.desc.fresh(base), dtype, out, input=name, dims=list(dims))

    def cast(self, name: str, dtype: str, base: str) -> str:
        current, shape = self.desc.shapes[name]
        if current == dtype:
            return name
        return self.desc.op("cast", self.desc.fresh(base), dtype, shape, input=name, dtype=dtype)

    def out(self, node: torch.fx.Node, op: str, **operands: Any) -> Tensor:
        """Op ``op`` computing ``node``'s value (its dtype and shape), named after the node."""
        dtype, shape = meta_shape(node)
        name = node.meta.get(CACHE_META, {}).get("out") or node.name
        return Tensor(self.desc.op(op, self.desc.fresh(name), dtype, shape, **operands))

    # -- folding -----------------------------------------------------------------------------------------------
    def fold(self, node: torch.fx.Node) -> Optional[Known]:
        """``node`` computed at export when every tensor it reads is known (weights, ``arange``, lifted
        constants): a permuted weight, ``1 + w``, ``arange(L)``, a cast buffer."""
        tensors: List[Any] = []

        def sub(arg: Any) -> Any:
            if isinstance(arg, torch.fx.Node):
                value = self.values.get(arg)
                if not isinstance(value, Known):
                    raise LookupError
                tensors.append(value)
                return value.value
            if isinstance(arg, (list, tuple)):
                return type(arg)(sub(a) for a in arg)
            return arg

        try:
            args = tuple(sub(a) for a in node.args)
            kwargs = {k: sub(v) for k, v in node.kwargs.items()}
        except LookupError:
            return None
        if op_name(node).startswith(("aten.index_put", "aten.index_copy", "aten.copy")):
            return None
        try:
            with torch.no_grad():
                result = folded(node, args, kwargs)
        except Exception:  # noqa: BLE001 - not foldable here: the rule decides
            return None
        if not isinstance(result, torch.Tensor) or (result.dtype not in DTYPES and result.dtype != torch.bool):
            return None
        transposed = None
        if op_name(node).startswith("aten.permute") and len(tensors) == 1 and list(node.args[1]) == [1, 0]:
            transposed = tensors[0]
        length, offset = _arange_of(node, tensors, result)
        return Known(result, node.name, transposed_of=transposed, arange=length, offset=offset)

    # -- the walk ----------------------------------------------------------------------------------------------
    def lower(self) -> Lowered:
        sig = self.program.graph_signature
        bindings: List[Binding] = []
        for node in self.program.graph_module.graph.nodes:
            if node.op == "placeholder":
                try:
                    self.placeholder(node, bindings)
                except LoweringError as err:
                    user = next(iter(node.users), None)
                    raise LoweringError(str(err), node=user.name if user is not None else None,
                                        reason=f"it reads {describe(node)}, which the reference graph cannot hold "
                                               f"({err})") from err
            elif node.op == "call_function":
                self.call(node)
            elif node.op == "output":
                self.outputs(node, sig, bindings)
        from .fuse import fuse

        fuse(self.desc)
        return Lowered(self.desc, bindings)

    def placeholder(self, node: torch.fx.Node, bindings: List[Binding]) -> None:
        sig = self.program.graph_signature
        spec = {s.arg.name: s for s in sig.input_specs if hasattr(s.arg, "name")}[node.name]
        mutated = set(sig.buffers_to_mutate.values())
        # Named after the cache it is (the cache update's first operand), never after one it only indexes.
        cache_names = {
            user.meta[CACHE_META]["cache"]: user for user in node.users
            if user.meta.get(CACHE_META) and user.args and user.args[0] is node
        }
        cache_names.update({user.meta[BUFFER_META]["buffer"]: user for user in node.users
                            if user.meta.get(BUFFER_META) and user.args and user.args[0] is node})
        cache_name = next(iter(cache_names), None)
        if spec.kind == InputKind.USER_INPUT:
            dtype, shape = meta_shape(node)
            name = cache_name or node.meta.get(OUTPUT_NAME_META) or node.name
            self.desc.inputs.append(self.desc.declare(name, dtype, shape))
            bindings.append(Binding(name, "input"))
            self.values[node] = Tensor(name)
        elif spec.kind == InputKind.BUFFER and spec.target in mutated:
            dtype, shape = meta_shape(node)
            name = cache_name or spec.target
            self.desc.state.append(self.desc.declare(name, dtype, shape))
            self.values[node] = Tensor(name)
        else:
            value = _constant_value(self.program, spec)
            if isinstance(value, FakeTensor) and spec.target in self.real:
                value = self.real[spec.target]
            self.values[node] = Known(value, spec.target)

    def call(self, node: torch.fx.Node) -> None:
        self.desc.producer = node.name
        name = op_name(node)
        folded = self.fold(node)
        if folded is not None:
            self.values[node] = folded
            return
        rule = self.rules.get(name)
        if rule is None:
            raise LoweringError(
                f"'{node.name}': {name} is not supported by the reference graph",
                node=node.name,
                reason=f"{name} is not an operator the reference graph runs",
            )
        try:
            self.values[node] = rule(node)
        except LoweringError as err:
            if err.node is not None:
                raise
            raise LoweringError(str(err), node=node.name, reason=str(err)) from err
        except Exception as err:  # a form the rule does not expect: this node does not lower
            message = f"'{node.name}' ({name}): not lowered ({type(err).__name__}: {err})"
            raise LoweringError(message, node=node.name) from err

    def outputs(self, node: torch.fx.Node, sig: Any, bindings: List[Binding]) -> None:
        mutated = set(sig.buffers_to_mutate.values())
        owned = {s.target for s in sig.input_specs if s.kind == InputKind.BUFFER}
        for out_spec, arg in zip(sig.output_specs, node.args[0]):
            if out_spec.kind == OutputKind.BUFFER_MUTATION and out_spec.target in mutated and out_spec.target in owned:
                continue  # delegate-owned state: no argument
            try:
                name = self.tensor(arg, f"output '{out_spec.arg.name}'", node)
            except LoweringError as err:
                culprit = arg.name if isinstance(arg, torch.fx.Node) else None
                reason = (f"its value is used outside the delegate, but it is {kind(self.value(arg))}, which only "
                          "folds into a consumer")
                raise LoweringError(str(err), node=culprit, reason=reason) from err
            written = self.assign_buffer(name, arg)
            if written is not None:
                name = written
            elif name in self.desc.inputs or any(c["tensor"] == name for c in self.desc.constants) or name in self.desc.outputs:
                name = self.reshape_copy(name, arg)
            user_name = arg.meta.get(OUTPUT_NAME_META) if isinstance(arg, torch.fx.Node) else None
            if user_name and user_name != name:
                name = self._rename(name, user_name)
            self.desc.outputs.append(name)
            bindings.append(Binding(name, "output"))

    def assign_buffer(self, name: str, arg: Any) -> Optional[str]:
        """The ``assign`` writing ``name`` into the mutable buffer input that ``arg`` is the new value of (the
        partitioner's :data:`BUFFER_META`), in place: the delegate output is then the buffer's own storage and
        ExecuTorch copies nothing back. ``None`` (an ordinary output) when ``arg`` is no such value, the buffer is
        not an input here, or an op reads the buffer (an in-place write would change what it reads)."""
        meta = arg.meta.get(BUFFER_META) if isinstance(arg, torch.fx.Node) else None
        if not meta or "out" not in meta or meta["buffer"] not in self.desc.inputs:
            return None
        buffer = meta["buffer"]
        read = {v for op in self.desc.ops for k, v in op.items() if k not in ("op", "out") and isinstance(v, str)}
        if buffer in read or name in self.cache_outputs or self.desc.shapes[name] != self.desc.shapes[buffer]:
            return None
        dtype, shape = self.desc.shapes[buffer]
        self.desc.producer = arg.name  # a packer refusing the assign names the node computing the new value
        return self.desc.op("assign", self.desc.fresh(meta["out"]), dtype, shape, target=buffer, value=name)

    def reshape_copy(self, name: str, arg: Any) -> str:
        """An op-defined copy of ``name`` (a graph output must be an op's own tensor)."""
        dtype, shape = self.desc.shapes[name]
        base = arg.name if isinstance(arg, torch.fx.Node) else name
        return self.desc.op("reshape", self.desc.fresh(f"{base}_out"), dtype, shape, input=name, shape=list(shape))

    def _rename(self, old: str, new: str) -> str:
        """Renames tensor ``old`` to ``new`` everywhere (a user output takes the method's output name)."""
        desc = self.desc
        if new in desc.shapes:
            raise LoweringError(f"output name '{new}' is taken")
        desc.shapes[new] = desc.shapes.pop(old)
        for t in desc.tensors:
            if t["name"] == old:
                t["name"] = new
        for op in desc.ops:
            for key, val in op.items():
                if key != "op" and val == old:
                    op[key] = new
        return new


#: Operators that keep an ``arange`` an ``arange`` when only unit axes change (or ``+ 0``).
_KEEPS_ARANGE = ("aten.view", "aten.unsqueeze", "aten.expand", "aten.clone", "aten.alias",
                 "dim_order_ops._to_dim_order_copy", "aten._to_copy", "aten.add", "aten.squeeze")


def _arange_of(node: torch.fx.Node, tensors: List[Known], result: torch.Tensor) -> Tuple[Optional[int], Optional[Known]]:
    """``(L, offset)`` when ``result`` is ``arange(0, L) + offset`` along its last axis, judged from how ``node``
    made it (``offset`` a known one-element value, ``None`` for none); ``(None, None)`` otherwise."""
    none = (None, None)
    if result.dim() == 0 or any(d != 1 for d in result.shape[:-1]) or result.dtype.is_floating_point:
        return none
    length = int(result.shape[-1])
    name = op_name(node)
    if name.startswith("aten.arange"):
        args = list(node.args)
        start, step = (0, 1) if len(args) == 1 else (args[0], args[2] if len(args) > 2 else 1)
        return (length, None) if (start, step) == (0, 1) else none
    if not name.startswith(_KEEPS_ARANGE) or not tensors or tensors[0].arange != length:
        return none
    first = tensors[0]
    if not name.startswith("aten.add"):
        return (length, first.offset) if len(tensors) == 1 else none
    scalars = [a for a in node.args[1:] if not isinstance(a, torch.fx.Node)]
    if first.offset is not None or len(tensors) > 2 or not all(_is_zero(a) for a in scalars):
        return none
    if len(tensors) == 1:
        return length, None
    offset = tensors[1]
    if offset.value.numel() != 1 or offset.value.dtype.is_floating_point:
        return none
    return length, (None if _is_zero(offset.value) else offset)


def _is_zero(value: object) -> bool:
    """Whether ``value`` is the number 0 (a Python number, or a real one-element tensor)."""
    if isinstance(value, torch.Tensor):
        return not isinstance(value, FakeTensor) and value.numel() == 1 and value.reshape(()).item() == 0
    return value == 0


def _constant_value(program: ExportedProgram, spec: Any) -> torch.Tensor:
    target = spec.target
    if target in program.state_dict:
        return program.state_dict[target]
    if target in program.constants:
        return program.constants[target]
    raise LoweringError(f"constant '{target}' has no value in the program")


def folded(node: torch.fx.Node, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    """``node``'s op on known values. An edge view-copy op (``aten.permute_copy``, ``aten.view_copy``, ...) is
    computed as the ATen view it copies where that view exists for these operands, so that a weight permuted or
    reshaped at export shares the weight's storage instead of holding a second copy of it (the values are the
    same); any other op, or a view the operands' strides do not allow, is the op itself."""
    name = op_name(node)
    if name.startswith("aten.") and "_copy." in name:
        base, overload = name[len("aten."):].split(".", 1)
        copy = getattr(getattr(torch.ops.aten, base, None), overload, None)
        view = getattr(getattr(torch.ops.aten, base[:-len("_copy")], None), overload, None)
        if view is not None and torch.Tag.view_copy in getattr(copy, "tags", ()):
            try:
                return view(*args, **kwargs)
            except RuntimeError:
                pass  # e.g. a view of a permuted weight: the copy computes it
    return node.target(*args, **kwargs)
