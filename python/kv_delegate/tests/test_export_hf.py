"""``python -m kv_delegate export-hf`` (issue 47 item 1): a checkpoint folder written by ``save_pretrained`` (a
tiny Llama with seeded random weights and a BPE ``tokenizer.json`` trained here) becomes a program in one
command, delegated whole, with the tokenizer and generation files beside it, and ``delegate-host`` running it
gives eager's greedy tokens of the same model."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path
from typing import List, Optional

import torch

from kv_delegate.export_real import HF_SIZES, MAX_LEN, PROMPT, SEED, greedy, step_fn
from kv_delegate.pack import have_packer

PACKAGE_DIR = Path(__file__).resolve().parents[1]
REPO = Path(__file__).resolve().parents[3]
#: Decode steps run in ``delegate-host`` (after the prompt's own next token).
STEPS = 8
CORPUS = ["the cat sat on the mat", "a dog ran to the park", "the sun is warm and the sky is blue",
          "café, naïve, 東京 and ünïcödé"] * 4
#: A chat template in the tokenizer's own special tokens; transformers 4.48 and later save it as
#: ``chat_template.jinja`` beside ``tokenizer_config.json``.
CHAT_TEMPLATE = ("{% for m in messages %}{{ bos_token }}{{ m['role'] }} {{ m['content'] }}{{ eos_token }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ bos_token }}assistant {% endif %}")


def have_tokenizers() -> bool:
    return importlib.util.find_spec("tokenizers") is not None


def delegate_host() -> Optional[Path]:
    """``$KV_DELEGATE_HOST``, else ``delegate-host`` in ``$CARGO_TARGET_DIR/debug`` or ``target/debug``."""
    if os.environ.get("KV_DELEGATE_HOST"):
        return Path(os.environ["KV_DELEGATE_HOST"])
    target = Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")
    path = target / "debug" / "delegate-host"
    return path if path.is_file() else None


def tiny_llama() -> torch.nn.Module:
    """The seeded tiny Llama (export_real's sizes, untied lm_head) in f32."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    return LlamaForCausalLM(LlamaConfig(**HF_SIZES, tie_word_embeddings=False)).eval()


def save_tokenizer(folder: Path) -> None:
    """A small BPE (byte fallback, multi-byte characters in its corpus) trained here, saved as transformers
    saves a fast tokenizer: ``tokenizer.json`` and ``tokenizer_config.json``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=HF_SIZES["vocab_size"],
                                                        special_tokens=["<unk>", "<s>", "</s>"]))
    assert tok.get_vocab_size() <= HF_SIZES["vocab_size"]
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                            chat_template=CHAT_TEMPLATE).save_pretrained(folder)


def eager_tokens(model: torch.nn.Module) -> List[int]:
    """The run protocol in eager on ``model`` (transformers' StaticCache recipe): the prompt's next token, then
    :data:`STEPS` greedy steps."""
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    model.generation_config.cache_implementation = "static"
    module = TorchExportableModuleWithStaticCache(model, batch_size=1, max_cache_len=MAX_LEN).eval()
    return greedy(step_fn("llama", module))[0][:1 + STEPS]


def export_hf(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PACKAGE_DIR),
                                                                      os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "kv_delegate", "export-hf", *args], capture_output=True,
                          text=True, env=env)


@unittest.skipUnless(have_packer(), "delegate-pack not found (set KV_DELEGATE_PACK)")
@unittest.skipUnless(importlib.util.find_spec("transformers"), "transformers is not installed")
class ExportHfTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.TemporaryDirectory(prefix="kv_delegate_export_hf_")
        cls.checkpoint = Path(cls.tmp.name) / "checkpoint"
        model = tiny_llama()
        model.save_pretrained(cls.checkpoint)
        # As a checkpoint from the hub has it (Llama-3.2's): the generation config names the special tokens and
        # leaves `use_cache` unset, where `save_pretrained` of a model writes the model config's `true`.
        (cls.checkpoint / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
        if have_tokenizers():
            save_tokenizer(cls.checkpoint)
        cls.eager = eager_tokens(model)
        cls.out = Path(cls.tmp.name) / "program" / "model.pte"
        cls.out.parent.mkdir()
        cls.done = export_hf(str(cls.checkpoint), "--backend", "reference", "--dtype", "f32", "--max-len",
                             str(MAX_LEN), "--out", str(cls.out))

    @classmethod
    def tearDownClass(cls) -> None:
        cls.tmp.cleanup()

    def exported(self) -> List[str]:
        self.assertEqual(self.done.returncode, 0, self.done.stderr[-3000:])
        return self.done.stdout.strip().splitlines()

    def test_a_save_pretrained_folder_becomes_a_program_delegated_whole(self) -> None:
        lines = self.exported()
        self.assertIn("nothing left outside the delegate", lines)
        self.assertEqual(self.out.read_bytes()[4:8], b"ET12", "a .pte")
        self.assertRegex(lines[-1], rf"^wrote {self.out} \({self.out.stat().st_size} bytes\) in [0-9.]+ s, "
                                    r"peak memory [0-9]+ MiB \(weights [0-9.]+ MiB, [0-9]+ MiB once loaded\)$")
        self.assertEqual([p.name for p in self.out.parent.glob(".model.pte.*")], [], "no temporary file left")

    def test_the_tokenizer_and_generation_files_are_copied_beside_the_program(self) -> None:
        if not have_tokenizers():
            self.skipTest("the tokenizers package is not installed: no tokenizer.json to copy")
        self.exported()
        names = ["tokenizer.json", "tokenizer_config.json", "generation_config.json"]
        # Where the chat template is saved depends on the transformers version: a file of its own, or the config.
        if (self.checkpoint / "chat_template.jinja").is_file():
            names.append("chat_template.jinja")
        else:
            self.assertIn("chat_template", json.loads((self.checkpoint / "tokenizer_config.json").read_text()))
        for name in names:
            with self.subTest(name):
                self.assertEqual((self.out.parent / name).read_bytes(), (self.checkpoint / name).read_bytes())
        self.assertEqual(json.loads((self.out.parent / "generation_config.json").read_text())["eos_token_id"], 2)

    def test_delegate_host_runs_the_program_with_eager_greedy_tokens(self) -> None:
        host = delegate_host()
        if host is None:
            self.skipTest("delegate-host not built (cargo build -p delegate-host, or set KV_DELEGATE_HOST)")
        self.exported()
        usage = subprocess.run([str(host), "run", "--help"], capture_output=True, text=True).stdout
        flag = "--prompt-ids" if "--prompt-ids" in usage else "--prompt"
        done = subprocess.run([str(host), "run", str(self.out), flag, ",".join(map(str, PROMPT)), "--steps",
                               str(STEPS), "--json"], capture_output=True, text=True)
        self.assertEqual(done.returncode, 0, done.stderr)
        report = json.loads(done.stdout)
        # "ids" where delegate-host reads the tokenizer beside the program (issue 47 item 2), else "tokens".
        self.assertEqual(report.get("ids", report.get("tokens")), self.eager)

    def test_delegate_host_chats_with_the_checkpoints_template_as_transformers_renders_it(self) -> None:
        host = delegate_host()
        if host is None:
            self.skipTest("delegate-host not built (cargo build -p delegate-host, or set KV_DELEGATE_HOST)")
        if not have_tokenizers():
            self.skipTest("the tokenizers package is not installed: no tokenizer.json to chat with")
        self.exported()
        from transformers import AutoTokenizer

        user = "the cat sat on the mat"
        expected = AutoTokenizer.from_pretrained(self.checkpoint).apply_chat_template(
            [{"role": "user", "content": user}], add_generation_prompt=True, tokenize=True)
        # transformers 5 returns a BatchEncoding (a mapping) here, 4.x the list of ids.
        expected = expected["input_ids"] if hasattr(expected, "keys") else expected
        done = subprocess.run([str(host), "run", str(self.out), "--chat", "--user", user, "--max-new-tokens", "3",
                               "--json"], capture_output=True, text=True)
        self.assertEqual(done.returncode, 0, done.stderr)
        report = json.loads(done.stdout)
        self.assertEqual(report["prompt_ids"], list(expected), "the prompt as transformers' apply_chat_template")
        self.assertLessEqual(len(report["ids"]), 3)

    def test_a_folder_without_config_json_is_refused_in_one_line_and_writes_nothing(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "model.pte"
            done = export_hf(tmp, "--max-len", "8", "--out", str(out))
            self.assertEqual(done.returncode, 2)
            self.assertEqual(done.stderr.strip(), f"kv_delegate export-hf: error: {tmp}: no config.json "
                                                  "(expected a folder written by save_pretrained)")
            self.assertFalse(out.exists())

    def test_a_max_len_beyond_the_checkpoint_positions_is_refused(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "model.pte"
            done = export_hf(str(self.checkpoint), "--max-len", str(MAX_LEN + 1), "--out", str(out))
            self.assertEqual(done.returncode, 2, done.stderr[-2000:])
            self.assertIn(f"--max-len {MAX_LEN + 1}: the checkpoint's max_position_embeddings is {MAX_LEN}",
                          done.stderr)
            self.assertFalse(out.exists())

    def test_bf16_for_the_cuda_delegate_is_delegated_whole(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "model.pte"
            done = export_hf(str(self.checkpoint), "--backend", "cuda", "--dtype", "bf16", "--max-len",
                             str(MAX_LEN), "--out", str(out))
            self.assertEqual(done.returncode, 0, done.stderr[-3000:])
            self.assertIn("nothing left outside the delegate", done.stdout.splitlines())
            self.assertEqual(out.read_bytes()[4:8], b"ET12", "a .pte")


if __name__ == "__main__":
    unittest.main()
