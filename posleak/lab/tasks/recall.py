"""recall — needs only relative position (associative recall).

Row of L tokens: `<bos> k_1 v_1 … k_m v_m <q> k_{a_1} v_{a_1} … k_{a_r} v_{a_r}`, then `<eos>` to fill L. With
h = ⌊(L − 2)/2⌋ token pairs in all, r = max(1, ⌊h/3⌋) queries and m = h − r pairs. Keys are distinct symbols, values
random symbols (with replacement), the queried keys a_1 … a_r distinct and drawn among the m. The answers are the
values after the queried keys; a row is solved when all r are right. Each value is found by matching the key and
reading the token right after that match: content and an offset of one, whatever the length.
No analytic chance level is claimed.
"""

from __future__ import annotations

import numpy as np

from posleak.lab.tasks.vocab import BOS, NUM_SYMBOLS, QUERY, SYMBOL0

NEEDS = "relative"


def _sizes(length: int) -> tuple[int, int]:
    pairs = (length - 2) // 2
    queries = max(1, pairs // 3)
    return pairs - queries, queries


def min_length() -> int:
    return 6


def max_length() -> int:
    return 2 * (NUM_SYMBOLS + NUM_SYMBOLS // 2) + 2  # distinct keys


def row(rng: np.random.Generator, length: int) -> tuple[list[int], list[int]]:
    m, r = _sizes(length)
    keys = SYMBOL0 + rng.permutation(NUM_SYMBOLS)[:m]
    values = SYMBOL0 + rng.integers(0, NUM_SYMBOLS, m)
    asked = rng.permutation(m)[:r]
    tokens = [BOS]
    for key, value in zip(keys.tolist(), values.tolist(), strict=True):
        tokens += [key, value]
    tokens.append(QUERY)
    answers = []
    for a in asked.tolist():
        tokens += [int(keys[a]), int(values[a])]
        answers.append(len(tokens) - 1)
    return tokens, answers


def chance(length: int) -> float | None:
    return None
