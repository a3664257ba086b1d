"""recall — needs only relative position (multi-query associative recall).

Row of L tokens: `<bos> k_1 v_1 … k_m v_m <q> k_{a_1} v_{a_1} … k_{a_m} v_{a_m}`, then `<eos>` to fill L, with
m = ⌊(L − 2)/4⌋ pairs, each asked once: a_1 … a_m is a random order of 1 … m. Keys are m distinct symbols of the
first KEYS symbols; values are drawn (with replacement) from the next VALUES symbols, so a key never stands where
a value does. The answers are the values after the queried keys; a row is solved when all m are right. Each
value is found by matching the key and reading the token right after that match: content and an offset of
one, whatever the length. No analytic chance level is claimed.

Why this form (2026-12-02, docs/method.md §12): the earlier form drew keys and values from all 496 symbols and
asked a third of the pairs; no variant learned it within 3000 steps. Keys and values in disjoint sets of 64,
every pair asked, let a decoder with learned positions learn it within the cap (with the lab's initialisation,
posleak.models.lab.hf_config).
"""

from __future__ import annotations

import numpy as np

from posleak.lab.tasks.vocab import BOS, QUERY, SYMBOL0

NEEDS = "relative"
KEYS = 64  # symbols s0 … s63 are keys
VALUES = 64  # s64 … s127 are values


def _pairs(length: int) -> int:
    return (length - 2) // 4


def min_length() -> int:
    return 6  # one pair, asked once


def max_length() -> int:
    return 4 * KEYS + 5  # distinct keys: m ≤ KEYS


def row(rng: np.random.Generator, length: int) -> tuple[list[int], list[int]]:
    m = _pairs(length)
    keys = (SYMBOL0 + rng.permutation(KEYS)[:m]).tolist()
    values = (SYMBOL0 + KEYS + rng.integers(0, VALUES, m)).tolist()
    tokens = [BOS]
    for key, value in zip(keys, values, strict=True):
        tokens += [key, value]
    tokens.append(QUERY)
    answers = []
    for a in rng.permutation(m).tolist():
        tokens += [keys[a], values[a]]
        answers.append(len(tokens) - 1)
    return tokens, answers


def chance(length: int) -> float | None:
    return None
