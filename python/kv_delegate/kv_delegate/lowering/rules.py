"""The rules for ordinary ops: gathers, matrix products, elementwise arithmetic, reductions, casts and layout.
Each takes an fx node whose operands have values and returns the node's value (emitting ops as needed)."""

from __future__ import annotations

import math
from typing import Any, Dict, Optional, Tuple

import torch

from .common import DTYPES, LoweringError, meta_shape
from .values import FirstElement, Known, Positions, ShiftedPositions, Tensor, Value

#: ``pow(x, exponent)`` as a unary function of the reference graph.
POWERS = {2: "square", 2.0: "square", 0.5: "sqrt", -0.5: "rsqrt", -1: "reciprocal", -1.0: "reciprocal"}

#: Unary edge operators and the reference graph's function for each.
UNARY = {
    "aten.neg.default": "neg",
    "aten.rsqrt.default": "rsqrt",
    "aten.sqrt.default": "sqrt",
    "aten.exp.default": "exp",
    "aten.cos.default": "cos",
    "aten.sin.default": "sin",
    "aten.tanh.default": "tanh",
    "aten.sigmoid.default": "sigmoid",
    "aten.reciprocal.default": "reciprocal",
    "aten.silu.default": "silu",
}


def is_scalar(value: Any, x: float) -> bool:
    """Whether ``value`` is the number ``x`` (a Python number or a known one-element tensor)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value == x
    if isinstance(value, Known) and value.value.numel() == 1:
        return bool(value.value.reshape(()).item() == x)
    return False


def is_arange(value: Value) -> Optional[int]:
    """``L`` when ``value`` is a known ``arange(0, L)`` along its last axis (other extents 1)."""
    return value.arange if isinstance(value, Known) else None


def _integer(value: Any) -> bool:
    """Whether ``value`` is an integer constant: a Python int or a known one-element integer tensor."""
    if isinstance(value, Known):
        return value.value.numel() == 1 and not value.value.dtype.is_floating_point and value.value.dtype != torch.bool
    return isinstance(value, int) and not isinstance(value, bool)


def axis(dim: int, rank: int) -> int:
    return dim + rank if dim < 0 else dim


class Rules:
    """Mixed into :class:`..walk.Walk`."""

    def ordinary_rules(self) -> Dict[str, Any]:
        rules: Dict[str, Any] = {
            "aten.embedding.default": self.embedding,
            "aten.index_select.default": self.index_select,
            "aten.mm.default": self.mm,
            "aten.addmm.default": self.addmm,
            "aten.pow.Tensor_Scalar": self.pow,
            "aten.mean.dim": self.mean,
            "aten.gelu.default": self.gelu,
            "aten.rms_norm.default": self.rms_norm,
            "aten.native_layer_norm.default": self.layer_norm,
            "aten.argmax.default": self.argmax,
            "aten._to_copy.default": self.to_copy,
            "dim_order_ops._to_dim_order_copy.default": self.to_copy,
            "aten.view_copy.default": self.view,
            "aten.view.default": self.view,
            "aten.unsqueeze_copy.default": self.view,
            "aten.squeeze_copy.dims": self.view,
            "aten.squeeze_copy.dim": self.view,
            "aten.squeeze_copy.default": self.view,
            "aten.alias_copy.default": self.same,
            "aten.clone.default": self.same,
            "dim_order_ops._clone_dim_order.default": self.same,
            "aten.expand_copy.default": self.expand,
            "aten.permute_copy.default": self.permute_rule,
            "aten.slice_copy.Tensor": self.slice,
            "aten.select_copy.int": self.select,
            "aten.cat.default": self.cat,
            "aten.copy.default": self.copy,
            "aten.split_with_sizes_copy.default": self.split,
            "aten.split_copy.Tensor": self.split,
            "getitem": self.getitem,
        }
        for op in ("add", "sub", "mul", "div"):
            rules[f"aten.{op}.Tensor"] = lambda node, op=op: self.binary(node, op)
            rules[f"aten.{op}.Scalar"] = lambda node, op=op: self.binary(node, op)
        for name, func in UNARY.items():
            rules[name] = lambda node, func=func: self.unary(node, func)
        return rules

    # -- gathers and products ------------------------------------------------------------------------------------
    def embedding(self, node: torch.fx.Node) -> Value:
        # `padding_idx`, `scale_grad_by_freq` and `sparse` (the other arguments) change gradients only: the forward
        # pass is the row gather whatever they are.
        weight, indices = node.args[0], node.args[1]
        return self.out(node, "gather", table=self.tensor(weight, "weight", node),
                        indices=self.tensor(indices, "indices", node))

    def index_select(self, node: torch.fx.Node) -> Value:
        table, dim, indices = node.args
        if dim != 0:
            raise LoweringError(f"'{node.name}': index_select along dim {dim}, the reference graph gathers rows")
        return self.out(node, "gather", table=self.tensor(table, "self", node),
                        indices=self.tensor(indices, "index", node))

    def weight(self, arg: Any, node: torch.fx.Node) -> Tuple[str, bool]:
        """The right operand of a product: a ``[N, K]`` weight read transposed when ``arg`` is its ``.T``."""
        value = self.value(arg)
        if isinstance(value, Known) and value.transposed_of is not None:
            return self.known(value.transposed_of), True
        return self.tensor(arg, "mat2", node), False

    def mm(self, node: torch.fx.Node) -> Value:
        b, transposed = self.weight(node.args[1], node)
        return self.out(node, "mat_mul", a=self.tensor(node.args[0], "self", node), b=b,
                        transpose_b=True if transposed else None)

    def addmm(self, node: torch.fx.Node) -> Value:
        bias, a, mat2 = node.args[:3]
        if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
            raise LoweringError(f"'{node.name}': addmm with beta or alpha other than 1")
        dtype, (_, n) = meta_shape(node)
        bias_name = self.tensor(bias, "self (the bias)", node)
        if self.desc.shapes[bias_name][1] != (n,):
            bias_name = self.reshape(bias_name, (n,), f"{node.name}_bias")
        b, transposed = self.weight(mat2, node)
        return self.out(node, "mat_mul", a=self.tensor(a, "mat1", node), b=b,
                        transpose_b=True if transposed else None, bias=bias_name)

    # -- elementwise -------------------------------------------------------------------------------------------
    def operand(self, arg: Any, dtype: str, what: str, node: torch.fx.Node) -> str:
        """Operand ``arg`` as a tensor of ``dtype`` (a Python number becomes a one-element constant)."""
        if isinstance(arg, (int, float)) and not isinstance(arg, bool):
            torch_dtype = next(t for t, d in DTYPES.items() if d == dtype)
            return self.known(Known(torch.tensor(arg, dtype=torch_dtype), f"{node.name}_{what}"))
        return self.cast(self.tensor(arg, what, node), dtype, f"{node.name}_{what}_{dtype}")

    def binary(self, node: torch.fx.Node, op: str) -> Value:
        a, b = node.args[0], node.args[1]
        if node.kwargs.get("alpha", 1) != 1:
            raise LoweringError(f"'{node.name}': {op} with alpha {node.kwargs['alpha']}")
        va, vb = self.value(a), self.value(b)
        if op == "add":
            for rng, pos in ((va, vb), (vb, va)):
                count = is_arange(rng)
                position = self.position_tensor(pos) if count and rng.value.dim() == 1 else None
                if position is not None:
                    return Positions(position, count, (count,))
        if op == "sub" and isinstance(va, Positions) and _integer(vb):
            return ShiftedPositions(va, vb)
        dtype, shape = meta_shape(node)
        unit = 0.0 if op in ("add", "sub") else 1.0
        if is_scalar(vb, unit) and self.type_of(va) == (dtype, shape):
            return va
        if op in ("add", "mul") and is_scalar(va, unit) and self.type_of(vb) == (dtype, shape):
            return vb
        return self.out(node, op, a=self.operand(a, dtype, "a", node), b=self.operand(b, dtype, "b", node))

    def type_of(self, value: Value) -> Optional[Tuple[str, Tuple[int, ...]]]:
        """The dtype and shape of a tensor or known value (``None`` for anything else)."""
        if isinstance(value, Tensor):
            return self.desc.shapes[value.name]
        if isinstance(value, Known):
            return DTYPES.get(value.value.dtype, "?"), tuple(value.value.shape)
        return None

    def unary(self, node: torch.fx.Node, func: str) -> Value:
        dtype, _ = meta_shape(node)
        return self.out(node, "unary", func=func, input=self.operand(node.args[0], dtype, "input", node))

    def pow(self, node: torch.fx.Node) -> Value:
        exponent = node.args[1]
        if exponent == 1:
            return self.value(node.args[0])
        if exponent in (3, 3.0):
            # x * x^2: tanh-GeLU as written by hand (`gelu_new`: `0.044715 * pow(x, 3.0)`).
            dtype, shape = meta_shape(node)
            x = self.operand(node.args[0], dtype, "input", node)
            square = self.desc.op("unary", self.desc.fresh(f"{node.name}_square"), dtype, shape, func="square",
                                  input=x)
            return self.out(node, "mul", a=x, b=square)
        func = POWERS.get(exponent)
        if func is None:
            raise LoweringError(f"'{node.name}': pow with exponent {exponent} (the reference graph takes 2, 3, 0.5, "
                                "-0.5, -1)")
        return self.unary(node, func)

    def gelu(self, node: torch.fx.Node) -> Value:
        approximate = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
        return self.unary(node, "gelu_tanh" if approximate == "tanh" else "gelu")

    def mean(self, node: torch.fx.Node) -> Value:
        x, dims = node.args[0], list(node.args[1] or [])
        keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
        name = self.tensor(x, "self", node)
        dtype, shape = self.desc.shapes[name]
        if [axis(d, len(shape)) for d in dims] != [len(shape) - 1] or node.kwargs.get("dtype") is not None:
            raise LoweringError(f"'{node.name}': mean over {dims} of {list(shape)}, not over the last axis alone")
        out_dtype, out_shape = meta_shape(node)
        kept = self.desc.op("mean", self.desc.fresh(node.name if keepdim else f"{node.name}_kept"), dtype,
                            shape[:-1] + (1,), input=name)
        return Tensor(self.reshape(kept, out_shape, node.name))

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

    def layer_norm(self, node: torch.fx.Node) -> Value:
        """``native_layer_norm`` over the last axis, with or without weight and bias, as torch computes it: in f32
        (the input cast up), ``(x - mean) * rsqrt(var + eps) * weight + bias``, rounded once to the input's type.
        Its mean and rstd outputs (used by training only) are not lowered."""
        x, shape, weight, bias, eps = node.args[:5]
        name = self.tensor(x, "input", node)
        dtype, x_shape = self.desc.shapes[name]
        if list(shape) != [x_shape[-1]]:
            raise LoweringError(f"'{node.name}': layer_norm over {list(shape)}, not the last axis of {list(x_shape)}")
        rows = x_shape[:-1] + (1,)
        f32 = lambda op, base, out_shape, **args: self.desc.op(op, self.desc.fresh(f"{node.name}_{base}"), "f32",
                                                               out_shape, **args)
        x32 = self.cast(name, "f32", f"{node.name}_input_f32")
        centred = f32("sub", "centred", x_shape, a=x32, b=f32("mean", "mean", rows, input=x32))
        var = f32("mean", "var", rows, input=f32("unary", "squared", x_shape, func="square", input=centred))
        eps_name = self.known(Known(torch.tensor(float(eps), dtype=torch.float32), f"{node.name}_eps"))
        rstd = f32("unary", "rstd", rows, func="rsqrt", input=f32("add", "var_eps", rows, a=var, b=eps_name))
        out = f32("mul", "normed", x_shape, a=centred, b=rstd)
        if weight is not None:
            out = f32("mul", "scaled", x_shape, a=out, b=self.operand(weight, "f32", "weight", node))
        if bias is not None:
            out = f32("add", "biased", x_shape, a=out, b=self.operand(bias, "f32", "bias", node))
        return (Tensor(self.cast(out, dtype, node.name)), None, None)

    def argmax(self, node: torch.fx.Node) -> Value:
        """The greedy next token of one row of logits (the reference graph's ``argmax`` of the last row)."""
        x = node.args[0]
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        name = self.tensor(x, "self", node)
        _, shape = self.desc.shapes[name]
        rows = math.prod(shape[:-1])
        if dim is None or axis(int(dim), len(shape)) != len(shape) - 1 or rows != 1:
            raise LoweringError(f"'{node.name}': argmax over dim {dim} of {list(shape)}; the reference graph takes "
                                "the last axis of one row")
        if len(shape) < 2:
            name = self.reshape(name, (1, shape[-1]), f"{node.name}_row")
        found = self.desc.op("argmax", self.desc.fresh(f"{node.name}_token"), "i64", [1], input=name)
        _, out_shape = meta_shape(node)
        return Tensor(self.reshape(found, out_shape, node.name))

    def to_copy(self, node: torch.fx.Node) -> Value:
        value = self.value(node.args[0])
        dtype, shape = meta_shape(node)
        if isinstance(value, (Positions, FirstElement)) and dtype == "i64":
            return value
        name = self.tensor(node.args[0], "self", node)
        if self.desc.shapes[name][0] == dtype:
            return Tensor(name)
        return Tensor(self.cast(name, dtype, node.name))
