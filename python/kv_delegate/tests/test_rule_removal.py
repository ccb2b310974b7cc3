"""The partitioner never aborts an export (issue 46, item 4): with any one rule removed from the lowering, as
when a model has an operator the lowering does not know, the real models still export, whatever the missing
rule forces outside goes outside too (a causal mask or positions computed in another delegate call, a cache
repeat, an ``sdpa`` kept whole, which then runs decomposed on ExecuTorch's kernels), every node left outside is
named by ``unsupported()`` with the cause (the operator removed), never with the lowering's internal state, and
the program runs in ExecuTorch's runtime (``et-run``, the outside operators on its portable kernels) with
eager's tokens.

A representative set runs by default (a minute or two); ``KV_RULE_REMOVALS`` runs others: ``all`` (every rule
whose operator each model's edge program has: hours) or ``MODEL:OP,...`` (e.g. ``llama:aten.mul.Tensor``;
models: ``decoder``, ``hand`` and :data:`kv_delegate.export_real.HF_MODELS`)::

    KV_RULE_REMOVALS=phi:aten.gelu.default KV_DELEGATE_PACK=target/debug/delegate-pack \\
      PYTHONPATH=python/kv_delegate .cache/export-venv/bin/python -m pytest -q \\
      python/kv_delegate/tests/test_rule_removal.py
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import unittest
from typing import Sequence, Tuple

import torch

from kv_delegate.generate import greedy, one_token
from kv_delegate.lowering import op_name
from kv_delegate.pack import have_packer
from support import require_et_run, run_in_executorch, without_rule

#: (model, operator whose rule is removed): each a different way the split propagates.
REPRESENTATIVE: Tuple[Tuple[str, str], ...] = (
    # The case: LayerNorm outside splits every layer; the causal mask, the positions and the caches are
    # computed in other delegate calls, so both sdpa kept whole are decomposed by the first pass.
    ("phi", "aten.native_layer_norm.default"),
    # RMSNorm written by hand (pow, mean, rsqrt, mul) left in pieces.
    ("llama", "aten.mean.dim"),
    # The most common operator: rope, norms, the MLP's gate, all split.
    ("llama", "aten.mul.Tensor"),
    # rotate_half's cat: rope outside, between the projections and the cache update.
    ("llama", "aten.cat.default"),
    # A kept-whole operator without a rule: decomposed from the start.
    ("llama", "aten.scaled_dot_product_attention.default"),
    # The cache updates outside: no sdpa can read a cache update of its delegate call.
    ("llama", "aten.index_put.default"),
    # GPT-2's Conv1D (addmm with bias) outside: learned positions, fused c_attn split into pieces.
    ("gpt2", "aten.addmm.default"),
    # torch's rms_norm, kept whole for the delegate (the example decoder), decomposed instead: its parts are
    # fused back into the delegate's rms_norm, and nothing is left outside.
    ("decoder", "aten.rms_norm.default"),
)
#: What an internal value or error of the lowering looks like; a reason never shows one.
INTERNAL = re.compile(r"declared twice|\b\w+Error\b|Traceback|\b(HeadView|Known|Positions|FirstElement|CausalMask|"
                      r"CacheGroups|ShiftedPositions|AllTrue|Tensor)\(")
PROMPT = [1, 7, 3, 12]
STEPS = 12


def _module(kind: str) -> torch.nn.Module:
    from kv_delegate.export_real import module
    from kv_delegate.model import TINY, Decoder

    return Decoder(TINY).eval() if kind == "decoder" else module(kind, torch.float32)


@functools.lru_cache(maxsize=None)
def eager_tokens(kind: str) -> Tuple[int, ...]:
    """Torch eager's greedy tokens of ``kind`` over :data:`PROMPT` and :data:`STEPS` steps, one token a call."""
    from kv_delegate.export_real import step_fn

    model = _module(kind)
    step = (lambda tok, pos: model(torch.tensor([tok]), torch.tensor([pos]))[-1]) if kind == "decoder" else \
        step_fn(kind, model)
    return tuple(greedy(one_token(step), PROMPT, STEPS)[0])


def export(kind: str) -> Tuple[bytes, list]:
    """``kind``'s ``.pte`` for ``ReferenceBackend`` and what was left outside."""
    from kv_delegate.export_real import export as export_real

    if kind != "decoder":
        return export_real(kind, torch.float32)
    from test_partitioner import export as export_module

    pte, partitioner, _ = export_module(_module(kind))
    return pte, partitioner.unsupported()


@functools.lru_cache(maxsize=None)
def edge_ops(kind: str) -> frozenset:
    """The operators of ``kind``'s edge program (what a removed rule can matter to)."""
    from executorch.exir import to_edge_transform_and_lower

    from kv_delegate import ReferencePartitioner

    seen: set = set()

    class Recording(ReferencePartitioner):
        def partition(self, ep):  # noqa: ANN001 - ExecuTorch's signature
            seen.update(op_name(n) for n in ep.graph.nodes if n.op == "call_function")
            return super().partition(ep)

    model = _module(kind)
    if kind in ("decoder", "hand"):
        args, kwargs = (torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)), {}
    else:
        args, kwargs = (), {"input_ids": torch.tensor([[1]]), "cache_position": torch.tensor([0])}
    with torch.no_grad():
        ep = torch.export.export(model, args, kwargs, strict=kind not in ("decoder", "hand"))
        to_edge_transform_and_lower(ep, partitioner=[Recording()])
    return frozenset(seen)


def requested() -> Sequence[Tuple[str, str]]:
    """The removals ``KV_RULE_REMOVALS`` asks for."""
    from kv_delegate.export_real import HF_MODELS
    from kv_delegate.partitioner import SUPPORTED_OPS

    wanted = os.environ["KV_RULE_REMOVALS"].strip()
    if wanted == "all":
        kinds = ["decoder", "hand", *HF_MODELS]
        return [(kind, op) for kind in kinds for op in sorted(SUPPORTED_OPS & edge_ops(kind))]
    return [tuple(pair.split(":", 1)) for pair in wanted.split(",")]


@unittest.skipUnless(have_packer(), "delegate-pack not found (set KV_DELEGATE_PACK)")
@unittest.skipUnless(importlib.util.find_spec("transformers"), "transformers is not installed")
class RuleRemovalTest(unittest.TestCase):
    def check(self, kind: str, op: str) -> None:
        require_et_run()
        with without_rule(op):
            pte, outside = export(kind)
        said = [str(o) for o in outside]
        for o in outside:
            self.assertTrue(o.op == op or op in o.reason, f"the cause ({op}) is not named: {o}")
            self.assertIsNone(INTERNAL.search(o.reason), f"an internal state is named: {o}")
        self.assertEqual(run_in_executorch(pte, PROMPT, STEPS), list(eager_tokens(kind)), said)

    def test_each_removed_rule_still_exports_names_the_cause_and_gives_eager_tokens(self) -> None:
        for kind, op in REPRESENTATIVE:
            with self.subTest(model=kind, without=op):
                self.check(kind, op)

    if os.environ.get("KV_RULE_REMOVALS"):

        def test_the_removals_kv_rule_removals_asks_for(self) -> None:
            for kind, op in requested():
                with self.subTest(model=kind, without=op):
                    self.check(kind, op)


if __name__ == "__main__":
    unittest.main()
