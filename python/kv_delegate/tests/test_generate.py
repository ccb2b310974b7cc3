"""The one greedy loop (:mod:`kv_delegate.generate`): the calls it makes are those of the runtimes' protocol
(host-runtime's ``generate::protocol::plan``), and each decode step feeds back the last row's argmax."""

from __future__ import annotations

import unittest
from typing import List, Tuple

import torch

from kv_delegate.generate import feeds, greedy, one_token


class GreedyLoopTest(unittest.TestCase):
    def test_a_prompt_is_fed_in_whole_chunks_then_one_token_a_call(self) -> None:
        prompt = [1, 7, 3, 12, 5, 9, 2]
        self.assertEqual(feeds(prompt, 3), [[1, 7, 3], [12, 5, 9], [2]])
        self.assertEqual(feeds(prompt[:2], 128), [[1], [7]], "shorter than a chunk")
        self.assertEqual(feeds(prompt[:4], 4), [[1, 7, 3, 12]], "no tail")
        with self.assertRaisesRegex(ValueError, "the prompt is empty"):
            feeds([], 1)

    def test_each_step_feeds_back_the_argmax_at_the_next_position(self) -> None:
        calls: List[Tuple[List[int], int]] = []

        def call(tokens: List[int], pos: int) -> torch.Tensor:
            calls.append((tokens, pos))
            row = torch.zeros(16, dtype=torch.float16)
            row[(tokens[-1] + pos) % 16] = 1.0
            return row

        tokens, rows = greedy(call, [1, 7, 3, 12], 2, chunk=3)
        self.assertEqual(calls, [([1, 7, 3], 0), ([12], 3), ([15], 4), ([3], 5)])
        self.assertEqual(tokens, [15, 3, 8])
        self.assertEqual((rows.dtype, tuple(rows.shape)), (torch.float32, (3, 16)), "rows widened to f32")
        one = greedy(one_token(lambda tok, pos: call([tok], pos)), [1, 7], 0)[0]
        self.assertEqual((one, calls[-2:]), ([8], [([1], 0), ([7], 1)]))


if __name__ == "__main__":
    unittest.main()
