"""index — needs absolute position.

Row of L tokens: `<bos> x_1 … x_n` then r queries `d d d y`, with n = ⌊(L − 1)/2⌋ and r = ⌊(L − 1 − n)/4⌋,
`<eos>` filling any tail. The content x_1 … x_n is n distinct symbols in random order; the queried indices
p_1 … p_r are distinct, drawn uniformly from 1 … n, each written d d d (three digits); each answer y_j = x_{p_j},
the content token at absolute index p_j (position p_j of the row, `<bos>` being position 0). A row is solved when
all r answers are right.

Why r queries and not one: with a single answer target a row (the form before 2026-12-02) no variant left the
unigram plateau (answer loss at log of the symbol count) within 3000 steps, even with learned absolute positions;
r answers a row give r times the signal, and a learned-position model then learns the task within the cap
(docs/method.md §12).

Why position is needed: the content is a random arrangement of distinct symbols, so the same multiset of
tokens holds every arrangement equally often. A model whose output at the first query cannot tell arrangements
apart (no position encoding and no causal mask over the content: its prediction is a function of the content's
multiset and of the tokens after it) gives the same prediction for all n cyclic shifts of the content, whose
answers are the n distinct symbols: it is right for at most one of them. Its first answer is right at most 1/n
of the time, so its row accuracy is at most 1/n (`chance`, an upper bound).
"""

from __future__ import annotations

import numpy as np

from posleak.lab.tasks.vocab import BOS, DIGITS, NUM_SYMBOLS, SYMBOL0, digits

NEEDS = "absolute"
QUERY_TOKENS = DIGITS + 1  # d d d y


def _sizes(length: int) -> tuple[int, int]:
    content = (length - 1) // 2
    return content, (length - 1 - content) // QUERY_TOKENS


def min_length() -> int:
    return 1 + 2 * QUERY_TOKENS  # two content symbols, one query


def max_length() -> int:
    return 2 * NUM_SYMBOLS  # distinct symbols


def row(rng: np.random.Generator, length: int) -> tuple[list[int], list[int]]:
    n, r = _sizes(length)
    content = (SYMBOL0 + rng.permutation(NUM_SYMBOLS)[:n]).tolist()
    tokens, answers = [BOS, *content], []
    for p in rng.permutation(n)[:r].tolist():
        tokens += [*digits(p + 1), content[p]]
        answers.append(len(tokens) - 1)
    return tokens, answers


def chance(length: int) -> float:
    return 1.0 / _sizes(length)[0]
