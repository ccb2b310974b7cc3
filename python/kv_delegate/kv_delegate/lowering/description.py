"""The reference graph being built (ref-graph payload JSON plus its constant section) and the lowered result."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch._subclasses.fake_tensor import FakeTensor

from .common import DTYPES, LoweringError

#: Alignment of every constant in the constant section (ref-graph's ``CONSTANT_ALIGN``).
CONSTANT_ALIGN = 16


def constant_bytes(value: torch.Tensor) -> bytes:
    """``value``'s elements, little-endian (the bytes of a fake tensor do not matter: zeros)."""
    if isinstance(value, FakeTensor):
        # The partitioner's dry run sees ExecuTorch's fake copy of the program.
        return bytes(value.numel() * value.element_size())
    value = value.detach().contiguous().cpu()
    if value.dtype == torch.bfloat16:
        value = value.view(torch.int16)  # numpy has no bf16: the same two bytes
    array = value.numpy()
    return array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()


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

    def fresh(self, base: str) -> str:
        """A tensor name starting with ``base`` that is not declared yet."""
        if base not in self.shapes:
            return base
        n = 1
        while f"{base}_{n}" in self.shapes:
            n += 1
        return f"{base}_{n}"

    def constant(self, name: str, value: torch.Tensor) -> str:
        """Declares a constant with ``value``'s bytes (little-endian, 16-byte aligned)."""
        dtype = DTYPES.get(value.dtype)
        if dtype is None:
            raise LoweringError(f"constant '{name}' is {value.dtype}; the reference graph holds f32, f16, bf16, i64")
        self.declare(name, dtype, value.shape)
        self.data.extend(b"\0" * (-len(self.data) % CONSTANT_ALIGN))
        raw = constant_bytes(value)
        self.constants.append({"tensor": name, "offset": len(self.data), "nbytes": len(raw)})
        self.data.extend(raw)
        return name

    def op(self, op: str, out: str, dtype: str, shape: Sequence[int], /, **operands: Any) -> str:
        """Appends op ``op`` whose output ``out`` is a new tensor of ``dtype`` ``shape``; returns ``out``."""
        self.declare(out, dtype, shape)
        self.ops.append({"op": op, **{k: v for k, v in operands.items() if v is not None}, "out": out})
        self.op_nodes.append(self.producer)
        return out

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
