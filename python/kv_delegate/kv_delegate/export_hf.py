"""A Hugging Face checkpoint folder to a program, in one command (issue 47):

    python -m kv_delegate export-hf DIR --backend cuda|reference --dtype f32|f16|bf16 --max-len N [--prefill-chunk T]
        --out model.pte

``DIR`` is a local checkpoint folder as ``save_pretrained`` writes it (``config.json``, ``*.safetensors``, the
tokenizer files); nothing is fetched from the hub. The model is loaded once with transformers in ``--dtype`` and
exported with transformers' own ExecuTorch recipe (``TorchExportableModuleWithStaticCache``: a StaticCache of
``--max-len`` positions, ``forward(input_ids i64 [1, 1], cache_position i64 [1]) -> logits [1, 1, vocab]``),
also returning the greedy next token (:class:`~kv_delegate.export_real.WithNextToken`). With ``--prefill-chunk T``
the program has two methods over the same caches (:mod:`kv_delegate.methods`): ``prefill(input_ids [1, T],
cache_position [1])`` (the first token's position), which takes a prompt ``T`` tokens a call, and ``decode``, the
one-token method; a runtime decodes the prompt's last tokens short of a chunk. Exported with the project's
partitioner and :class:`~kv_delegate.planning.KvAliasMemoryPlanningPass`, as ``export_real.py`` exports its
fixtures. It prints what stayed outside the delegate, copies ``tokenizer.json``, ``tokenizer_config.json``,
``chat_template.jinja`` (where transformers 4.48 and later save the chat template) and ``generation_config.json``
(those present) beside the program, and ends with the packer's peak memory (a
process of its own, run while the export holds its memory: the two together peak at most at the sum), then the
time and this process's peak memory next to the weights' size and the memory once they are loaded.
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Callable, List, Optional, Sequence, Tuple

if TYPE_CHECKING:  # imported where used, so that the command's clock includes importing torch
    import torch

#: ``--dtype`` names (as ``export_real.DTYPES``; repeated so that ``--help`` needs no executorch import).
DTYPE_NAMES = ("f32", "f16", "bf16")
#: The files copied from the checkpoint beside the program, when present.
SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")
MIB = 1 << 20


class CheckpointError(ValueError):
    """The checkpoint folder or the options cannot give a program; the message says what and where."""


def check_folder(folder: Path) -> None:
    """Refuse a ``folder`` that is not a checkpoint folder, naming what is missing."""
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: not a directory (expected a checkpoint folder with config.json)")
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"{folder}: no config.json (expected a folder written by save_pretrained)")


def load(folder: Path, dtype: torch.dtype, max_len: int) -> torch.nn.Module:
    """The checkpoint in ``dtype`` (weights loaded once, from local files only), set up for transformers'
    StaticCache export recipe with ``max_len`` positions, as ``export_real.hf_model`` sets up its models."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    check_folder(folder)
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, local_files_only=True)
    except (OSError, ValueError, KeyError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{folder}: transformers cannot load it as a causal LM: {first}") from e
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is not None and max_len > limit:
        raise CheckpointError(f"--max-len {max_len}: the checkpoint's max_position_embeddings is {limit}")
    from .export_real import with_static_cache

    return with_static_cache(model.eval(), max_len)


def weights_bytes(model: torch.nn.Module) -> int:
    """The bytes of ``model``'s parameters and buffers, each storage counted once (tied weights share one)."""
    seen = {}
    for tensor in list(model.parameters()) + list(model.buffers()):
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def export_decode(model: torch.nn.Module, backend: str, out: Path,
                  prefill_chunk: Optional[int] = None) -> List[object]:
    """Writes ``model``'s decode method (StaticCache recipe, greedy next token) as a program to ``out`` for
    ``backend`` (``reference`` or ``cuda``), streamed to the file; with ``prefill_chunk`` also a ``prefill``
    method of that many tokens a call over the same caches (:mod:`kv_delegate.methods`). Returns what the
    partitioner left outside."""
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    from .export_real import WithNextToken
    from .methods import method_rows, to_program
    from .partitioner import CudaPartitioner, ReferencePartitioner

    module = WithNextToken(TorchExportableModuleWithStaticCache(model).eval()).eval()
    partitioner = (CudaPartitioner if backend == "cuda" else ReferencePartitioner)(
        output_names=["logits", "next_token"])
    program = to_program(module, method_rows(prefill_chunk), partitioner)
    write_atomically(out, program.write_to_file)
    return partitioner.unsupported()


def write_atomically(out: Path, write: Callable[[BinaryIO], None]) -> None:
    """Calls ``write(file)`` on a temporary file beside ``out``, then renames it to ``out``: a failed export
    leaves no partial program behind."""
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # as open() would create it (mkstemp's file is 0600)
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, out)
    except BaseException:
        os.unlink(tmp)
        raise


