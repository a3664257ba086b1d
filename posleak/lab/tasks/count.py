"""count — needs absolute position.

Row of L tokens: `<bos> c_1 … c_n <q> d d d` with n = L − 5. The content holds n − 1 random symbols (drawn
with replacement) and one marker `<m>` at an index m uniform in 1 … n; the answer d d d is m − 1, the number of
content tokens before the marker, in three digits, most significant first. Three answer targets; a row is solved
when all three are right.

Why position is needed: the marker's index is uniform and independent of which symbols the content holds, so
conditional on the content's multiset every index is equally likely and the answer is uniform over n values.
A model that cannot tell arrangements of the content apart (no position encoding, no causal mask over it)
answers the same for all n cyclic shifts of the content, whose answers are the n different counts: it is
right for at most one. Accuracy at most 1/n (`chance`).
"""

from __future__ import annotations

import numpy as np

from posleak.lab.tasks.vocab import BOS, MARK, NUM_SYMBOLS, QUERY, SYMBOL0, digits

NEEDS = "absolute"
OVERHEAD = 5  # <bos>, <q>, three digits


def min_length() -> int:
    return OVERHEAD + 2


def max_length() -> int:
    return 999 + 1 + OVERHEAD  # the count m − 1 ≤ n − 1 fits three digits


def row(rng: np.random.Generator, length: int) -> tuple[list[int], list[int]]:
    n = length - OVERHEAD
    content = (SYMBOL0 + rng.integers(0, NUM_SYMBOLS, n)).tolist()
    m = int(rng.integers(1, n + 1))
    content[m - 1] = MARK
    tokens = [BOS, *content, QUERY, *digits(m - 1)]
    return tokens, [length - 3, length - 2, length - 1]


def chance(length: int) -> float:
    return 1.0 / (length - OVERHEAD)
