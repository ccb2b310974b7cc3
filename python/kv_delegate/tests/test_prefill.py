"""Prefill in chunks (issue 45 item 4): ``export-hf --prefill-chunk T`` writes a program with a method ``prefill``
(``input_ids [1, T]``, ``cache_position [1]``) beside ``decode``, both over the same caches and each one delegate
call with nothing outside, and the reference delegate (the oracle), fed a prompt in chunks of ``T`` through
``prefill`` and the tokens short of a chunk through ``decode``, gives torch eager's tokens of token-by-token
prefill."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import tempfile
import unittest
from pathlib import Path
from typing import Dict, List, Tuple

import torch

from kv_delegate.export_real import MAX_LEN, step_fn
from kv_delegate.generate import greedy, one_token
from kv_delegate.pack import have_packer
from test_export_hf import delegate_host, export_hf, tiny_llama

#: The prefill method's tokens a call, and the decode steps after the prompt.
CHUNK = 4
STEPS = 6


def eager(model: torch.nn.Module, prompt: List[int]) -> List[int]:
    """Torch eager on transformers' StaticCache recipe, the prompt one token a call: its next token, then
    :data:`STEPS` greedy steps."""
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    model.generation_config.cache_implementation = "static"
    step = step_fn("llama", TorchExportableModuleWithStaticCache(model, batch_size=1, max_cache_len=MAX_LEN).eval())
    return greedy(one_token(step), prompt, STEPS)[0]


def methods(pte: Path) -> Dict[str, Tuple[List[List[int]], int, List[str]]]:
    """Each method of ``pte``: its inputs' shapes, its delegate calls and its other instructions' operators."""
    from executorch.exir._serialize._program import deserialize_pte_binary
    from executorch.exir.schema import DelegateCall, KernelCall

    program = deserialize_pte_binary(pte.read_bytes()).program
    found = {}
    for plan in program.execution_plan:
        instructions = [i.instr_args for i in plan.chains[0].instructions]
        kernels = [plan.operators[i.op_index].name for i in instructions if isinstance(i, KernelCall)]
        found[plan.name] = ([list(plan.values[i].val.sizes) for i in plan.inputs],
                            sum(isinstance(i, DelegateCall) for i in instructions), kernels)
    return found


@unittest.skipUnless(have_packer(), "delegate-pack not found (set KV_DELEGATE_PACK)")
@unittest.skipUnless(importlib.util.find_spec("transformers"), "transformers is not installed")
class PrefillChunkTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.TemporaryDirectory(prefix="kv_delegate_prefill_")
        cls.checkpoint = Path(cls.tmp.name) / "checkpoint"
        cls.model = tiny_llama()
        cls.model.save_pretrained(cls.checkpoint)
        cls.out = Path(cls.tmp.name) / "model.pte"
        cls.done = export_hf(str(cls.checkpoint), "--max-len", str(MAX_LEN), "--prefill-chunk", str(CHUNK),
                             "--out", str(cls.out))

    @classmethod
    def tearDownClass(cls) -> None:
        cls.tmp.cleanup()

    def exported(self) -> None:
        self.assertEqual(self.done.returncode, 0, self.done.stderr[-3000:])

    def test_the_program_has_prefill_and_decode_each_one_delegate_call_over_the_same_caches(self) -> None:
        self.exported()
        self.assertIn("nothing left outside the delegate", self.done.stdout.splitlines())
        found = methods(self.out)
        self.assertEqual(sorted(found), ["decode", "prefill"])
        # Inputs: the caches' counters and caches (mutable buffers), then input_ids and cache_position.
        self.assertEqual(found["prefill"][0][-2:], [[1, CHUNK], [1]])
        self.assertEqual(found["decode"][0][-2:], [[1, 1], [1]])
        for name, (_, calls, kernels) in found.items():
            with self.subTest(name):
                self.assertEqual(calls, 1, "one delegate call")
                self.assertEqual(kernels, [], "no copy of a cache and no kernel outside the delegate")

    def test_the_reference_delegate_gives_eager_tokens_for_chunks_and_a_tail(self) -> None:
        host = delegate_host()
        if host is None:
            self.skipTest("delegate-host not built (cargo build -p delegate-host, or set KV_DELEGATE_HOST)")
        self.exported()
        long = [(i * 29 + 3) % 128 for i in range(11)]
        # Two chunks and a tail of 3 (taken as the last chunk again); one chunk exactly; shorter than a chunk
        # (decode alone, a token a call).
        for prompt in (long, long[:CHUNK], long[:3]):
            with self.subTest(len(prompt)):
                done = subprocess.run([str(host), "run", str(self.out), "--prompt-ids", ",".join(map(str, prompt)),
                                       "--steps", str(STEPS), "--json"], capture_output=True, text=True)
                self.assertEqual(done.returncode, 0, done.stderr)
                report = json.loads(done.stdout)
                self.assertEqual(report["tokens"], eager(self.model, prompt))
                calls = len(prompt) if len(prompt) < CHUNK else -(-len(prompt) // CHUNK)
                self.assertEqual(report["stats"]["prefill_calls"], calls)

    def test_a_chunk_of_one_token_or_longer_than_the_caches_is_refused(self) -> None:
        for chunk in ("1", str(MAX_LEN + 1)):
            with self.subTest(chunk), tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) / "model.pte"
                done = export_hf(str(self.checkpoint), "--max-len", str(MAX_LEN), "--prefill-chunk", chunk,
                                 "--out", str(out))
                self.assertEqual(done.returncode, 2, done.stderr[-2000:])
                self.assertEqual(done.stderr.strip(), f"kv_delegate export-hf: error: --prefill-chunk {chunk}: must "
                                                      f"be at least 2 and at most --max-len ({MAX_LEN})")
                self.assertFalse(out.exists())


if __name__ == "__main__":
    unittest.main()
