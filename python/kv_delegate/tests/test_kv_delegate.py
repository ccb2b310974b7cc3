"""Tests of kv_delegate (need torch, executorch 1.5.1 and the packer; run from the repository root with
``KV_DELEGATE_PACK=$CARGO_TARGET_DIR/debug/delegate-pack PYTHONPATH=python/kv_delegate
.cache/export-venv/bin/python -m unittest discover python/kv_delegate/tests``)."""

from __future__ import annotations

import unittest

import torch
from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower

from kv_delegate import KvAliasMemoryPlanningPass, ReferencePartitioner
from kv_delegate.lowering import op_name
from kv_delegate.model import TINY, Decoder
from kv_delegate.pack import have_packer


class TanhHead(torch.nn.Module):
    """The decoder with an operator the reference graph lacks (``erf``) on its logits."""

    def __init__(self) -> None:
        super().__init__()
        self.decoder = Decoder(TINY)

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        return torch.erf(self.decoder(tokens, input_pos))


def _lower(model: torch.nn.Module, partitioner: ReferencePartitioner):
    args = (torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64))
    with torch.no_grad():
        return to_edge_transform_and_lower(torch.export.export(model, args), partitioner=[partitioner])


@unittest.skipUnless(have_packer(), "delegate-pack not found (set KV_DELEGATE_PACK)")
class KvDelegateTest(unittest.TestCase):
    def test_an_unsupported_operator_stays_outside_and_is_reported(self) -> None:
        partitioner = ReferencePartitioner(output_names=["logits"])
        edge = _lower(TanhHead(), partitioner)
        self.assertEqual([o.op for o in partitioner.unsupported()], ["aten.erf.default"])
        self.assertEqual(partitioner.unsupported()[0].value, "f32 [1, 64]")
        ops = [op_name(n) for n in edge.exported_program().graph.nodes if n.op == "call_function"]
        self.assertIn("aten.erf.default", ops)
        self.assertEqual(sum(1 for op in ops if op.endswith("executorch_call_delegate")), 1)

    def test_owned_state_leaves_no_write_back_and_no_alias(self) -> None:
        edge = _lower(Decoder(TINY), ReferencePartitioner(owned_state=True, output_names=["logits"]))
        graph = edge.exported_program().graph_module
        lowered = [m for name, m in graph.named_children() if name.startswith("lowered_module")]
        self.assertEqual(len(lowered), 1)
        self.assertEqual(lowered[0].meta["_delegate_info_meta"], {"kv_aliases": {}})
        with torch.no_grad():
            program = edge.to_executorch(ExecutorchBackendConfig(emit_mutable_buffer_names=True))
        ops = [op_name(n) for n in program.exported_program().graph.nodes if n.op == "call_function"]
        self.assertFalse([op for op in ops if "copy_" in op], ops)

    def test_the_planning_pass_places_both_caches(self) -> None:
        edge = _lower(Decoder(TINY), ReferencePartitioner(output_names=["logits"]))
        planner = KvAliasMemoryPlanningPass()
        with torch.no_grad():
            edge.to_executorch(ExecutorchBackendConfig(emit_mutable_buffer_names=True, memory_planning_pass=planner))
        self.assertEqual(sorted(b for _, b in planner.aliased), ["b_k_cache_0", "b_v_cache_0"])


if __name__ == "__main__":
    unittest.main()
