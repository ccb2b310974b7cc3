"""``kv_delegate.export_bench`` (issue 45 item 3): the hollow lowering gives the very description a full export
gives (ops, tensors, bindings, every constant at the same offset and size), keeping the bytes of the small
constants and not holding the large ones; the GPU bench fills those from a seed."""

from __future__ import annotations

import unittest

import torch

from kv_delegate import export_bench
from kv_delegate.export_real import HF_SIZES, MAX_LEN, SEED, with_static_cache
from kv_delegate.pack import have_packer


def tiny_llama() -> torch.nn.Module:
    """export_real's seeded tiny Llama (tied embeddings, grouped-query attention) in bf16."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    model = LlamaForCausalLM(LlamaConfig(**HF_SIZES, tie_word_embeddings=True)).to(torch.bfloat16).eval()
    return with_static_cache(model, MAX_LEN)


@unittest.skipUnless(have_packer(), "delegate-pack not built (set KV_DELEGATE_PACK)")
class HollowLowering(unittest.TestCase):
    def test_hollow_description_is_the_full_exports_without_the_large_constants(self) -> None:
        model = tiny_llama()
        full, full_outside = export_bench.lower_decode(model, hollow=False)
        keep_max = export_bench.KEEP_MAX
        export_bench.KEEP_MAX = 1024  # the tiny model's matrices (8 KiB and more) go hollow, its norms (128 B) stay
        try:
            hollow, outside = export_bench.lower_decode(model, hollow=True)
        finally:
            export_bench.KEEP_MAX = keep_max
        self.assertEqual(outside, full_outside)
        self.assertEqual(hollow.description.json(), full.description.json())
        self.assertEqual([(b.name, b.role) for b in hollow.bindings], [(b.name, b.role) for b in full.bindings])
        kept = export_bench.kept_hex(hollow.description)
        data = bytes(full.description.data)
        hollow_names = []
        for c in full.description.constants:
            raw = data[c["offset"]:c["offset"] + c["nbytes"]]
            if c["nbytes"] > 1024:
                self.assertNotIn(c["tensor"], kept)
                hollow_names.append(c["tensor"])
            else:
                self.assertEqual(kept.get(c["tensor"]), raw.hex(), c["tensor"])
        self.assertIn("inner.model.model.embed_tokens.weight", hollow_names)
        self.assertEqual(len(hollow_names), 7 * HF_SIZES["num_hidden_layers"] + 1)
        # Nothing of the large constants is held: the hollow section stores only the kept bytes.
        held = sum(len(raw) for raw in hollow.description.data.kept.values())
        self.assertLess(held, sum(c["nbytes"] for c in full.description.constants if c["nbytes"] <= 1024) + 1024)


if __name__ == "__main__":
    unittest.main()
