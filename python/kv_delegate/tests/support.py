"""What the tests share: the tools they run (the packer, ``et-run``), running a ``.pte`` in ExecuTorch's runtime,
and a lowering with one rule removed.

``et-run`` is ``$KV_ET_RUN`` (which must then exist: ``cargo xtask test`` sets it), else
``$CARGO_TARGET_DIR/debug/et-run`` or ``target/debug/et-run`` (``cargo build -p executorch-bridge --bin et-run``);
without one a check that runs a program is skipped, visibly, and fails under ``KV_DELEGATE_TESTS_STRICT=1``
(``conftest.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
import unittest
from pathlib import Path
from typing import Iterator, List, Optional, Sequence

ROOT = Path(__file__).resolve().parents[3]
#: Environment variable naming ``et-run``.
ET_RUN_ENV = "KV_ET_RUN"


def et_run() -> Optional[Path]:
    """ExecuTorch's runtime with our delegates: ``et-run``, if built (``$KV_ET_RUN`` must exist when set)."""
    named = os.environ.get(ET_RUN_ENV)
    if named:
        if not Path(named).is_file():
            raise AssertionError(f"{ET_RUN_ENV}={named} is not a file")
        return Path(named)
    candidates = []
    if os.environ.get("CARGO_TARGET_DIR"):
        candidates.append(Path(os.environ["CARGO_TARGET_DIR"]) / "debug" / "et-run")
    candidates.append(ROOT / "target" / "debug" / "et-run")
    return next((c for c in candidates if c.is_file()), None)


def require_et_run() -> Path:
    """:func:`et_run`, or the calling test skipped (visibly) when it is not built."""
    tool = et_run()
    if tool is None:
        raise unittest.SkipTest("et-run not built (cargo build -p executorch-bridge --bin et-run, or set KV_ET_RUN)")
    return tool


def run_in_executorch(pte: bytes, prompt: Sequence[int], steps: int) -> List[int]:
    """The greedy tokens ``et-run`` gives for ``pte``: ``prompt`` (prefill), then ``steps`` decode steps."""
    tool = require_et_run()
    with tempfile.TemporaryDirectory(prefix="kv_delegate_test_") as tmp:
        path = Path(tmp) / "program.pte"
        path.write_bytes(pte)
        done = subprocess.run([str(tool), str(path), "--prompt", ",".join(map(str, prompt)), "--steps", str(steps),
                               "--json"], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise AssertionError(f"et-run failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout)["tokens"]


@contextlib.contextmanager
def without_rule(op: str) -> Iterator[None]:
    """The partitioner and the lowering as if the lowering had no rule for ``op`` (e.g. ``aten.mean.dim``): every
    node of it is left outside, as a model's operator the lowering does not know would be."""
    from kv_delegate import partitioner
    from kv_delegate.lowering import _Lowerer

    supported = partitioner.SUPPORTED_OPS
    if op not in supported:
        raise AssertionError(f"the lowering has no rule for {op} to remove")
    ordinary, attention = _Lowerer.ordinary_rules, _Lowerer.attention_rules
    partitioner.SUPPORTED_OPS = supported - {op}
    _Lowerer.ordinary_rules = lambda self: {k: v for k, v in ordinary(self).items() if k != op}
    _Lowerer.attention_rules = lambda self: {k: v for k, v in attention(self).items() if k != op}
    try:
        yield
    finally:
        partitioner.SUPPORTED_OPS = supported
        _Lowerer.ordinary_rules, _Lowerer.attention_rules = ordinary, attention
