"""``torch.export`` without two copies of the weights (issue 47 item 1: an export's peak memory under twice its
weights).

Strict ``torch.export`` (TorchDynamo, torch 2.15) keeps a "real value" of every tensor the traced module reads
(``real_value_cache``, for the rare op it must run for real) and makes it by cloning the tensor, twice over for
a parameter (``cache_real_value_when_export`` then ``_wrap_fx_preexisting_tensor``): while a model is traced,
its weights are held three times. A parameter of an exported module is only read, so its real value can be the
parameter itself. While :func:`shared_parameters` is active, Dynamo's ``_clone_input`` returns a
``torch.nn.Parameter`` as it is and clones everything else (buffers such as the caches, which a module may
mutate) as before; the exported program is the same.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch


@contextlib.contextmanager
def shared_parameters() -> Iterator[None]:
    """While active, Dynamo's real values of parameters are the parameters, not clones (module docs). Does
    nothing where this torch has no such hook (its Dynamo differs from the one this was written for)."""
    try:
        from torch._dynamo.variables import builder
    except ImportError:
        yield
        return
    clone = getattr(builder, "_clone_input", None)
    if clone is None:
        yield
        return

    def clone_unless_parameter(value: Any, fake_mode: Any) -> Any:
        if isinstance(value, torch.nn.Parameter):
            return value
        return clone(value, fake_mode)

    builder._clone_input = clone_unless_parameter
    try:
        yield
    finally:
        builder._clone_input = clone
