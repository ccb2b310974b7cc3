"""Lowers a delegated edge subgraph to a reference-graph description (ref-graph payload 1.x JSON).

The lowering evaluates the subgraph symbolically: every fx node becomes either a real reference-graph tensor
(:class:`Tensor`) or a *symbolic* value that only layout ops and index arithmetic produce and that folds into
one reference-graph op when consumed (the position range, a head-split view, the causal mask). So
``index_put(cache, [None, input_pos + arange(T)], permute(view(k)))`` becomes one ``kv_cache_update`` and
``sdpa(permute(view(q)), k', v', arange(S)[None] <= (input_pos + arange(T))[:, None])`` followed by
``view(permute(.))`` becomes one ``causal_attention``. Anything that does not fold raises
:class:`LoweringError` naming the node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from .names import CACHE_META, OUTPUT_NAME_META

CONSTANT_ALIGN = 16

_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.int64: "i64"}


class LoweringError(ValueError):
    """The subgraph holds something the reference graph cannot express; the message names the node.

    ``node`` is the name of the fx node that does not lower (when known) and ``reason`` says why in the user's
    words (operands by node name, operator, dtype and shape), so the partitioner can leave that node outside.
    """

    def __init__(self, message: str, node: Optional[str] = None, reason: Optional[str] = None) -> None:
        super().__init__(message)
        self.node = node
        self.reason = reason or message


def describe(value: Any) -> str:
    """An operand in the user's words: ``'q' (aten.mm.default, f32 [1, 32])``, or the Python value."""
    if not isinstance(value, torch.fx.Node):
        return repr(value)
    val = value.meta.get("val")
    kind = op_name(value) if value.op == "call_function" else ("a delegate input" if value.op == "placeholder" else value.op)
    if isinstance(val, torch.Tensor):
        dtype = _DTYPES.get(val.dtype, str(val.dtype).replace("torch.", ""))
        return f"'{value.name}' ({kind}, {dtype} {list(val.shape)})"
    return f"'{value.name}' ({kind})"


def op_name(node: torch.fx.Node) -> str:
    """The operator a node calls, e.g. ``aten.mm.default`` (edge and ATen overloads alike)."""
    target = node.target
    name = str(getattr(target, "_name", None) or getattr(target, "__name__", None) or target).replace("::", ".")
    overload = getattr(target, "_overloadname", None)
    if overload and not name.endswith("." + overload):
        name = f"{name}.{overload}"
    return name


@dataclass(frozen=True)
class Tensor:
    """A reference-graph tensor."""

    name: str


@dataclass(frozen=True)
class Range:
    """``arange(start, end)`` (i64), shaped ``shape``."""

    start: int
    end: int
    shape: Tuple[int, ...]


@dataclass(frozen=True)
class Positions:
    """``input_pos + arange(count)`` (i64), shaped ``shape``: the reference graph's ``positions``."""

    position: str
    count: int
    shape: Tuple[int, ...]


@dataclass(frozen=True)
class CausalMask:
    """``arange(rows)[None, :] <= positions[:, None]``: row ``t`` sees cache rows ``0 ..= position + t``."""

    position: str
    count: int
    rows: int


@dataclass(frozen=True)
class HeadView:
    """A ``[T, H * Dh]`` tensor seen as ``[T, H, Dh]`` (``heads_first=False``) or ``[H, T, Dh]``."""

    source: str
    heads: int
    head_dim: int
    heads_first: bool


Value = Union[Tensor, Range, Positions, CausalMask, HeadView, None]


