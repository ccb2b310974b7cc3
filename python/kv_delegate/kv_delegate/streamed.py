"""Delegate blobs kept in files from the packer to the program file, never read into memory (issue 47 item 1:
an export's peak memory under twice its weights).

ExecuTorch takes a delegate's blob as ``bytes`` (``PreprocessResult.processed_bytes``) and keeps it until the
program is written, beside the model's own weights: a second copy of them, and a third while the program's
bytes are assembled. While :func:`streamed_blobs` is active, a backend's preprocess leaves the blob in the file
the packer wrote and hands ExecuTorch a short placeholder naming the blob's SHA-256 (so that equal blobs are
still shared as ExecuTorch shares them); :func:`attach` then puts each file, as ExecuTorch's own file-backed
data (``FileBackedData``, which its serializer copies to the output a chunk at a time), in its placeholder's
place and serializes the program again. The program's bytes are the same as with the blobs in memory.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Optional

from executorch.exir._serialize._cord import FileBackedData

#: The start of every placeholder (then the blob's SHA-256 in hex): never a blob, which starts with its magic.
PLACEHOLDER = b"kv_delegate streamed blob sha256:"

_active: Optional[Dict[bytes, "BlobFile"]] = None


class BlobFile(FileBackedData):
    """A blob in a file of its own, removed once nothing refers to it. ExecuTorch deep-copies the program
    before serializing it: the copy refers to the same file (the data is not copied, nor removed twice)."""

    def __deepcopy__(self, memo: Dict[int, Any]) -> "BlobFile":
        return self


@contextlib.contextmanager
def streamed_blobs() -> Iterator[Dict[bytes, BlobFile]]:
    """While active, :func:`blob` keeps blobs in files; yields ``{placeholder: file}`` for :func:`attach`."""
    global _active
    outer, _active = _active, {}
    try:
        yield _active
    finally:
        _active = outer


def streaming() -> bool:
    """Whether :func:`streamed_blobs` is active (a preprocess then calls :func:`blob`)."""
    return _active is not None


def blob(write: Callable[[Path], None]) -> bytes:
    """The processed bytes of a blob that ``write(path)`` writes to ``path`` while :func:`streamed_blobs` is
    active: a placeholder for the file, kept for :func:`attach`."""
    if _active is None:
        raise RuntimeError("kv_delegate: a blob is kept in a file only while streamed_blobs() is active")
    fd, name = tempfile.mkstemp(prefix="kv_delegate_", suffix=".blob")
    os.close(fd)
    path = Path(name)
    try:
        write(path)
        with open(path, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").digest()
    except BaseException:
        path.unlink()
        raise
    placeholder = PLACEHOLDER + digest.hex().encode()
    if placeholder in _active:
        path.unlink()  # the same blob again: ExecuTorch stores it once
    else:
        _active[placeholder] = BlobFile(name, cleanup=True, sha256=digest)
    return placeholder


def attach(manager: Any, config: Any, blobs: Dict[bytes, BlobFile]) -> Any:
    """``manager`` (an ``ExecutorchProgramManager`` made with ``config`` while :func:`streamed_blobs` gave
    ``blobs``) with every placeholder replaced by its file and the program serialized again, so that
    ``write_to_file`` streams the blobs from their files (and ``buffer`` reads them)."""
    from executorch.exir._serialize._serialize import serialize_for_executorch

    entries = manager._emitter_output.program.backend_delegate_data
    replaced = False
    for entry in entries:
        if isinstance(entry.data, bytes) and entry.data in blobs:
            entry.data = blobs[entry.data]
            replaced = True
    if replaced:
        manager._pte_data, manager._tensor_data = serialize_for_executorch(
            manager._emitter_output, config, manager._data_serializer, manager._named_data)
        manager._buffer = None
    return manager
