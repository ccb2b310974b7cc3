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

    def test_qwen3_phi3_gemma_and_mistral_are_delegated_whole_and_give_eager_tokens_in_executorch(self) -> None:
        # Qwen3's per-head q/k norms, Phi-3's fused qkv_proj and gate_up_proj (split), Gemma's (1 + w) norms
        # and tanh-GeLU MLP, Mistral's sliding-window mask (a window longer than the cache).
        import json
        import subprocess
        import tempfile
        from pathlib import Path

        from kv_delegate.export_real import PROMPT, STEPS, greedy, module, step_fn
        from test_partitioner import et_run

        tool = et_run()
        for kind in ("qwen3", "phi3", "gemma", "mistral"):
            with self.subTest(kind):
                data, outside = export(kind, torch.float32)
                self.assertEqual([str(o) for o in outside], [])
                tokens, _ = greedy(step_fn(kind, module(kind, torch.float32)))
                if tool is None:
                    continue
                with tempfile.TemporaryDirectory() as tmp:
                    path = Path(tmp) / f"{kind}.pte"
                    path.write_bytes(data)
                    prompt = ",".join(map(str, PROMPT))
                    done = subprocess.run([str(tool), str(path), "--prompt", prompt, "--steps", str(STEPS), "--json"],
                                          capture_output=True, text=True, timeout=300)
                    self.assertEqual(done.returncode, 0, done.stderr[-2000:])
                    self.assertEqual(json.loads(done.stdout)["tokens"], tokens)

    def test_layer_norm_families_are_delegated_whole_and_give_eager_tokens_in_executorch(self) -> None:
        # Issue 46: LayerNorm with biases (native_layer_norm), partial rotary embeddings, parallel attention + MLP
        # residuals, gelu_new's pow(x, 3), a padding index (Phi's pad_token_id 5), GPT-2's learned positions and
        # fused c_attn; random biases and gains, so a dropped one changes the tokens.
        import json
        import subprocess
        import tempfile
        from pathlib import Path

        from kv_delegate.export_real import PROMPT, STEPS, greedy, module, step_fn
        from test_partitioner import et_run

        tool = et_run()
        if tool is None:
            self.skipTest("et-run not built (cargo build -p executorch-bridge --bin et-run)")
        for kind in ("phi", "stablelm", "neox", "gpt2", "starcoder2", "falcon"):
            with self.subTest(kind):
                data, outside = export(kind, torch.float32)
                self.assertEqual([str(o) for o in outside], [])
                tokens, _ = greedy(step_fn(kind, module(kind, torch.float32)))
                with tempfile.TemporaryDirectory() as tmp:
                    path = Path(tmp) / f"{kind}.pte"
                    path.write_bytes(data)
                    prompt = ",".join(map(str, PROMPT))
                    done = subprocess.run([str(tool), str(path), "--prompt", prompt, "--steps", str(STEPS), "--json"],
                                          capture_output=True, text=True, timeout=300)
                    self.assertEqual(done.returncode, 0, done.stderr[-2000:])
                    self.assertEqual(json.loads(done.stdout)["tokens"], tokens)


if __name__ == "__main__":
    unittest.main()


@unittest.skipUnless(have_packer(), "delegate-pack not found (set KV_DELEGATE_PACK)")
class InterleavedRopeTest(unittest.TestCase):
    def test_the_interleaved_rope_form_is_delegated_whole_and_runs_with_eager_tokens(self) -> None:
        import tempfile
        from pathlib import Path

        from kv_delegate.llama_style import CONFIG, LlamaStyle, greedy
        from test_partitioner import PROMPT, STEPS, export, run_in_executorch

        model = LlamaStyle({**CONFIG, "rope_interleaved": 1}).eval()
        tokens = greedy(model, PROMPT, STEPS)
        pte, partitioner, ops = export(model)
        self.assertEqual([str(o) for o in partitioner.unsupported()], [])
        self.assertEqual(sum(op.endswith("executorch_call_delegate") for op in ops), 1)
        with tempfile.TemporaryDirectory() as tmp:
            self.assertEqual(run_in_executorch(pte, Path(tmp)), tokens)
