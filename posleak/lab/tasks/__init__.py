"""Synthetic sequence tasks that need position, generated on the fly with a seed, for the lab (docs/method.md §12).

Each task writes fixed-length rows of token ids in one small vocabulary (`posleak.lab.tasks.vocab`: the lab's
`<bos>` = 0 and `<eos>` = 1, markers, digits, symbols) and marks which next-token targets are its answers.
A row is **solved** (exact match) when the model's top-1 prediction is right at every answer target, with the
row's own tokens as the prefix (teacher forcing). That is the same as greedy decoding getting the whole answer
right: while every earlier answer token is right, the prefixes are the same. Rows are scored at the training
length T and at 2T and 4T; the rule is the same at every length, so a model that learned the rule rather than
the training length solves the longer rows too.

| task | needs | rule (module docstrings state it exactly) |
|---|---|---|
| index | absolute | after the content, each of several indices written in digits is followed by its token |
| count | absolute | write (in digits) how many content tokens precede the marker |
| copy (copy_back.py) | relative | continue a block of 8 random symbols repeated: every token equals the one 8 back |
| recall | relative | after key-value pairs, a key is followed by its value |
| reverse | both | after the marker, the content reversed |

A row is `TaskBatch.ids` (N × L, `<bos>` at position 0, `<eos>` filling any tail the rule leaves) and
`TaskBatch.answers` (N × (L − 1), True where query i's target, token i + 1, is an answer).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from posleak.errors import PosleakError
from posleak.lab.tasks import copy_back, count, index, recall, reverse
from posleak.lab.tasks.vocab import EOS, VOCAB_SIZE, task_tokenizer
from posleak.models.lab.config import TASK_NAMES

__all__ = ["TASKS", "Task", "TaskBatch", "generate", "parse_tasks", "solved", "task_tokenizer"]


class Task(Protocol):
    """A task module: `NEEDS`, `min_length(…)`, `row(rng, length)` and `chance(length)` (None where no analytic
    chance level is claimed)."""

    NEEDS: str

    def min_length(self) -> int: ...

    def max_length(self) -> int: ...

    def row(self, rng: np.random.Generator, length: int) -> tuple[list[int], list[int]]: ...

    def chance(self, length: int) -> float | None: ...


TASKS: dict[str, Task] = {
    "index": index,  # type: ignore[dict-item]
    "count": count,  # type: ignore[dict-item]
    "copy": copy_back,  # type: ignore[dict-item]
    "recall": recall,  # type: ignore[dict-item]
    "reverse": reverse,  # type: ignore[dict-item]
}
assert tuple(TASKS) == TASK_NAMES, "posleak.models.lab.config.TASK_NAMES lists the tasks for the command line"


@dataclass(frozen=True)
class TaskBatch:
    """Rows of one task at one length and the answer targets of each."""

    task: str
    ids: torch.Tensor  # (N, L) long
    answers: torch.Tensor  # (N, L − 1) bool: query i's target (token i + 1) is an answer

    @property
    def seq_len(self) -> int:
        return self.ids.shape[1]


def generate(task: str, num_rows: int, length: int, seed: int | Sequence[int]) -> TaskBatch:
    """`num_rows` rows of `length` tokens of `task`; the same (task, num_rows, length, seed) gives the same rows.
    `seed` may be a sequence of integers (the trainer's (seed, stream, step))."""
    module = TASKS[task]
    if problems := length_problems(task, length):
        raise PosleakError(problems[0])
    # the task's name in the seed: two tasks with one seed do not share their random draws
    seeds = [seed] if isinstance(seed, int) else list(seed)
    rng = np.random.default_rng([*seeds, length, num_rows, zlib.crc32(task.encode())])
    ids = np.full((num_rows, length), EOS, dtype=np.int64)
    answers = np.zeros((num_rows, length - 1), dtype=bool)
    for n in range(num_rows):
        tokens, answer_at = module.row(rng, length)
        ids[n, : len(tokens)] = tokens
        answers[n, np.asarray(answer_at) - 1] = True  # token t is query t − 1's target
    return TaskBatch(task, torch.from_numpy(ids), torch.from_numpy(answers))


def length_problems(task: str, length: int) -> list[str]:
    """Why rows of `task` cannot have `length` tokens (empty when they can)."""
    module = TASKS[task]
    if not module.min_length() <= length <= module.max_length():
        return [
            f"task {task} takes rows of {module.min_length()} to {module.max_length()} tokens (its symbols and digits "
            f"run out beyond), not {length}; choose a --seq-len whose 1×, 2× and 4× lie in that range"
        ]
    return []


def parse_tasks(spec: str) -> tuple[str, ...]:
    """`all` or a comma-separated list of task names; unknown names are refused in one line."""
    names = tuple(TASKS) if spec == "all" else tuple(name.strip() for name in spec.split(",") if name.strip())
    unknown = [name for name in names if name not in TASKS]
    if unknown or not names:
        named = ", ".join(unknown) or "(none given)"
        raise PosleakError(f"unknown task {named}; use all or some of {', '.join(TASKS)}")
    return names


def solved(predictions: torch.Tensor, batch: TaskBatch) -> torch.Tensor:
    """(N,) bool: every answer target of the row predicted right; `predictions` are (N, L − 1) top-1 ids of
    queries 0 … L − 2."""
    right = predictions == batch.ids[:, 1:]
    return (right | ~batch.answers).all(dim=1)


assert VOCAB_SIZE <= 512  # the lab's default vocabulary size: task models are the size of corpus ones
