"""One module exported as a program of one method (``forward``) or two (``prefill`` of ``T`` tokens and ``decode``
of one), lowered whole by a partitioner, with the caches written in place (issue 45 item 4).

A prefill method is the same module traced with ``T`` tokens a call: transformers' StaticCache recipe takes
``input_ids [1, T]`` and ``cache_position [1]``, the position of the first token (the recipe reads only
``cache_position[0]``: it sets the cache's counters from it and the model makes ``positions + arange(T)`` and
the causal mask over the chunk and the cache from them, which the lowering folds into ``positions`` and one
``causal_attention`` of ``T`` rows). Both methods hold the same caches: they are the same module's buffers (one
fully qualified name each), planned once for the two methods (``share_mutable_buffers``), so a program runs
``prefill`` over the prompt's chunks and then ``decode`` over the same memory, as ExecuTorch's LLM export shares
its KV cache between methods. The methods are named as host-runtime's ``.pte`` generation convention and
executorch-bridge's runner look for them (``prefill`` and ``decode``; a one-method program keeps ``forward``).

A program with a method of more than one token is traced and lowered with PyTorch's math attention
(``sdpa_kernel(MATH)``): the default CPU kernel's output is laid out ``[B, T, H, Dh]``, so the trace drops
transformers' ``contiguous()`` after the transpose, and the ``view`` after it fails when ExecuTorch decomposes the
program again with ``sdpa`` kept whole and a contiguous output.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Optional, Tuple

import torch
from executorch.exir import ExecutorchBackendConfig, ExecutorchProgramManager, to_edge_transform_and_lower
from torch.nn.attention import SDPBackend, sdpa_kernel

from .planning import KvAliasMemoryPlanningPass
from .shared_parameters import shared_parameters
from .streamed import attach, streamed_blobs

#: The methods of a program with a prefill method, as the runtimes' generation convention names them.
PREFILL, DECODE = "prefill", "decode"
#: The method of a one-method program.
FORWARD = "forward"

#: ``(args, kwargs)`` of one call of ``rows`` tokens.
Example = Callable[[int], Tuple[Tuple[Any, ...], Dict[str, Any]]]


def method_rows(prefill_chunk: Optional[int]) -> Dict[str, int]:
    """Each method's tokens a call: ``forward`` of one, or ``prefill`` of ``prefill_chunk`` and ``decode``."""
    if prefill_chunk is None:
        return {FORWARD: 1}
    if prefill_chunk < 2:
        raise ValueError(f"a prefill chunk of {prefill_chunk} tokens: a prefill method takes at least 2")
    return {PREFILL: prefill_chunk, DECODE: 1}


def hf_example(rows: int) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    """transformers' recipe: ``input_ids i64 [1, rows]``, ``cache_position i64 [1]`` (the first token's)."""
    return (), {"input_ids": torch.ones(1, rows, dtype=torch.int64), "cache_position": torch.tensor([0])}


def to_program(module: torch.nn.Module, rows: Dict[str, int], partitioner: Any, example: Example = hf_example,
               strict: bool = True) -> ExecutorchProgramManager:
    """``module``'s methods (``rows``: tokens a call by method name, :func:`method_rows`) lowered by
    ``partitioner`` into one program, every cache written in place by :class:`KvAliasMemoryPlanningPass` and,
    with several methods, planned once for all of them (their buffers shared). The delegates' blobs stay in the
    files the packer wrote until the program is written (:mod:`kv_delegate.streamed`): ``write_to_file`` copies
    them from there; ``torch.export`` reads the parameters without cloning them
    (:mod:`kv_delegate.shared_parameters`)."""
    shared = len(rows) > 1
    attention = sdpa_kernel([SDPBackend.MATH]) if max(rows.values()) > 1 else contextlib.nullcontext()
    with torch.no_grad(), attention, streamed_blobs() as blobs:
        with shared_parameters():
            programs = {name: torch.export.export(module, *example(n), strict=strict) for name, n in rows.items()}
        lowered = programs if shared else next(iter(programs.values()))
        edge = to_edge_transform_and_lower(lowered, partitioner=[partitioner])
        del programs, lowered
        planner = KvAliasMemoryPlanningPass(share_mutable_buffers=True) if shared else KvAliasMemoryPlanningPass()
        config = ExecutorchBackendConfig(emit_mutable_buffer_names=True, memory_planning_pass=planner)
        return attach(edge.to_executorch(config), config, blobs)
