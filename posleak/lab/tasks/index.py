"""index — needs absolute position.

Row of L tokens: `<bos> x_1 … x_n <q> d d d <a> y` with n = L − 7. The content x_1 … x_n is n distinct symbols
in random order; p is uniform in 1 … n, written d d d (three digits); the answer y = x_p, the content token at
absolute index p (position p of the row, `<bos>` being position 0). One answer target: y.

Why position is needed: the content is a random arrangement of distinct symbols, so the same multiset of
tokens holds every arrangement equally often. A model whose output at `<a>` cannot tell arrangements apart
(no position encoding and no causal mask over the content: its prediction is a function of the content's
multiset and of the tokens after it) gives the same prediction for all n cyclic shifts of the content, whose
answers are the n distinct symbols: it is right for at most one of them. Its accuracy is at most 1/n
(`chance`), and exactly 1/n for a predictor that names one of the content symbols.
"""

from __future__ import annotations

import numpy as np

from posleak.lab.tasks.vocab import ANSWER, BOS, NUM_SYMBOLS, QUERY, SYMBOL0, digits

NEEDS = "absolute"
OVERHEAD = 7  # <bos>, <q>, three digits, <a>, y


def min_length() -> int:
    return OVERHEAD + 2


def max_length() -> int:
    return OVERHEAD + NUM_SYMBOLS  # distinct symbols


def row(rng: np.random.Generator, length: int) -> tuple[list[int], list[int]]:
    n = length - OVERHEAD
    content = (SYMBOL0 + rng.permutation(NUM_SYMBOLS)[:n]).tolist()
    p = int(rng.integers(1, n + 1))
    tokens = [BOS, *content, QUERY, *digits(p), ANSWER, content[p - 1]]
    return tokens, [length - 1]


def chance(length: int) -> float:
    return 1.0 / (length - OVERHEAD)
