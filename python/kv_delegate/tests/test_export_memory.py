"""``python -m kv_delegate export-hf`` fits the machines users have (issue 47 item 1): exporting a checkpoint
peaks under twice its weights, beyond what exporting a checkpoint of no size takes, counting the packer
(``delegate-pack``, a process of its own that the export runs while it holds its own memory) with the export.

Each export runs in a child process and its peak resident memory is the one its last line reports (its own
``ru_maxrss``); the packer's is the one the line before reports (measured by ``kv_delegate.pack`` as the
packer's own ``ru_maxrss``). Their sum bounds what the two hold at any moment. Linux starts a process's ``ru_maxrss`` at its parent's peak when it was forked, so the export is
started through a small launcher (:data:`LAUNCHER`, a Python that imports nothing), not from this test's
process, which holds torch and the models. The allowance is measured in the same test: the
peak of exporting the same architecture with weights of a few KiB (the interpreter, torch, transformers,
ExecuTorch and the export's own graphs). The model under test is the same architecture with a 64 MiB embedding
(bf16, tied to the output projection), so that a copy of the weights anywhere in the export (torch.export's
clones, ExecuTorch's copy of the program for ``preprocess``, the lowering's constant section, the blob, the
program's bytes) shows as 64 MiB or more."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path
from typing import Tuple

import torch

from kv_delegate.pack import have_packer

PACKAGE_DIR = Path(__file__).resolve().parents[1]
MIB = 1 << 20
#: The model under test: a 32768 x 1024 bf16 embedding (64 MiB) tied to the output projection, one layer.
LARGE = dict(vocab_size=32768, hidden_size=1024, intermediate_size=256, num_attention_heads=16,
             num_key_value_heads=4)
#: Runs its arguments as a command and exits with its status: the export's parent, whose peak is a few MiB.
LAUNCHER = "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))"
#: The same architecture with weights of a few KiB: what an export takes without weights.
SMALL = dict(vocab_size=128, hidden_size=64, intermediate_size=32, num_attention_heads=1, num_key_value_heads=1)


def save_checkpoint(folder: Path, sizes: dict) -> int:
    """A seeded bf16 Llama of ``sizes`` saved by ``save_pretrained``; the bytes of its weights (tied ones
    counted once)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(47)
    config = LlamaConfig(**sizes, num_hidden_layers=1, max_position_embeddings=64, tie_word_embeddings=True)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()}
    return sum(storages.values())


def export_peak(folder: Path, out: Path) -> Tuple[int, int, str]:
    """Runs ``export-hf`` on ``folder`` in a child process: the peak resident bytes it reports for itself and
    for the packer, and its output."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PACKAGE_DIR),
                                                                      os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "kv_delegate", "export-hf", str(folder), "--dtype", "bf16", "--max-len", "16",
               "--out", str(out)]
    done = subprocess.run([sys.executable, "-S", "-c", LAUNCHER, *command], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise AssertionError(f"export-hf {folder} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    found = re.search(r"peak memory (\d+) MiB", done.stdout.strip().splitlines()[-1])
    if found is None:
        raise AssertionError(f"export-hf {folder}: no peak memory on its last line:\n{done.stdout}")
    packer = re.search(r"^the packer's peak memory (\d+) MiB$", done.stdout, re.MULTILINE)
    if packer is None:
        raise AssertionError(f"export-hf {folder}: no packer's peak memory reported:\n{done.stdout}")
    return int(found.group(1)) * MIB, int(packer.group(1)) * MIB, done.stdout


@unittest.skipUnless(have_packer(), "delegate-pack not built (set KV_DELEGATE_PACK)")
@unittest.skipUnless(sys.platform.startswith("linux"), "export-hf reads ru_maxrss in KiB, as Linux reports it")
class ExportMemory(unittest.TestCase):
    def test_export_and_packer_peak_under_twice_the_weights_beyond_an_empty_models_export(self) -> None:
        with tempfile.TemporaryDirectory(prefix="kv_export_memory_") as tmp:
            work = Path(tmp)
            weights = save_checkpoint(work / "large", LARGE)
            save_checkpoint(work / "small", SMALL)
            self.assertGreaterEqual(weights, 64 * MIB)
            baseline, packer_baseline, _ = export_peak(work / "small", work / "small.pte")
            peak, packer, output = export_peak(work / "large", work / "large.pte")
            self.assertGreater((work / "large.pte").stat().st_size, weights)  # the weights are in the program
            self.assertGreater(packer_baseline, 0, "the packer's peak is measured")
            added, packer_added = peak - baseline, packer - packer_baseline
            self.assertLess(added + packer_added, 2 * weights,
                            f"exporting {weights / MIB:.0f} MiB of weights peaked at {peak / MIB:.0f} MiB and its "
                            f"packer at {packer / MIB:.0f} MiB, together {(added + packer_added) / MIB:.0f} MiB "
                            f"over an empty model's export ({baseline / MIB:.0f} + {packer_baseline / MIB:.0f} MiB): "
                            f"{(added + packer_added) / weights:.1f}x the weights\n{output}")
            self.assertLess(packer_added, weights / 4,
                            f"the packer peaked at {packer / MIB:.0f} MiB packing {weights / MIB:.0f} MiB of weights, "
                            f"{packer_added / MIB:.0f} MiB over an empty model's ({packer_baseline / MIB:.0f} MiB): it "
                            f"holds the weights instead of copying them from its constants file\n{output}")


if __name__ == "__main__":
    unittest.main()
