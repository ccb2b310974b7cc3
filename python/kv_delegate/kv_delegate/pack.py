"""Writes a native blob through the Rust packer, ``delegate-pack SPEC.json OUT.blob`` (crates/delegate-pack)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, Optional

from . import __version__
from .lowering import Lowered

#: Environment variable naming the packer binary (else ``delegate-pack`` on ``PATH``).
PACKER_ENV = "KV_DELEGATE_PACK"
#: Environment variable naming the TensorRT packer (kv-example-trt's ``trt_pack`` example, else ``trt-pack`` on
#: ``PATH``): the same spec, built into a TensorRT-RTX engine.
TRT_PACKER_ENV = "KV_TRT_PACK"
#: Runs its arguments (the packer's command) and adds the packer's peak resident memory in KiB to its stderr,
#: as the last line ``packer peak KiB N``. Started from this small process rather than from the exporter, the
#: packer's ``ru_maxrss`` is its own: Linux carries the peak of the process a program is started from into the
#: program's ``ru_maxrss`` (through ``vfork``, as ``subprocess`` starts it, the exporter's whole peak).
MEASURED = ("import resource, subprocess, sys; code = subprocess.call(sys.argv[1:]); "
            "print('packer peak KiB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
            "sys.exit(code)")
_PEAK_PREFIX = "packer peak KiB "
#: The largest peak resident memory (bytes) of a packer run by :func:`pack_file` in this process so far.
_peak_bytes = 0


def packer_peak_bytes() -> int:
    """The largest peak resident memory, in bytes, of the packers :func:`pack_file` has run in this process
    (0 before the first): what the export adds to its own memory while it packs, the packer being a process of
    its own."""
    return _peak_bytes


def _record_peak(stderr: str) -> str:
    """Notes the packer's peak from the launcher's last stderr line (:data:`MEASURED`); the packer's own
    stderr."""
    global _peak_bytes
    head, _, last = stderr.rstrip("\n").rpartition("\n")
    if not last.startswith(_PEAK_PREFIX):
        return stderr
    _peak_bytes = max(_peak_bytes, int(last[len(_PEAK_PREFIX):]) * 1024)
    return head


class PackError(RuntimeError):
    """The packer is missing or refused the spec (its ``error:`` line is the message)."""


def packer(env: str = PACKER_ENV, program: str = "delegate-pack") -> str:
    """The packer's path: ``$env`` (``$KV_DELEGATE_PACK``), else ``program`` from ``PATH``."""
    path = os.environ.get(env) or shutil.which(program)
    if not path:
        raise PackError(f"{program} not found: set {env} or put it on PATH")
    return path


def have_packer() -> bool:
    """Whether :func:`packer` finds the packer."""
    try:
        packer()
    except PackError:
        return False
    return True


def spec(lowered: Lowered, backend: str, constants_file: str) -> Dict[str, object]:
    """The packer's SPEC.json for ``lowered``: graph description, constants file, bindings in order."""
    return {
        "backend": backend,
        "graph": lowered.description.json(),
        "constants_file": constants_file,
        "bindings": [{"name": b.name, "role": b.role} for b in lowered.bindings],
        "producer": {"name": "kv_delegate", "version": __version__},
    }


def pack_file(lowered: Lowered, backend: str, out: Path, keep: Optional[Path] = None,
              tool: Optional[str] = None) -> None:
    """Writes the native blob of ``lowered`` for ``backend`` to ``out`` with ``tool`` (default: :func:`packer`).
    The constants are streamed from the lowering's tensors into the packer's constants file, the packer copies
    them from there into ``out`` a chunk at a time, and the blob is left in ``out``: nothing of the weights is
    copied in this process or held by the packer (its peak is :func:`packer_peak_bytes`). ``keep``: also leave
    SPEC.json and c.bin there."""
    with tempfile.TemporaryDirectory(prefix="kv_delegate_") as tmp:
        work = Path(tmp)
        with open(work / "c.bin", "wb") as constants:
            lowered.description.data.write_to(constants)
        (work / "spec.json").write_text(json.dumps(spec(lowered, backend, "c.bin"), indent=1))
        command = [tool or packer(), str(work / "spec.json"), str(out)]
        done = subprocess.run([sys.executable, "-S", "-c", MEASURED, *command], capture_output=True, text=True)
        stderr = _record_peak(done.stderr)
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            for name in ("spec.json", "c.bin"):
                shutil.copy(work / name, keep / name)
        if done.returncode != 0:
            lines = (stderr.strip() or done.stdout).strip().splitlines()
            message = lines[-1] if lines else "no message"
            raise PackError(f"{tool or 'delegate-pack'} failed ({done.returncode}): {message}")


def check(lowered: Lowered, backend: str, tool: Optional[str] = None) -> None:
    """Has the packer check ``lowered`` as :func:`pack_file` would pack it (raising :class:`PackError` as it
    does); the blob is not read back."""
    with tempfile.TemporaryDirectory(prefix="kv_delegate_") as tmp:
        pack_file(lowered, backend, Path(tmp) / "out.blob", tool=tool)


def pack(lowered: Lowered, backend: str, keep: Optional[Path] = None, tool: Optional[str] = None) -> bytes:
    """The native blob of ``lowered`` for ``backend``, as :func:`pack_file` writes it, read into memory.
    ``keep``: also leave SPEC.json and c.bin there."""
    with tempfile.TemporaryDirectory(prefix="kv_delegate_") as tmp:
        out = Path(tmp) / "out.blob"
        pack_file(lowered, backend, out, keep, tool)
        return out.read_bytes()
