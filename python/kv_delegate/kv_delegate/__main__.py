"""``python -m kv_delegate COMMAND ...``: the package's commands.

- ``export-hf DIR --backend cuda|reference --dtype f32|f16|bf16 --max-len N [--prefill-chunk T] --out model.pte``:
  a Hugging Face checkpoint folder to a program (:mod:`kv_delegate.export_hf`).
"""

from __future__ import annotations

import sys
from importlib import import_module
from typing import List, Optional

#: Command name -> (module whose ``main(argv)`` runs it, what it does).
COMMANDS = {"export-hf": ("kv_delegate.export_hf", "a Hugging Face checkpoint folder to a program")}
USAGE = "usage: python -m kv_delegate COMMAND ...\ncommands:\n" + "".join(
    f"  {name}: {what}\n" for name, (_, what) in COMMANDS.items())


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["-h"], ["--help"]):
        print(USAGE, end="")
        return 0
    if not argv or argv[0] not in COMMANDS:
        got = f"unknown command {argv[0]!r}" if argv else "no command given"
        print(f"{USAGE}python -m kv_delegate: error: {got}", file=sys.stderr)
        return 2
    return import_module(COMMANDS[argv[0]][0]).main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
