"""Tests of :class:`kv_delegate.KvAliasMemoryPlanningPass`'s write-back removal: a cache the delegate updates in
place has no ``copy_`` left in the emitted program, and a buffer whose new value has storage of its own keeps
its write-back (run from the repository root with ``KV_DELEGATE_PACK=target/debug/delegate-pack
PYTHONPATH=python/kv_delegate .cache/export-venv/bin/python -m pytest -q python/kv_delegate/tests/test_planning.py``).
"""

from __future__ import annotations

import unittest
from typing import Dict, List

import torch
from executorch.exir import ExecutorchBackendConfig, to_edge, to_edge_transform_and_lower

from kv_delegate import KvAliasMemoryPlanningPass, ReferencePartitioner
from kv_delegate.model import TINY, Decoder
from kv_delegate.pack import have_packer


def _operators(program) -> Dict[str, List[str]]:
    """The emitted operator names of each method (what the runtime resolves and runs as kernel calls)."""
    return {plan.name: [op.name for op in plan.operators] for plan in program.executorch_program.execution_plan}


def _copies(program) -> Dict[str, int]:
    """Per method, how many ``copy_`` nodes its final graph still has."""
    return {
        name: sum(1 for n in program.exported_program(name).graph.nodes if n.op == "call_function"
                  and "copy_" in str(getattr(n.target, "__name__", n.target)))
        for name in program.methods
    }


def _named_buffers(program, method: str) -> List[str]:
    """The fully qualified names of the mutable buffers a method's values carry."""
    plan = next(p for p in program.executorch_program.execution_plan if p.name == method)
    names = []
    for value in plan.values:
        name = getattr(value.val, "extra_tensor_info", None)
        if name is not None and name.fully_qualified_name:
            names.append(name.fully_qualified_name)
    return sorted(names)


def _decoder_program(methods: List[str]):
    model = Decoder(TINY).eval()
    rows = {"forward": 1, "prefill": len(TINY["prompt"]), "decode": 1}
    planner = KvAliasMemoryPlanningPass(share_mutable_buffers=len(methods) > 1)
    with torch.no_grad():
        programs = {
            m: torch.export.export(
                model, (torch.zeros(rows[m], dtype=torch.int64), torch.zeros(1, dtype=torch.int64)), strict=False
            )
            for m in methods
        }
        edge = to_edge_transform_and_lower(programs, partitioner=[ReferencePartitioner(output_names=["logits"])])
        program = edge.to_executorch(
            ExecutorchBackendConfig(emit_mutable_buffer_names=True, memory_planning_pass=planner)
        )
    return program, planner


class Accumulator(torch.nn.Module):
    """A mutable buffer updated by an ExecuTorch kernel (no delegate): its new value has storage of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("total", torch.zeros(4, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.total.add_(x)
        return self.total * 2.0


@unittest.skipUnless(have_packer(), "delegate-pack not found (set KV_DELEGATE_PACK)")
class SelfCopyRemovalTest(unittest.TestCase):
    def test_in_place_caches_have_no_write_back_left(self) -> None:
        for methods in (["forward"], ["prefill", "decode"]):
            with self.subTest(methods=methods):
                program, planner = _decoder_program(methods)
                self.assertEqual(len(planner.aliased), 2 * len(methods))
                self.assertEqual(_copies(program), {m: 0 for m in methods})
                for method, ops in _operators(program).items():
                    self.assertNotIn("aten::copy_", ops, method)
                    # The caches are still the method's named mutable buffers.
                    self.assertEqual(_named_buffers(program, method), ["k_cache_0", "v_cache_0"], method)
                removed = sorted(buffer for _, buffer in planner.removed)
                self.assertEqual(removed, sorted(["b_k_cache_0", "b_v_cache_0"] * len(methods)))

    def test_a_buffer_whose_new_value_has_its_own_storage_keeps_its_write_back(self) -> None:
        planner = KvAliasMemoryPlanningPass()
        with torch.no_grad():
            edge = to_edge(torch.export.export(Accumulator(), (torch.ones(4, 8),), strict=False))
            program = edge.to_executorch(
                ExecutorchBackendConfig(emit_mutable_buffer_names=True, memory_planning_pass=planner)
            )
        self.assertEqual(planner.removed, [])
        self.assertEqual(_copies(program), {"forward": 1})
        self.assertIn("aten::copy_", _operators(program)["forward"])


if __name__ == "__main__":
    unittest.main()
