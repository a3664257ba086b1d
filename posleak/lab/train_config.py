"""`TrainConfig`, the optimisation and data options of one lab training run (`posleak.lab.trainer`), with the
learning-rate schedule, the placement and mixed precision they imply, and the run identity they define.

Device and precision: `device` (auto: CUDA, else MPS, else the CPU) is where the model trains and is
evaluated; `dtype` bfloat16 or float16 trains in mixed precision (torch.autocast for the forward passes,
float32 weights and optimizer state; float16 with a gradient scaler). Evaluation and analysis run in float32.
The device is not part of a run's identity (a run started on one device resumes on another); a dtype other
than float32 is.
"""

from __future__ import annotations

import math
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch

from posleak.device import DEVICES, DTYPES, Placement
from posleak.errors import BadInput, PosleakError
from posleak.lab.tasks import TASKS, length_problems, parse_tasks

# Evaluation lengths are multiples of the training length (length generalisation); a learned
# position table must cover the longest.
MAX_LENGTH_MULTIPLE = 4


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation and data options of one training run."""

    steps: int = 800
    seq_len: int = 128
    batch_size: int = 16
    lr: float = 3e-3
    min_lr_ratio: float = 0.1  # the cosine decays to lr·min_lr_ratio
    warmup_steps: int = 50
    weight_decay: float = 0.1  # on matrices and embeddings; norms, sinks and biases are not decayed
    beta2: float = 0.95
    grad_clip: float = 1.0
    eval_every: int = 100
    eval_seqs: int = 32
    checkpoint_every: int = 200
    seed: int = 0
    corpus: str = "stdlib"
    vocab_size: int = 512
    val_fraction: float = 0.15  # of documents by hash; about 6% of the stdlib corpus's text
    task: str | None = None  # a posleak.lab.tasks name: train on its rows instead of the corpus
    device: str = "auto"  # where it trains and is evaluated (module docstring): not part of its identity
    dtype: str = "float32"  # bfloat16 | float16: mixed-precision training

    def __post_init__(self) -> None:
        problems = [
            f"{name} must be at least 1, got {getattr(self, name)}"
            for name in ("steps", "seq_len", "batch_size", "eval_every", "eval_seqs", "checkpoint_every")
            if getattr(self, name) < 1
        ]
        if self.seq_len == 1:
            problems.append(f"seq_len {self.seq_len} is too short; use at least 2")
        if not self.lr > 0:
            problems.append(f"lr {self.lr} must be positive")
        if not 0.0 < self.val_fraction < 1.0:
            problems.append(f"val_fraction {self.val_fraction} must lie strictly between 0 and 1")
        if self.device not in DEVICES:
            problems.append(f"unknown device {self.device!r}; use one of {', '.join(DEVICES)}")
        if self.dtype not in DTYPES:
            problems.append(f"unknown dtype {self.dtype!r}; use one of {', '.join(DTYPES)}")
        if self.task is not None:
            try:
                (name,) = parse_tasks(self.task)
            except (PosleakError, ValueError):
                problems.append(f"unknown task {self.task}; use one of {', '.join(TASKS)}")
            else:  # rows at 1× up to MAX_LENGTH_MULTIPLE × the training length are evaluated
                longest = MAX_LENGTH_MULTIPLE * self.seq_len
                problems += length_problems(name, self.seq_len) or length_problems(name, longest)
        if problems:
            raise BadInput(problems)

    def lr_at(self, step: int) -> float:
        """Linear warm-up over warmup_steps, then cosine from lr down to lr·min_lr_ratio at the last step."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        span = max(1, self.steps - self.warmup_steps - 1)
        progress = min(1.0, (step - self.warmup_steps) / span)
        low = self.lr * self.min_lr_ratio
        return low + 0.5 * (self.lr - low) * (1.0 + math.cos(math.pi * progress))

    @property
    def placement(self) -> Placement:
        return Placement(self.device, self.dtype)

    def precision(self, device: torch.device) -> AbstractContextManager[Any]:
        """The forward passes' autocast on `device` for a mixed-precision dtype (nothing for float32)."""
        if self.dtype == "float32":
            return nullcontext()
        return torch.autocast(device.type, dtype=self.placement.torch_dtype())

    def to_dict(self) -> dict[str, Any]:
        """The run's identity: the options that change its result (module docstring)."""
        values = asdict(self)
        del values["device"]
        # runs keep the identity (and trial keys) they had before tasks and precisions existed
        for name, default in (("task", None), ("dtype", "float32")):
            if values[name] == default:
                del values[name]
        return values

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise PosleakError(f"unknown training options {unknown}; known: {sorted(names)}")
        return cls(**values)
