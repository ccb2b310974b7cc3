"""Forms whose lowering a test must see run to catch a wrong one (issue 46, item 8): each model is exported for
``ReferenceBackend`` and run in ExecuTorch's runtime (``et-run``) against torch eager's tokens.

- an RMSNorm eps that changes the result (0.5; Hugging Face's 1e-6 hides a dropped or changed eps);
- a causal mask whose rows carry an offset (``arange(L) + c <= positions``: the sign of ``c`` matters);
- a prefill of several tokens (T = 4, then decode steps of one: the cache rows written at
  ``input_pos + arange(T)``, not from the last);
- a node the lowering takes and the packer refuses (``neg`` of the i64 position): left outside by the dry run;
- a sliding window shorter than the cache (Mistral, window 8, cache 64): the window's part of the mask stays
  outside, attention runs decomposed, and the tokens past the window are eager's.
"""

from __future__ import annotations

import importlib.util
import unittest
from typing import List, Tuple

import torch
from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower

from kv_delegate import KvAliasMemoryPlanningPass, ReferencePartitioner
from kv_delegate.llama_style import CONFIG, LlamaStyle, RMSNorm, greedy
from kv_delegate.lowering import op_name
from kv_delegate.model import TINY, Decoder
from kv_delegate.model import greedy as model_greedy
from kv_delegate.pack import have_packer
from support import require_et_run, run_in_executorch

PROMPT = [1, 7, 3, 12]
STEPS = 12


class OffsetMask(LlamaStyle):
    """:class:`LlamaStyle` with the causal mask written ``arange(L) + c <= positions`` (``c = -1``: each query
    also sees the next row, zero until written)."""

    def __init__(self) -> None:
        super().__init__(CONFIG)
        self.register_buffer("row_offset", torch.tensor(-1), persistent=False)

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[0]
        positions = input_pos + torch.arange(t, dtype=torch.int64)
        freqs = positions[:, None].float() * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[None], emb.sin()[None]
        mask = torch.arange(self.cfg["max_len"])[None, :] + self.row_offset <= positions[:, None]
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x, positions, cos, sin, mask)
        return self.lm_head(self.norm(x))


class NegatedPosition(LlamaStyle):
    """:class:`LlamaStyle` whose logits are shifted by ``-input_pos / 100`` (every logit alike: the tokens do not
    change): ``neg`` of an i64 tensor, which the lowering takes and the reference graph refuses (float only)."""

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        return super().forward(tokens, input_pos) + (-input_pos).float() * 0.01


def export(model: torch.nn.Module, rows: Tuple[Tuple[str, int], ...] = (("forward", 1),)):
    """The planned ``.pte`` of ``model`` with a method per ``(name, T)``, and what was left outside."""
    partitioner = ReferencePartitioner(output_names=["logits"])
    with torch.no_grad():
        programs = {name: torch.export.export(model, (torch.zeros(t, dtype=torch.int64),
                                                      torch.zeros(1, dtype=torch.int64)), strict=False)
                    for name, t in rows}
        edge = to_edge_transform_and_lower(programs, partitioner=[partitioner])
        calls = {name: sum(op_name(n).endswith("executorch_call_delegate")
                           for n in edge.exported_program(name).graph.nodes) for name, _ in rows}
        planner = KvAliasMemoryPlanningPass(share_mutable_buffers=len(rows) > 1)
        program = edge.to_executorch(ExecutorchBackendConfig(emit_mutable_buffer_names=True,
                                                             memory_planning_pass=planner))
    return program.buffer, partitioner.unsupported(), calls


@unittest.skipUnless(have_packer(), "delegate-pack not found (set KV_DELEGATE_PACK)")
class LoweringFormsTest(unittest.TestCase):
    def check_whole(self, model: torch.nn.Module, tokens: List[int],
                    rows: Tuple[Tuple[str, int], ...] = (("forward", 1),)) -> None:
        """``model`` delegated whole (one call a method) and giving eager's ``tokens`` (after :data:`PROMPT`)."""
        require_et_run()
        pte, outside, calls = export(model, rows)
        self.assertEqual([str(o) for o in outside], [])
        self.assertEqual(set(calls.values()), {1}, calls)
        self.assertEqual(run_in_executorch(pte, PROMPT, len(tokens) - 1), tokens)

    def test_an_rms_norm_eps_that_matters_is_the_model_s(self) -> None:
        model = LlamaStyle(CONFIG)
        for norm in model.modules():
            if isinstance(norm, RMSNorm):
                norm.eps = 0.5
        self.check_whole(model, greedy(model.eval(), PROMPT, STEPS))

    def test_a_causal_mask_with_an_offset_on_its_rows(self) -> None:
        # The last position sees one row past it: stop where that row is still in the cache of 16.
        model = OffsetMask().eval()
        self.check_whole(model, greedy(model, PROMPT, CONFIG["max_len"] - len(PROMPT) - 1))

    def test_a_prefill_of_several_tokens_writes_each_row_at_its_position(self) -> None:
        # The example decoder (LlamaStyle's reshape of sdpa's output does not trace at T > 1 in ExecuTorch's
        # second decomposition pass; the decoder copies it contiguous first).
        model = Decoder(TINY).eval()
        self.assertEqual(TINY["prompt"], PROMPT)
        self.check_whole(model, model_greedy(model, STEPS)[0], (("prefill", len(PROMPT)), ("decode", 1)))

    def test_a_node_the_packer_refuses_stays_outside_and_the_rest_is_delegated(self) -> None:
        require_et_run()
        model = NegatedPosition(CONFIG).eval()
        tokens = greedy(model, PROMPT, STEPS)
        pte, outside, _ = export(model)
        negated = [o for o in outside if o.op == "aten.neg.default"]
        self.assertEqual(len(negated), 1, [str(o) for o in outside])
        self.assertIn("the reference graph refuses it", negated[0].reason)
        self.assertEqual(run_in_executorch(pte, PROMPT, STEPS), tokens)

    @unittest.skipUnless(importlib.util.find_spec("transformers"), "transformers is not installed")
    def test_a_sliding_window_shorter_than_the_cache_runs_outside_with_eager_tokens(self) -> None:
        from kv_delegate import export_real

        require_et_run()
        kind = "mistral_window_8"
        export_real.HF_MODELS[kind] = ("MistralForCausalLM", "MistralConfig", {"sliding_window": 8})
        try:
            tokens, _ = export_real.greedy(export_real.step_fn(kind, export_real.module(kind, torch.float32)))
            pte, outside = export_real.export(kind, torch.float32)
        finally:
            del export_real.HF_MODELS[kind]
        window = [o for o in outside if o.op == "aten.gt.Tensor"]
        self.assertEqual(len(window), 1, [str(o) for o in outside])
        self.assertIn("a sliding window of 8 positions is shorter than the cache of 64", window[0].reason)
        forced: List[str] = [str(o) for o in outside if o is not window[0] and "aten.gt.Tensor" not in o.reason]
        self.assertEqual(forced, [], "every node outside names the window as the cause")
        self.assertEqual(run_in_executorch(pte, export_real.PROMPT, export_real.STEPS), tokens)


if __name__ == "__main__":
    unittest.main()
