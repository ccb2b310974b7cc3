"""Attention written by hand (issue 46 item 2): transformers' eager attention (``bmm`` of q and the repeated key
cache transposed, a scale, Gemma 2's logit soft-capping ``tanh(s / c) * c``, the causal mask added as floats,
``_softmax``, ``bmm`` with the repeated value cache) folds into one ``causal_attention`` per layer, Gemma 2's
cap as its ``softcap``; the models are delegated whole and give eager's tokens in ExecuTorch's runtime."""

from __future__ import annotations

import importlib.util
import re
import unittest

import torch

from kv_delegate.export_real import HF_MODELS, PROMPT, STEPS, export, greedy, module, step_fn
from kv_delegate.pack import have_packer
from support import require_et_run, run_in_executorch


def payload_ops(pte: bytes) -> list:
    """The ``causal_attention`` ops of the reference-graph payloads in ``pte`` (their JSON is plain text; a
    soft-capped one is written ``causal_attention_softcapped``, which a reader older than payload 1.4 refuses)."""
    return re.findall(rb'\{[^{}]*"op":"causal_attention(?:_softcapped)?"[^{}]*\}', pte)


@unittest.skipUnless(have_packer(), "delegate-pack not found (set KV_DELEGATE_PACK)")
@unittest.skipUnless(importlib.util.find_spec("transformers"), "transformers is not installed")
class EagerAttentionTest(unittest.TestCase):
    def check(self, kind: str, dtype: torch.dtype = torch.float32) -> list:
        """``kind`` delegated whole with eager's tokens in et-run; its attention ops."""
        require_et_run()
        data, outside = export(kind, dtype)
        self.assertEqual([str(o) for o in outside], [])
        tokens, _ = greedy(step_fn(kind, module(kind, dtype)))
        self.assertEqual(run_in_executorch(data, PROMPT, STEPS), tokens)
        return payload_ops(data)

    def test_gemma2_is_delegated_whole_with_its_logit_soft_capping_folded_into_attention(self) -> None:
        ops = self.check("gemma2")
        self.assertEqual(len(ops), 2, "one causal_attention per layer")
        cap = HF_MODELS["gemma2"][2]["attn_logit_softcapping"]
        for op in ops:
            self.assertIn(b'"op":"causal_attention_softcapped"', op)
            self.assertIn(f'"softcap":{cap}'.encode(), op)
            # query_pre_attn_scalar = 16: the scale 16 ** -0.5, times the cap (c * tanh(s / c) with s scaled).
            self.assertIn(b'"scale":0.25', op)

    def test_the_caps_change_gemma2s_tokens_so_the_fixture_tests_them(self) -> None:
        # A lowering (or an executor) that dropped the cap would give other tokens: the test above would fail.
        name, config, extra = HF_MODELS["gemma2"]
        HF_MODELS["gemma2_uncapped"] = (name, config, {**extra, "attn_logit_softcapping": None})
        try:
            capped, _ = greedy(step_fn("gemma2", module("gemma2", torch.float32)))
            uncapped, _ = greedy(step_fn("gemma2_uncapped", module("gemma2_uncapped", torch.float32)))
        finally:
            del HF_MODELS["gemma2_uncapped"]
        self.assertNotEqual(capped, uncapped)

    def test_llama_with_eager_attention_is_delegated_whole(self) -> None:
        ops = self.check("llama_eager")
        self.assertEqual(len(ops), 2, "one causal_attention per layer")
        for op in ops:
            self.assertNotIn(b"softcap", op)
            self.assertIn(b'"scale":0.25', op, "head_dim 16: transformers' scaling 16 ** -0.5")


def eager_sdpa(form: str):
    """``scaled_dot_product_attention`` written by hand, the mask applied by ``form``: ``masked_fill`` of ``~mask``,
    ``where``, or an additive float mask built with ``masked_fill`` of zeros."""

    def attention(q, k, v, attn_mask):
        scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        if form == "masked_fill":
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        elif form == "where":
            scores = torch.where(attn_mask, scores, torch.finfo(scores.dtype).min)
        else:
            scores = scores + torch.zeros(attn_mask.shape).masked_fill(attn_mask.logical_not(), -1e9)
        return torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v

    return attention


@unittest.skipUnless(have_packer(), "delegate-pack not found (set KV_DELEGATE_PACK)")
class HandWrittenMaskTest(unittest.TestCase):
    def test_each_way_of_applying_the_mask_folds_into_one_attention_with_eager_tokens(self) -> None:
        from types import SimpleNamespace

        import torch.nn.functional as F

        from kv_delegate import llama_style
        from kv_delegate.llama_style import CONFIG, LlamaStyle, greedy as greedy_style
        from test_partitioner import PROMPT as P, STEPS as S, export as export_module

        require_et_run()
        for form in ("masked_fill", "where", "additive"):
            with self.subTest(form):
                patched = SimpleNamespace(**{n: getattr(F, n) for n in dir(F) if not n.startswith("__")})
                patched.scaled_dot_product_attention = eager_sdpa(form)
                original, llama_style.F = llama_style.F, patched
                try:
                    model = LlamaStyle(CONFIG).eval()
                    tokens = greedy_style(model, P, S)
                    model.reset_caches()
                    pte, partitioner, ops = export_module(model)
                finally:
                    llama_style.F = original
                self.assertEqual([str(o) for o in partitioner.unsupported()], [])
                self.assertEqual(len(payload_ops(pte)), CONFIG["layers"], "one causal_attention per layer")
                self.assertEqual(run_in_executorch(pte, P, S), tokens)


if __name__ == "__main__":
    unittest.main()
