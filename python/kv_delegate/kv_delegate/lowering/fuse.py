"""Fusions over the lowered description: the decompositions ExecuTorch and model authors write for an RMSNorm
(``x * rsqrt(mean(x^2) + eps) * w``, with or without a float32 round trip) and for SiLU (``x * sigmoid(x)``)
become the reference graph's one op each, and ops whose results nobody reads are dropped. A pattern is fused
only when its intermediate values are read by nothing else, so the graph computes the same values."""

from __future__ import annotations

import struct
from collections import Counter
from typing import Any, Dict, List, Optional, Tuple

from .description import Description

Op = Dict[str, Any]
OPERANDS = ("a", "b", "input", "table", "indices", "weight", "cache", "update", "position", "q", "k", "v", "bias",
            "target", "value")


def operands(op: Op) -> List[str]:
    return [op[key] for key in OPERANDS if key in op]


class _Index:
    """Who defines and who reads each tensor of a description."""

    def __init__(self, desc: Description) -> None:
        self.desc = desc
        self.producer: Dict[str, Op] = {op["out"]: op for op in desc.ops}
        self.uses: Counter = Counter(name for op in desc.ops for name in operands(op))
        self.uses.update(desc.outputs)
        self.constants = {c["tensor"]: c for c in desc.constants}

    def made_by(self, name: str, op: str, func: Optional[str] = None) -> Optional[Op]:
        """The op that defines ``name`` when it is an ``op`` (of ``func``) read only once."""
        found = self.producer.get(name)
        if found is None or found["op"] != op or self.uses[name] != 1:
            return None
        if func is not None and found.get("func") != func:
            return None
        return found

    def scalar(self, name: str) -> Optional[float]:
        """The value of a one-element float constant."""
        constant = self.constants.get(name)
        if constant is None:
            return None
        dtype, shape = self.desc.shapes[name]
        raw = bytes(self.desc.data[constant["offset"]:constant["offset"] + constant["nbytes"]])
        if len(raw) not in (2, 4) or any(d != 1 for d in shape):
            return None
        if dtype == "f32":
            return struct.unpack("<f", raw)[0]
        if dtype == "f16":
            return struct.unpack("<e", raw)[0]
        if dtype == "bf16":
            return struct.unpack("<f", b"\0\0" + raw)[0]
        return None


def _pair(op: Op, index: _Index, want: str, **kw: Any) -> Optional[Tuple[str, Op]]:
    """``(other operand, producer)`` when one operand of binary ``op`` is made by a ``want`` op (once read)."""
    for this, other in ((op["a"], op["b"]), (op["b"], op["a"])):
        found = index.made_by(this, want, **kw)
        if found is not None:
            return other, found
    return None


def _undo_cast(name: str, index: _Index) -> str:
    """The tensor a once-read ``cast`` converts (``x.to(float32)``), else ``name``."""
    cast = index.producer.get(name)
    return cast["input"] if cast is not None and cast["op"] == "cast" else name


def _rms_norm(op: Op, index: _Index) -> Optional[Op]:
    """``mul(w, [cast](mul(x, rsqrt(add(mean(square(x)), eps)))))`` as ``rms_norm(x, w, eps)``."""
    if op["op"] != "mul":
        return None
    for normed, weight in ((op["a"], op["b"]), (op["b"], op["a"])):
        if weight not in index.constants or len(index.desc.shapes[weight][1]) != 1:
            continue
        inner = index.made_by(normed, "cast")
        inner_name = inner["input"] if inner is not None else normed
        scaled = index.made_by(inner_name, "mul")
        found = _pair(scaled, index, "unary", func="rsqrt") if scaled else None
        if found is None:
            continue
        x, rsqrt = found
        added = index.made_by(rsqrt["input"], "add")
        eps_pair = (_pair(added, index, "mean") if added else None)
        if eps_pair is None:
            continue
        eps_name, mean = eps_pair
        eps = index.scalar(eps_name)
        square = index.made_by(mean["input"], "unary", func="square")
        if eps is None or not eps > 0 or square is None or square["input"] != x:
            continue
        source = _undo_cast(x, index) if index.uses[x] == 2 else x
        out_dtype, out_shape = index.desc.shapes[op["out"]]
        if index.desc.shapes[source] != (out_dtype, out_shape) or index.desc.shapes[weight][0] != out_dtype:
            continue
        return {"op": "rms_norm", "input": source, "weight": weight, "eps": eps, "out": op["out"]}
    return None


def _silu(op: Op, index: _Index) -> Optional[Op]:
    """``mul(x, sigmoid(x))`` as ``unary silu(x)``."""
    if op["op"] != "mul":
        return None
    found = _pair(op, index, "unary", func="sigmoid")
    if found is None or found[1]["input"] != found[0]:
        return None
    return {"op": "unary", "func": "silu", "input": found[0], "out": op["out"]}


def _drop_dead(desc: Description) -> None:
    """Drops ops nobody reads (a cache update or an assign always stays), then tensors and constants nothing
    names."""
    live = set(desc.outputs)
    keep = [False] * len(desc.ops)
    for i in range(len(desc.ops) - 1, -1, -1):
        op = desc.ops[i]
        if op["out"] in live or op["op"] in ("kv_cache_update", "assign"):
            keep[i] = True
            live.update(operands(op))
    desc.ops = [op for op, k in zip(desc.ops, keep) if k]
    desc.op_nodes = [n for n, k in zip(desc.op_nodes, keep) if k]
    named = live | set(desc.inputs) | set(desc.state) | {op["out"] for op in desc.ops}
    desc.constants = [c for c in desc.constants if c["tensor"] in named]
    desc.tensors = [t for t in desc.tensors if t["name"] in named]
    for name in list(desc.shapes):
        if name not in named:
            del desc.shapes[name]


def fuse(desc: Description) -> None:
    """Applies every fusion until none applies, then drops what nobody reads."""
    changed = True
    while changed:
        changed = False
        index = _Index(desc)
        for i, op in enumerate(desc.ops):
            fused = _rms_norm(op, index) or _silu(op, index)
            if fused is not None:
                desc.ops[i] = fused
                changed = True
                index = _Index(desc)
        _drop_dead(desc)