@dataclass
class Description:
    """The reference graph being built: the JSON description plus the constant section."""

    tensors: List[Dict[str, Any]] = field(default_factory=list)
    inputs: List[str] = field(default_factory=list)
    outputs: List[str] = field(default_factory=list)
    state: List[str] = field(default_factory=list)
    constants: List[Dict[str, Any]] = field(default_factory=list)
    ops: List[Dict[str, Any]] = field(default_factory=list)
    data: bytearray = field(default_factory=bytearray)
    shapes: Dict[str, Tuple[str, Tuple[int, ...]]] = field(default_factory=dict)
    #: The fx node each op was lowered from, by op index (to name the node when the packer refuses an op).
    op_nodes: List[Optional[str]] = field(default_factory=list)
    #: The fx node being lowered.
    producer: Optional[str] = None

    def declare(self, name: str, dtype: str, shape: Sequence[int]) -> str:
        """Declares tensor ``name``; a name declared twice is a bug of the lowering."""
        if name in self.shapes:
            raise LoweringError(f"tensor '{name}' is declared twice")
        shape = tuple(int(d) for d in shape)
        self.shapes[name] = (dtype, shape)
        self.tensors.append({"name": name, "dtype": dtype, "shape": list(shape)})
        return name

    def constant(self, name: str, value: torch.Tensor) -> str:
        """Declares a constant with ``value``'s bytes (little-endian, 16-byte aligned)."""
        dtype = _DTYPES.get(value.dtype)
        if dtype is None:
            raise LoweringError(f"constant '{name}' is {value.dtype}; the reference graph holds f32, f16, i64")
        self.declare(name, dtype, value.shape)
        self.data.extend(b"\0" * (-len(self.data) % CONSTANT_ALIGN))
        if isinstance(value, FakeTensor):
            # The partitioner's dry run sees ExecuTorch's fake copy of the program: the bytes do not matter there.
            raw = bytes(value.numel() * value.element_size())
        else:
            array = value.detach().contiguous().cpu().numpy()
            raw = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
        self.constants.append({"tensor": name, "offset": len(self.data), "nbytes": len(raw)})
        self.data.extend(raw)
        return name

    def op(self, op: str, out: str, dtype: str, shape: Sequence[int], **operands: Any) -> Tensor:
        """Appends op ``op`` whose output ``out`` is a new tensor of ``dtype`` ``shape``."""
        self.declare(out, dtype, shape)
        self.ops.append({"op": op, **operands, "out": out})
        self.op_nodes.append(self.producer)
        return Tensor(out)

    def json(self) -> Dict[str, Any]:
        """The description as ref-graph's payload JSON (``state`` only when non-empty)."""
        out: Dict[str, Any] = {
            "tensors": self.tensors,
            "inputs": self.inputs,
            "outputs": self.outputs,
            "constants": self.constants,
            "ops": self.ops,
        }
        if self.state:
            out["state"] = self.state
        return out


@dataclass
class Binding:
    """One delegate argument: its name (a reference-graph input or output) and role."""

    name: str
    role: str


@dataclass
class Lowered:
    """A lowered subgraph: the description and the delegate arguments in ExecuTorch's order."""

    description: Description
    bindings: List[Binding]


def _kind(value: Any) -> str:
    """What the lowering made of a value, in the user's words (never an internal class name)."""
    if isinstance(value, Tensor):
        return f"tensor '{value.name}'"
    if isinstance(value, Range):
        return f"a static index range arange({value.start}, {value.end}) of shape {list(value.shape)}"
    if isinstance(value, Positions):
        return f"the positions input_pos + arange({value.count}) of shape {list(value.shape)}"
    if isinstance(value, CausalMask):
        return f"a causal mask of {value.count} x {value.rows}"
    if isinstance(value, HeadView):
        order = "[H, T, Dh]" if value.heads_first else "[T, H, Dh]"
        return f"'{value.source}' seen as {order} with H = {value.heads}, Dh = {value.head_dim}"
    if value is None:
        return "a value computed outside this delegate or not a tensor"
    return type(value).__name__


def _meta_shape(node: torch.fx.Node) -> Tuple[str, Tuple[int, ...]]:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        raise LoweringError(f"node '{node.name}' ({op_name(node)}) has no tensor value")
    dtype = _DTYPES.get(val.dtype)
    if dtype is None:
        raise LoweringError(f"node '{node.name}' ({op_name(node)}) is {val.dtype}")
    return dtype, tuple(int(d) for d in val.shape)


