"""A mutable buffer that is not a cache but is overwritten every call (Hugging Face StaticCache's
``cumulative_length``: ``copy_(cache_position[0])``, then ``+= 1``) is written by the delegate in place with the
reference graph's ``assign``: :class:`kv_delegate.KvAliasMemoryPlanningPass` places the delegate output on the
buffer and removes the write-back, so no ``copy_`` is left. A buffer some op reads besides the ``copy`` keeps its
ordinary output and write-back (run from the repository root with ``KV_DELEGATE_PACK=target/debug/delegate-pack
PYTHONPATH=python/kv_delegate .cache/export-venv/bin/python -m pytest -q
python/kv_delegate/tests/test_buffer_assign.py``).
"""

from __future__ import annotations

import importlib.util
import unittest
from typing import Dict, List, Tuple

import torch
from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower

from kv_delegate import KvAliasMemoryPlanningPass, ReferencePartitioner
from kv_delegate.pack import have_packer


def _copies(program) -> Dict[str, int]:
    """Per method, how many ``copy_`` nodes its final graph still has."""
    return {
        name: sum(1 for n in program.exported_program(name).graph.nodes if n.op == "call_function"
                  and "copy_" in str(getattr(n.target, "__name__", n.target)))
        for name in program.methods
    }


def _export(model: torch.nn.Module, args: Tuple = (), kwargs: Dict = None, strict: bool = False):
    """The program for ``ReferenceBackend`` with the planning pass, the planner and what was left outside."""
    planner = KvAliasMemoryPlanningPass()
    partitioner = ReferencePartitioner(output_names=["out"])
    with torch.no_grad():
        ep = torch.export.export(model, args, kwargs or {}, strict=strict)
        edge = to_edge_transform_and_lower(ep, partitioner=[partitioner])
        program = edge.to_executorch(
            ExecutorchBackendConfig(emit_mutable_buffer_names=True, memory_planning_pass=planner))
    return program, planner, partitioner.unsupported()


def _removed(planner: KvAliasMemoryPlanningPass, word: str) -> List[str]:
    return sorted(buffer for _, buffer in planner.removed if word in buffer)


class Counter(torch.nn.Module):
    """StaticCache's ``cumulative_length`` in miniature: set to the position, then advanced by the rows."""

    def __init__(self, read_first: bool = False) -> None:
        super().__init__()
        self.read_first = read_first
        self.register_buffer("seen", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        out = x * 2.0
        if self.read_first:
            out = out + self.seen.to(torch.float32)  # reads the buffer: an in-place write would change it
        self.seen.copy_(pos[0])
        self.seen.add_(1)
        return out


@unittest.skipUnless(have_packer(), "delegate-pack not found (set KV_DELEGATE_PACK)")
class BufferAssignTest(unittest.TestCase):
    def test_an_overwritten_buffer_is_assigned_in_place_with_no_write_back(self) -> None:
        program, planner, outside = _export(Counter(), (torch.ones(4), torch.tensor([3])))
        self.assertEqual([str(o) for o in outside], [])
        self.assertEqual(_removed(planner, "seen"), ["b_seen"])
        self.assertEqual(_copies(program), {"forward": 0})

    def test_a_buffer_read_by_another_op_keeps_its_write_back(self) -> None:
        program, planner, outside = _export(Counter(read_first=True), (torch.ones(4), torch.tensor([3])))
        self.assertEqual([str(o) for o in outside], [])
        self.assertEqual(_removed(planner, "seen"), [])
        self.assertEqual(_copies(program), {"forward": 1})

    @unittest.skipUnless(importlib.util.find_spec("transformers"), "transformers is not installed")
    def test_hugging_face_llama_has_no_write_back_of_cumulative_length(self) -> None:
        from kv_delegate.export_real import module

        kwargs = {"input_ids": torch.tensor([[1]]), "cache_position": torch.tensor([0])}
        program, planner, outside = _export(module("llama", torch.float32), kwargs=kwargs, strict=True)
        self.assertEqual([str(o) for o in outside], [])
        lengths = _removed(planner, "cumulative_length")
        self.assertEqual(len(lengths), 2, planner.removed)  # one per layer
        self.assertEqual(_copies(program), {"forward": 0})


if __name__ == "__main__":
    unittest.main()
