"""The partitioner claims only what the lowering takes (issue 18, item 1): the example decoder is delegated
whole; a decoder with an operator the delegate does not run, and a Llama-style decoder written as users write
one, export with what does not lower left outside, named by ``unsupported()`` in the user's words, and their
``.pte`` runs in ExecuTorch's own runtime (``et-run``) with eager's tokens.

Run from the repository root (pytest, or ``python -m unittest``)::

    KV_DELEGATE_PACK=target/debug/delegate-pack PYTHONPATH=python/kv_delegate \\
      .cache/export-venv/bin/python -m pytest python/kv_delegate/tests

``et-run`` is found as :mod:`support` says (``$KV_ET_RUN``, else the build directory).
"""

from __future__ import annotations

import functools
import re
import sys
import unittest
from pathlib import Path
from typing import List, Tuple

import torch
from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower

from kv_delegate import KvAliasMemoryPlanningPass, ReferencePartitioner
from kv_delegate.lowering import op_name
from kv_delegate.model import TINY, Decoder, GeluDecoder, greedy
from kv_delegate.pack import have_packer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kv_delegate.llama_style import CONFIG as LLAMA_CONFIG  # noqa: E402
from kv_delegate.llama_style import LlamaStyle  # noqa: E402
from kv_delegate.llama_style import greedy as llama_greedy  # noqa: E402
from support import run_in_executorch as run_tokens  # noqa: E402

PROMPT = [1, 7, 3, 12]
STEPS = 12
#: What an internal value of the lowering looks like when printed; a reason never shows one.
INTERNAL = re.compile(r"\b(HeadView|Known|Positions|FirstElement|CausalMask|CacheGroups|Tensor)\(")


class OddForms(torch.nn.Module):
    """Operators the lowering has rules for, in forms it refuses: ``pow(x, 5)`` and a mean over the rows."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(16, 8)
        self.head = torch.nn.Linear(8, 16, bias=False)

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        return self.head(x.pow(5) + x.mean(0, keepdim=True))


def run_in_executorch(pte: bytes, tmp: Path) -> List[int]:
    """The greedy tokens of the fixtures' protocol (prompt 1,7,3,12 then 12 steps) from ``et-run``."""
    return run_tokens(pte, PROMPT, STEPS)


def export(model: torch.nn.Module) -> Tuple[bytes, ReferencePartitioner, List[str]]:
    """The planned one-method ``.pte`` of ``model``, its partitioner, and the edge program's operators."""
    partitioner = ReferencePartitioner(output_names=["logits"])
    args = (torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64))
    with torch.no_grad():
        edge = to_edge_transform_and_lower(torch.export.export(model, args, strict=False), partitioner=[partitioner])
        ops = [op_name(n) for n in edge.exported_program().graph.nodes if n.op == "call_function"]
        program = edge.to_executorch(
            ExecutorchBackendConfig(emit_mutable_buffer_names=True, memory_planning_pass=KvAliasMemoryPlanningPass())
        )
    return program.buffer, partitioner, ops


@functools.lru_cache(maxsize=None)
def exported(name: str) -> Tuple[bytes, Tuple, Tuple[str, ...], Tuple[int, ...]]:
    """``(pte, unsupported, edge ops, eager tokens)`` of one of the test models, exported once."""
    if name in ("llama_style", "llama_tiled"):
        model = LlamaStyle({**LLAMA_CONFIG, "gqa_tiled": int(name == "llama_tiled")}).eval()
        tokens = llama_greedy(model, PROMPT, STEPS)
    elif name == "odd_forms":
        model, tokens = OddForms().eval(), []
    else:
        model = (Decoder if name == "decoder" else GeluDecoder)(TINY).eval()
        tokens = greedy(model, STEPS)[0]
    pte, partitioner, ops = export(model)
    return pte, tuple(partitioner.unsupported()), tuple(ops), tuple(tokens)