class _Lowerer:
    """The symbolic evaluation of one subgraph."""

    def __init__(self, program: ExportedProgram) -> None:
        self.program = program
        self.desc = Description()
        self.values: Dict[torch.fx.Node, Value] = {}
        self.materialized: Dict[Positions, str] = {}
        self.rules: Dict[str, Callable[[torch.fx.Node], Value]] = {
            "aten.embedding.default": self.embedding,
            "aten.index_select.default": self.index_select,
            "aten.add.Tensor": self.add,
            "aten.arange.start_step": self.arange,
            "aten.arange.default": self.arange,
            "aten.view_copy.default": self.view,
            "aten.permute_copy.default": self.permute,
            "aten.clone.default": self.clone,
            "aten.alias_copy.default": self.clone,
            "dim_order_ops._clone_dim_order.default": self.clone,
            "aten.le.Tensor": self.le,
            "aten.mm.default": self.mm,
            "aten.rms_norm.default": self.rms_norm,
            "aten.index_put.default": self.index_put,
            "aten.index_copy.default": self.index_copy,
            "aten.scaled_dot_product_attention.default": self.sdpa,
        }

    # -- helpers -------------------------------------------------------------------------------------------
    def tensor(self, node: Any, what: str, user: torch.fx.Node) -> str:
        """The reference-graph tensor of ``node`` (materialising a position range)."""
        value = self.values.get(node) if isinstance(node, torch.fx.Node) else None
        if isinstance(value, Tensor):
            return value.name
        if isinstance(value, Positions) and len(value.shape) == 1:
            return self.positions(value)
        raise LoweringError(
            f"'{user.name}' ({op_name(user)}): operand {what} is {describe(node)}, which the reference graph "
            f"cannot take as a tensor here ({_kind(value)})"
        )

    def positions(self, value: Positions) -> str:
        if value not in self.materialized:
            name = f"positions_{len(self.materialized)}" if self.materialized else "positions"
            self.desc.op("positions", name, "i64", [value.count], position=value.position, count=value.count)
            self.materialized[value] = name
        return self.materialized[value]

    def out(self, node: torch.fx.Node, op: str, **operands: Any) -> Tensor:
        dtype, shape = _meta_shape(node)
        name = node.meta.get(CACHE_META, {}).get("out") or node.name
        return self.desc.op(op, name, dtype, shape, **operands)

    def position_of(self, value: Value, node: torch.fx.Node, what: str) -> Positions:
        if not isinstance(value, Positions):
            raise LoweringError(f"'{node.name}' ({op_name(node)}): {what} is {_kind(value)}, not input_pos + arange(T)")
        return value

    # -- rules ---------------------------------------------------------------------------------------------
    def embedding(self, node: torch.fx.Node) -> Value:
        weight, indices = node.args[0], node.args[1]
        if any(a not in (-1, False) for a in node.args[2:]):
            raise LoweringError(f"'{node.name}': embedding with padding/scaling arguments {node.args[2:]}")
        return self.out(node, "gather", table=self.tensor(weight, "weight", node),
                        indices=self.tensor(indices, "indices", node))

    def index_select(self, node: torch.fx.Node) -> Value:
        table, dim, indices = node.args
        if dim != 0:
            raise LoweringError(f"'{node.name}': index_select along dim {dim}, the reference graph gathers rows")
        return self.out(node, "gather", table=self.tensor(table, "self", node),
                        indices=self.tensor(indices, "index", node))

    def add(self, node: torch.fx.Node) -> Value:
        a, b = (self.values.get(x) if isinstance(x, torch.fx.Node) else x for x in node.args[:2])
        if node.kwargs.get("alpha", 1) != 1:
            raise LoweringError(f"'{node.name}': add with alpha {node.kwargs['alpha']}")
        # input_pos + arange(T), either way round.
        for pos, rng in ((a, b), (b, a)):
            if isinstance(pos, Tensor) and isinstance(rng, Range) and rng.start == 0:
                dtype, shape = self.desc.shapes[pos.name]
                if dtype == "i64" and shape == (1,):
                    return Positions(pos.name, rng.end, (rng.end,))
        return self.out(node, "add", a=self.tensor(node.args[0], "self", node),
                        b=self.tensor(node.args[1], "other", node))

    def arange(self, node: torch.fx.Node) -> Value:
        args = list(node.args)
        start, end = (0, args[0]) if len(args) == 1 else (args[0], args[1])
        step = args[2] if len(args) > 2 else 1
        if not all(isinstance(x, int) for x in (start, end, step)) or step != 1:
            raise LoweringError(f"'{node.name}': arange{tuple(args)} is not a static unit range")
        return Range(start, end, (end - start,))

    def view(self, node: torch.fx.Node) -> Value:
        src, shape = node.args[0], tuple(int(d) for d in node.args[1])
        value = self.values.get(src)
        if isinstance(value, Range) and shape in ((1, value.end - value.start), (value.end - value.start,)):
            return Range(value.start, value.end, shape)
        if isinstance(value, Positions) and shape in ((value.count, 1), (value.count,)):
            return Positions(value.position, value.count, shape)
        if isinstance(value, Tensor):
            dtype, src_shape = self.desc.shapes[value.name]
            splits_rows = len(src_shape) == 2 and len(shape) == 3 and shape[0] == src_shape[0]
            if splits_rows and shape[1] * shape[2] == src_shape[1]:
                return HeadView(value.name, shape[1], shape[2], heads_first=False)
            if shape == src_shape:
                return value
        if isinstance(value, HeadView) and not value.heads_first:
            dtype, src_shape = self.desc.shapes[value.source]
            if shape == src_shape:
                return Tensor(value.source)
        raise LoweringError(
            f"'{node.name}': view_copy of {describe(src)} to {list(shape)} does not fold ({_kind(value)})"
        )

    def permute(self, node: torch.fx.Node) -> Value:
        value, dims = self.values.get(node.args[0]), list(node.args[1])
        if isinstance(value, HeadView) and dims == [1, 0, 2]:
            return HeadView(value.source, value.heads, value.head_dim, not value.heads_first)
        raise LoweringError(
            f"'{node.name}': permute_copy {dims} of {describe(node.args[0])} does not fold ({_kind(value)}; "
            "only the head split [T, H, Dh] <-> [H, T, Dh] does)"
        )

    def clone(self, node: torch.fx.Node) -> Value:
        # A copy changes layout at most; values are the reference graph's business.
        return self.values.get(node.args[0])

    def le(self, node: torch.fx.Node) -> Value:
        rows, pos = self.values.get(node.args[0]), self.values.get(node.args[1])
        if (
            isinstance(rows, Range) and rows.start == 0 and rows.shape == (1, rows.end)
            and isinstance(pos, Positions) and pos.shape == (pos.count, 1)
        ):
            return CausalMask(pos.position, pos.count, rows.end)
        raise LoweringError(
            f"'{node.name}': le({describe(node.args[0])}, {describe(node.args[1])}) is not the causal mask "
            "arange(L)[None, :] <= (input_pos + arange(T))[:, None]"
        )

    def mm(self, node: torch.fx.Node) -> Value:
        return self.out(node, "mat_mul", a=self.tensor(node.args[0], "self", node),
                        b=self.tensor(node.args[1], "mat2", node))

    def rms_norm(self, node: torch.fx.Node) -> Value:
        x, shape = node.args[0], list(node.args[1])
        weight = node.args[2] if len(node.args) > 2 else node.kwargs.get("weight")
        eps = node.args[3] if len(node.args) > 3 else node.kwargs.get("eps")
        if weight is None or eps is None:
            raise LoweringError(f"'{node.name}': rms_norm needs a weight and an explicit eps")
        name = self.tensor(x, "input", node)
        if shape != [self.desc.shapes[name][1][-1]]:
            raise LoweringError(f"'{node.name}': rms_norm over {shape}, not the last axis")
        return self.out(node, "rms_norm", input=name, weight=self.tensor(weight, "weight", node), eps=float(eps))

    def _cache_update(self, node: torch.fx.Node, cache: Any, index: Any, update: Any) -> Value:
        upd = self.values.get(update)
        pos = self.position_of(self.values.get(index), node, "the row index")
        if not (isinstance(upd, HeadView) and upd.heads_first):
            raise LoweringError(
                f"'{node.name}': the cache update's values {describe(update)} are not [T, H*Dh] seen as [H, T, Dh] "
                f"({_kind(upd)})"
            )
        return self.out(node, "kv_cache_update", cache=self.tensor(cache, "cache", node), update=upd.source,
                        position=pos.position)

    def index_put(self, node: torch.fx.Node) -> Value:
        cache, indices, update = node.args[0], list(node.args[1]), node.args[2]
        accumulate = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)
        if accumulate or len(indices) != 2 or indices[0] is not None:
            raise LoweringError(f"'{node.name}': index_put is not a row write [:, positions] = values")
        return self._cache_update(node, cache, indices[1], update)

    def index_copy(self, node: torch.fx.Node) -> Value:
        cache, dim, index, update = node.args
        if dim != 1:
            raise LoweringError(f"'{node.name}': index_copy along dim {dim}, cache rows are dim 1")
        return self._cache_update(node, cache, index, update)

    def sdpa(self, node: torch.fx.Node) -> Value:
        q, k, v = (self.values.get(a) for a in node.args[:3])
        mask = node.args[3] if len(node.args) > 3 else node.kwargs.get("attn_mask")
        rest = dict(zip(("dropout_p", "is_causal", "scale", "enable_gqa"), node.args[4:]))
        rest.update({key: val for key, val in node.kwargs.items() if key != "attn_mask"})
        m = self.values.get(mask) if isinstance(mask, torch.fx.Node) else None
        if rest.get("dropout_p", 0.0) != 0.0 or rest.get("is_causal", False) or rest.get("scale") is not None:
            raise LoweringError(f"'{node.name}': attention with dropout, is_causal or an explicit scale")
        if not (isinstance(q, HeadView) and q.heads_first):
            raise LoweringError(
                f"'{node.name}': the queries {describe(node.args[0])} are not [T, H*Dh] seen as [H, T, Dh] ({_kind(q)})"
            )
        if not isinstance(m, CausalMask):
            raise LoweringError(
                f"'{node.name}': the mask {describe(mask)} is not the causal mask over the cache ({_kind(m)})"
            )
        for what, cache, arg in (("key", k, node.args[1]), ("value", v, node.args[2])):
            if not isinstance(cache, Tensor) or not any(
                o["op"] == "kv_cache_update" and o["out"] == cache.name for o in self.desc.ops
            ):
                raise LoweringError(
                    f"'{node.name}': the {what} {describe(arg)} is not a cache update's output in this delegate"
                )
        if self.desc.shapes[k.name][1][0] != q.heads:
            raise LoweringError(
                f"'{node.name}': the queries have {q.heads} heads but the caches "
                f"{list(self.desc.shapes[k.name][1])} have {self.desc.shapes[k.name][1][0]} (grouped-query "
                "attention is not lowered)"
            )
        if self.desc.shapes[k.name][1][1] != m.rows:
            cache_shape = self.desc.shapes[k.name][1]
            raise LoweringError(f"'{node.name}': the mask covers {m.rows} rows, the cache is {cache_shape}")
        dtype, q_shape = self.desc.shapes[q.source]
        name = f"{node.name}_out"
        self.desc.op("causal_attention", name, dtype, q_shape, q=q.source, k=k.name, v=v.name, position=m.position)
        return HeadView(name, q.heads, q.head_dim, heads_first=True)

    # -- the walk ------------------------------------------------------------------------------------------
    def lower(self) -> Lowered:
        program, desc = self.program, self.desc
        sig = program.graph_signature
        specs = {spec.arg.name: spec for spec in sig.input_specs if hasattr(spec.arg, "name")}
        mutated = set(sig.buffers_to_mutate.values())
        bindings: List[Binding] = []
        graph = program.graph_module.graph
        # Caches are named after the update that writes them (the partitioner annotates it).
        cache_names: Dict[torch.fx.Node, str] = {}
        for node in graph.nodes:
            names = node.meta.get(CACHE_META)
            if names and node.args and isinstance(node.args[0], torch.fx.Node):
                cache_names[node.args[0]] = names["cache"]
        for node in graph.nodes:
            if node.op == "placeholder":
                spec = specs[node.name]
                if spec.kind == InputKind.USER_INPUT:
                    dtype, shape = _meta_shape(node)
                    name = cache_names.get(node) or node.meta.get(OUTPUT_NAME_META) or node.name
                    desc.inputs.append(desc.declare(name, dtype, shape))
                    bindings.append(Binding(name, "input"))
                    self.values[node] = Tensor(name)
                elif spec.kind == InputKind.BUFFER and spec.target in mutated:
                    dtype, shape = _meta_shape(node)
                    name = cache_names.get(node) or spec.target
                    desc.state.append(desc.declare(name, dtype, shape))
                    self.values[node] = Tensor(name)
                else:
                    value = _constant_value(program, spec)
                    self.values[node] = Tensor(desc.constant(spec.target, value))
            elif node.op == "call_function":
                rule = self.rules.get(op_name(node))
                if rule is None:
                    raise LoweringError(
                        f"'{node.name}': {op_name(node)} is not supported by the reference graph",
                        node=node.name,
                        reason=f"{op_name(node)} is not an operator the reference graph runs",
                    )
                self.desc.producer = node.name
                try:
                    self.values[node] = rule(node)
                except LoweringError as err:
                    if err.node is not None:
                        raise
                    raise LoweringError(str(err), node=node.name, reason=str(err)) from err
                except Exception as err:  # a form the rule does not expect: this node does not lower
                    message = f"'{node.name}' ({op_name(node)}): not lowered ({type(err).__name__}: {err})"
                    raise LoweringError(message, node=node.name) from err
            elif node.op == "output":
                outputs = node.args[0]
                for out_spec, arg in zip(sig.output_specs, outputs):
                    try:
                        name = self.tensor(arg, f"output '{out_spec.arg.name}'", node)
                    except LoweringError as err:
                        culprit = arg.name if isinstance(arg, torch.fx.Node) else None
                        reason = (
                            f"its value is used outside the delegate, but it is "
                            f"{_kind(self.values.get(arg))}, which only folds into a consumer"
                        )
                        raise LoweringError(str(err), node=culprit, reason=reason) from err
                    if out_spec.kind == OutputKind.BUFFER_MUTATION and out_spec.target in mutated and any(
                        s.kind == InputKind.BUFFER and s.target == out_spec.target for s in sig.input_specs
                    ):
                        continue  # delegate-owned state: no argument
                    user_name = arg.meta.get(OUTPUT_NAME_META) if isinstance(arg, torch.fx.Node) else None
                    if user_name and user_name != name:
                        name = self._rename(name, user_name)
                    desc.outputs.append(name)
                    bindings.append(Binding(name, "output"))
        return Lowered(desc, bindings)

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


def _constant_value(program: ExportedProgram, spec: Any) -> torch.Tensor:
    target = spec.target
    if target in program.state_dict:
        return program.state_dict[target]
    if target in program.constants:
        return program.constants[target]
    raise LoweringError(f"constant '{target}' has no value in the program")


def lower(program: ExportedProgram) -> Lowered:
    """Lowers a delegated subprogram (what ``BackendDetails.preprocess`` receives)."""
    return _Lowerer(program).lower()

