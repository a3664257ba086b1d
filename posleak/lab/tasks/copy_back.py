"""copy — needs only relative position.

Row of L tokens: `<bos> x_1 … x_n` with n = L − 1, where x_1 … x_8 are random symbols (with replacement) and
x_i = x_{i−8} for every i > 8: the first block of 8 repeated to the end. The answers are x_9 … x_n, each the
token 8 back; a row is solved when all are right. Query i − 1 predicts x_i from x_{i−8}, 7 positions behind
it, wherever i is: a fixed offset, so relative position suffices and the rule is the same at every length.
No analytic chance level is claimed.
"""

from __future__ import annotations

import numpy as np

from posleak.lab.tasks.vocab import BOS, NUM_SYMBOLS, SYMBOL0

NEEDS = "relative"
PERIOD = 8


def min_length() -> int:
    return PERIOD + 2


def max_length() -> int:
    return 1 << 16


def row(rng: np.random.Generator, length: int) -> tuple[list[int], list[int]]:
    n = length - 1
    block = (SYMBOL0 + rng.integers(0, NUM_SYMBOLS, PERIOD)).tolist()
    content = [block[i % PERIOD] for i in range(n)]
    return [BOS, *content], list(range(1 + PERIOD, length))


def chance(length: int) -> float | None:
    return None
