"""Real models are delegated whole (issue 18): Hugging Face ``LlamaForCausalLM`` and ``Qwen2ForCausalLM``
exported with transformers' own ExecuTorch recipe (StaticCache, GQA), in f32 and bf16, and the hand-written
Llama-style decoder, leave nothing outside ``ReferenceBackend``: one delegate call, ``unsupported()`` empty.
Their runs against eager's tokens are checked without torch on the committed fixtures
(``fixtures/executorch/real/``, crates/executorch-bridge/tests/real_models.rs)."""

from __future__ import annotations

import importlib.util
import unittest

import torch

from kv_delegate.export_real import export
from kv_delegate.pack import have_packer
from support import require_et_run, run_in_executorch


@unittest.skipUnless(have_packer(), "delegate-pack not found (set KV_DELEGATE_PACK)")
@unittest.skipUnless(importlib.util.find_spec("transformers"), "transformers is not installed")
class RealModelsTest(unittest.TestCase):
    def check(self, kind: str, dtype: torch.dtype) -> None:
        data, outside = export(kind, dtype)
        self.assertEqual([str(o) for o in outside], [])
        self.assertEqual(data[4:8], b"ET12", "a .pte")

    def test_hugging_face_llama_is_delegated_whole(self) -> None:
        self.check("llama", torch.float32)

    def test_hugging_face_qwen2_in_bf16_is_delegated_whole(self) -> None:
        self.check("qwen2", torch.bfloat16)

    def test_the_hand_written_llama_style_decoder_is_delegated_whole(self) -> None:
        self.check("hand", torch.float32)

    def check_tokens(self, kinds) -> None:
        """Each model delegated whole, with eager's tokens in ExecuTorch's runtime (``et-run``)."""
        from kv_delegate.export_real import PROMPT, STEPS, greedy, module, step_fn

        require_et_run()
        for kind in kinds:
            with self.subTest(kind):
                data, outside = export(kind, torch.float32)
                self.assertEqual([str(o) for o in outside], [])
                tokens, _ = greedy(step_fn(kind, module(kind, torch.float32)))
                self.assertEqual(run_in_executorch(data, PROMPT, STEPS), tokens)

    def test_qwen3_phi3_gemma_and_mistral_are_delegated_whole_and_give_eager_tokens_in_executorch(self) -> None:
        # Qwen3's per-head q/k norms, Phi-3's fused qkv_proj and gate_up_proj (split), Gemma's (1 + w) norms
        # and tanh-GeLU MLP, Mistral's sliding-window mask (a window longer than the cache).
        self.check_tokens(("qwen3", "phi3", "gemma", "mistral"))

    def test_layer_norm_families_are_delegated_whole_and_give_eager_tokens_in_executorch(self) -> None:
        # Issue 46: LayerNorm with biases (native_layer_norm), partial rotary embeddings, parallel attention + MLP
        # residuals, gelu_new's pow(x, 3), a padding index (Phi's pad_token_id 5), GPT-2's learned positions and
        # fused c_attn; random biases and gains, so a dropped one changes the tokens.
        self.check_tokens(("phi", "stablelm", "neox", "gpt2", "starcoder2", "falcon"))


@unittest.skipUnless(have_packer(), "delegate-pack not found (set KV_DELEGATE_PACK)")
class InterleavedRopeTest(unittest.TestCase):
    def test_the_interleaved_rope_form_is_delegated_whole_and_runs_with_eager_tokens(self) -> None:
        from kv_delegate.llama_style import CONFIG, LlamaStyle, greedy
        from test_partitioner import PROMPT, STEPS, export as export_module

        model = LlamaStyle({**CONFIG, "rope_interleaved": 1}).eval()
        tokens = greedy(model, PROMPT, STEPS)
        pte, partitioner, ops = export_module(model)
        self.assertEqual([str(o) for o in partitioner.unsupported()], [])
        self.assertEqual(sum(op.endswith("executorch_call_delegate") for op in ops), 1)
        self.assertEqual(run_in_executorch(pte, PROMPT, STEPS), tokens)


if __name__ == "__main__":
    unittest.main()
