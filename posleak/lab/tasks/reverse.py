"""reverse — needs relative and absolute position.

Row of L tokens: `<bos> x_1 … x_n <r> x_n … x_1` with n = ⌊(L − 2)/2⌋ random symbols (with replacement), then
`<eos>` if L is odd. The answers are the reversed half; a row is solved when all n are right. The j-th answer
(x_{n+1−j}) sits 2j − 1 positions behind the query that predicts it: the offset grows with the distance from
`<r>`, so the model must know where it stands relative to the marker (and where the content began) as well as
read by offset. No analytic chance level is claimed.
"""

from __future__ import annotations

import numpy as np

from posleak.lab.tasks.vocab import BOS, NUM_SYMBOLS, REVERSE, SYMBOL0

NEEDS = "both"


def min_length() -> int:
    return 4


def max_length() -> int:
    return 1 << 16


def row(rng: np.random.Generator, length: int) -> tuple[list[int], list[int]]:
    n = (length - 2) // 2
    content = (SYMBOL0 + rng.integers(0, NUM_SYMBOLS, n)).tolist()
    tokens = [BOS, *content, REVERSE, *content[::-1]]
    return tokens, list(range(n + 2, 2 * n + 2))


def chance(length: int) -> float | None:
    return None
