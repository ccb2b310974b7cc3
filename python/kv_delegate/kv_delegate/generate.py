"""The generation protocol in torch eager: the one greedy loop every Python caller runs (eager oracles of the
fixtures and tests), feeding a prompt as the runtimes do (host-runtime's ``generate::protocol``, which
``delegate-host run`` and ``et-run`` follow).

The prompt goes in chunks of ``chunk`` tokens a call, the tokens short of a chunk one a call; then each decode
step feeds back the argmax of the last logits row (widened to f32) at the next position.
"""

from __future__ import annotations

from typing import Callable, List, Sequence, Tuple

import torch

#: One call of a method: ``(tokens, position of the first) -> the logits row of the last token``.
Call = Callable[[List[int], int], torch.Tensor]


def one_token(step: Callable[[int, int], torch.Tensor]) -> Call:
    """``step(token, position)``, a method of one token a call, as a :data:`Call`."""
    return lambda tokens, pos: step(tokens[0], pos)


def feeds(prompt: Sequence[int], chunk: int) -> List[List[int]]:
    """The token lists of the calls that feed ``prompt``: whole chunks of ``chunk``, then the rest one a call."""
    if not prompt:
        raise ValueError("the prompt is empty: nothing to feed")
    if chunk < 1:
        raise ValueError(f"a chunk of {chunk} tokens: a call takes at least one")
    whole = len(prompt) // chunk * chunk
    return [list(prompt[i:i + chunk]) for i in range(0, whole, chunk)] + [[t] for t in prompt[whole:]]


def greedy(call: Call, prompt: Sequence[int], steps: int, chunk: int = 1) -> Tuple[List[int], torch.Tensor]:
    """Feeds ``prompt`` (:func:`feeds`), then runs ``steps`` greedy decode steps. Returns the ``steps + 1``
    tokens (the one after the prompt first) and the f32 last logits rows ``[steps + 1, vocab]`` they were
    picked from."""
    pos = 0
    with torch.no_grad():
        for tokens in feeds(prompt, chunk):
            row = call(tokens, pos).float().clone()
            pos += len(tokens)
        rows = [row]
        for _ in range(steps):
            rows.append(call([int(rows[-1].argmax())], pos).float().clone())
            pos += 1
    return [int(r.argmax()) for r in rows], torch.stack(rows)
