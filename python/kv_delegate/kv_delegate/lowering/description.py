"""The reference graph being built (ref-graph payload JSON plus its constant section) and the lowered result."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, BinaryIO, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
from torch._subclasses.fake_tensor import FakeTensor

from .common import DTYPES, LoweringError

#: Alignment of every constant in the constant section (ref-graph's ``CONSTANT_ALIGN``).
CONSTANT_ALIGN = 16


#: Elements converted and written at a time by :meth:`TensorBytes.write_to` (bounds the memory a write adds).
WRITE_CHUNK = 8 << 20


class TensorBytes:
    """A constant's elements, little-endian, not copied: the tensor is held and its bytes made only when
    written (:meth:`write_to`, a chunk at a time) or asked for (``bytes()``), so a constant section of a model's
    weights adds no copy of them. The bytes of a fake tensor (the partitioner's dry run sees ExecuTorch's fake
    copy of the program) do not matter: zeros."""

    def __init__(self, value: torch.Tensor) -> None:
        self.value = value
        self.nbytes = value.numel() * value.element_size()

    def __len__(self) -> int:
        return self.nbytes

    def _arrays(self) -> Iterator[Any]:
        """The elements as little-endian numpy arrays of at most :data:`WRITE_CHUNK` elements each."""
        if isinstance(self.value, FakeTensor):
            for start in range(0, self.nbytes, WRITE_CHUNK):
                yield bytes(min(WRITE_CHUNK, self.nbytes - start))
            return
        flat = self.value.detach().cpu().contiguous().reshape(-1)
        if flat.dtype == torch.bfloat16:
            flat = flat.view(torch.int16)  # numpy has no bf16: the same two bytes
        for start in range(0, flat.numel(), WRITE_CHUNK):
            array = flat[start:start + WRITE_CHUNK].numpy()
            yield array.astype(array.dtype.newbyteorder("<"), copy=False)

    def write_to(self, out: BinaryIO) -> None:
        """Writes the bytes to ``out``, a chunk at a time."""
        for chunk in self._arrays():
            out.write(memoryview(chunk).cast("B") if not isinstance(chunk, bytes) else chunk)

    def __bytes__(self) -> bytes:
        return b"".join(bytes(memoryview(c).cast("B")) if not isinstance(c, bytes) else c for c in self._arrays())


def constant_bytes(value: torch.Tensor) -> TensorBytes:
    """``value``'s elements, little-endian, as :class:`TensorBytes` (made when written)."""
    return TensorBytes(value)


class ConstantSection:
    """The payload's constant section as it is built: padding and :class:`TensorBytes` pieces at their offsets,
    none copied. ``len`` is the section's size; a slice gives its bytes (the lowering reads back one-element
    constants); :meth:`write_to` streams the whole section to a file."""

    def __init__(self) -> None:
        self.pieces: List[Tuple[int, Union[bytes, TensorBytes]]] = []
        self.length = 0

    def __len__(self) -> int:
        return self.length

    def extend(self, raw: Union[bytes, TensorBytes]) -> None:
        """Appends ``raw`` (padding bytes or a constant's :class:`TensorBytes`)."""
        if len(raw):
            self.pieces.append((self.length, raw))
            self.length += len(raw)

    def __getitem__(self, index: slice) -> bytes:
        start, stop, _ = index.indices(self.length)
        out = bytearray()
        for offset, raw in self.pieces:
            if offset < stop and start < offset + len(raw):
                whole = raw if isinstance(raw, bytes) else bytes(raw)
                out += whole[max(start - offset, 0):stop - offset]
        return bytes(out)

    def write_to(self, out: BinaryIO) -> None:
        """Writes the section to ``out``, each constant a chunk at a time."""
        for _, raw in self.pieces:
            if isinstance(raw, bytes):
                out.write(raw)
            else:
                raw.write_to(out)

    def __bytes__(self) -> bytes:
        return self[0:self.length]


@dataclass
class Description:
    """The reference graph being built: the JSON description plus the constant section."""

    tensors: List[Dict[str, Any]] = field(default_factory=list)
    inputs: List[str] = field(default_factory=list)
    outputs: List[str] = field(default_factory=list)
    state: List[str] = field(default_factory=list)
    constants: List[Dict[str, Any]] = field(default_factory=list)
    ops: List[Dict[str, Any]] = field(default_factory=list)
    data: ConstantSection = field(default_factory=ConstantSection)
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
