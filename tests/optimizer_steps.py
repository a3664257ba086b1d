"""Counting the optimizer steps a block takes, and interrupting it before one (test_train.py, test_sweep.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook


@contextmanager
def optimizer_steps(interrupt_before: int | None = None) -> Iterator[list[int]]:
    """Counts the optimizer steps taken inside the block (every torch optimizer, through torch's global step
    hook); raises KeyboardInterrupt, as a Ctrl-C would, just before step number `interrupt_before`."""
    count = [0]

    def hook(optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        count[0] += 1
        if count[0] == interrupt_before:
            raise KeyboardInterrupt

    handle = register_optimizer_step_pre_hook(hook)
    try:
        yield count
    finally:
        handle.remove()