@unittest.skipUnless(have_packer(), "delegate-pack not found (set KV_DELEGATE_PACK)")
class PartitionerTest(unittest.TestCase):
    def setUp(self) -> None:
        import tempfile

        self._tmp = tempfile.TemporaryDirectory(prefix="kv_delegate_test_")
        self.tmp = Path(self._tmp.name)

    def tearDown(self) -> None:
        self._tmp.cleanup()

    def test_the_example_decoder_is_delegated_whole_and_runs_with_eager_tokens(self) -> None:
        pte, outside, ops, tokens = exported("decoder")
        self.assertEqual(outside, ())
        self.assertEqual(sum(op.endswith("executorch_call_delegate") for op in ops), 1)
        self.assertEqual(run_in_executorch(pte, self.tmp), list(tokens))

    def test_an_op_the_delegate_does_not_run_stays_outside_named_with_the_reason(self) -> None:
        pte, outside, ops, tokens = exported("gelu")
        self.assertEqual(len(outside), 1, [str(o) for o in outside])
        erf = outside[0]
        self.assertEqual((erf.node, erf.op, erf.value), ("aten_erf_default", "aten.erf.default", "f32 [1, 64]"))
        self.assertIn("not an operator the reference graph runs", erf.reason)
        self.assertIn("'aten_erf_default' (aten.erf.default, f32 [1, 64])", str(erf))
        self.assertIn("aten.erf.default", ops)
        self.assertEqual(run_in_executorch(pte, self.tmp), list(tokens))

    def test_a_hand_written_llama_style_decoder_is_delegated_whole_and_runs_with_eager_tokens(self) -> None:
        # nn.Linear, a decomposed RMSNorm with a scalar eps, rotate_half RoPE, GQA by repeat_interleave and a mask
        # shared by both layers: each of these broke the whole export before issue 18.
        pte, outside, ops, tokens = exported("llama_style")
        self.assertEqual(outside, (), [str(o) for o in outside])
        self.assertEqual(sum(op.endswith("executorch_call_delegate") for op in ops), 1)
        self.assertEqual(run_in_executorch(pte, self.tmp), list(tokens))

    def test_grouped_query_attention_in_tiled_order_is_never_lowered_to_the_wrong_heads(self) -> None:
        # Issue 46, item 7: `k.unsqueeze(0).expand(g, Hkv, L, Dh).reshape(H, L, Dh)` makes query head h read KV
        # head h % Hkv, where the delegate's causal_attention reads h // groups: delegating it as repeat_kv's
        # order gave other tokens than eager, silently. Both orders are delegated whole, each with eager's tokens.
        for name in ("llama_style", "llama_tiled"):
            with self.subTest(name):
                pte, outside, ops, tokens = exported(name)
                self.assertEqual(outside, (), [str(o) for o in outside])
                self.assertEqual(sum(op.endswith("executorch_call_delegate") for op in ops), 1)
                self.assertEqual(run_in_executorch(pte, self.tmp), list(tokens))
        self.assertNotEqual(exported("llama_style")[3], exported("llama_tiled")[3], "the orders are two models")

    def test_reasons_name_nodes_ops_and_shapes_never_internal_values(self) -> None:
        _, outside, _, _ = exported("odd_forms")
        refused = {o.op: o for o in outside if "not an operator the reference graph runs" not in o.reason}
        self.assertIn("aten.pow.Tensor_Scalar", refused, [str(o) for o in outside])
        self.assertIn("pow with exponent 5", refused["aten.pow.Tensor_Scalar"].reason)
        self.assertIn("aten.mean.dim", refused, [str(o) for o in outside])
        self.assertIn("not over the last axis", refused["aten.mean.dim"].reason)
        for o in refused.values():
            self.assertIsNone(INTERNAL.search(str(o)), str(o))
            self.assertRegex(o.value, r"^(f32|f16|bf16|i64|bool) \[", str(o))

    def test_the_delegate_says_how_many_positions_its_caches_hold(self) -> None:
        partitioner = ReferencePartitioner(output_names=["logits"])
        args = (torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64))
        with torch.no_grad():
            edge = to_edge_transform_and_lower(
                torch.export.export(Decoder(TINY), args, strict=False), partitioner=[partitioner]
            )
        lowered = [m for n, m in edge.exported_program().graph_module.named_children() if n.startswith("lowered")]
        specs = {s.key: bytes(s.value) for s in lowered[0].compile_specs}
        self.assertEqual(specs.get("max_seq_len"), str(TINY["max_len"]).encode())


if __name__ == "__main__":
    unittest.main()