def copy_side_files(folder: Path, dest: Path) -> List[str]:
    """Copies :data:`SIDE_FILES` present in ``folder`` to ``dest``; the names copied (or already there)."""
    copied = []
    for name in SIDE_FILES:
        src = folder / name
        if src.is_file():
            if not (dest / name).exists() or not (dest / name).samefile(src):
                shutil.copyfile(src, dest / name)
            copied.append(name)
    return copied


def peak_rss_mib() -> float:
    """This process's peak resident memory so far (Linux reports ``ru_maxrss`` in KiB). The packer
    (``delegate-pack``, a child process) is not counted: it is measured on its own
    (:func:`~kv_delegate.pack.packer_peak_bytes`), as a child's ``ru_maxrss`` would repeat this figure."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m kv_delegate export-hf", description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", type=Path, help="the checkpoint folder (config.json, *.safetensors, tokenizer files)")
    ap.add_argument("--backend", choices=("reference", "cuda"), default="reference",
                    help="the delegate the program is for (default: reference, the CPU delegate)")
    ap.add_argument("--dtype", choices=DTYPE_NAMES, default="f32", help="weights, caches and activations")
    ap.add_argument("--max-len", type=int, required=True, help="positions the caches hold (prompt + generation)")
    ap.add_argument("--prefill-chunk", type=int, metavar="T",
                    help="also export a method 'prefill' taking T prompt tokens a call over the same caches (the "
                         "decode method is then 'decode'; a prompt's last tokens short of a chunk are decoded)")
    ap.add_argument("--out", type=Path, required=True, help="the program to write (.pte)")
    return ap


def run(args: argparse.Namespace) -> Tuple[int, List[object], List[str]]:
    """Exports as ``args`` say; the program's size, what stayed outside and the side files copied."""
    from .export_real import DTYPES

    if args.max_len < 1:
        raise CheckpointError(f"--max-len {args.max_len}: must be at least 1")
    if args.prefill_chunk is not None and not 2 <= args.prefill_chunk <= args.max_len:
        raise CheckpointError(f"--prefill-chunk {args.prefill_chunk}: must be at least 2 and at most --max-len "
                              f"({args.max_len})")
    if not args.out.parent.is_dir():
        raise CheckpointError(f"--out {args.out}: directory {args.out.parent} does not exist")
    model = load(args.dir, DTYPES[args.dtype], args.max_len)
    args.weights_mib, args.loaded_mib = weights_bytes(model) / MIB, peak_rss_mib()
    outside = export_decode(model, args.backend, args.out, args.prefill_chunk)
    return args.out.stat().st_size, outside, copy_side_files(args.dir, args.out.parent)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    for noisy in ("executorch", "torch", "transformers", "kv_delegate"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    start = time.monotonic()
    try:
        size, outside, copied = run(args)
    except CheckpointError as e:
        print(f"kv_delegate export-hf: error: {e}", file=sys.stderr)
        return 2
    for o in outside:
        print(f"outside the delegate: {o}")
    if not outside:
        print("nothing left outside the delegate")
    print(f"copied beside the program: {', '.join(copied) if copied else 'no tokenizer or generation files'}")
    from .pack import packer_peak_bytes

    print(f"the packer's peak memory {packer_peak_bytes() / MIB:.0f} MiB")
    print(f"wrote {args.out} ({size} bytes) in {time.monotonic() - start:.1f} s, "
          f"peak memory {peak_rss_mib():.0f} MiB (weights {args.weights_mib:.1f} MiB, "
          f"{args.loaded_mib:.0f} MiB once loaded)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
