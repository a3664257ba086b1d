"""`TrainConfig`, the optimisation and data options of one lab training run (`posleak.lab.trainer`), with the
learning-rate schedule, the placement and mixed precision they imply, and the run identity they define.

Device and precision: `device` (auto: CUDA, else MPS, else the CPU) is where the model trains and is
evaluated; `dtype` bfloat16 or float16 trains in mixed precision (torch.autocast for the forward passes,
float32 weights and optimizer state; float16 with a gradient scaler). Evaluation and analysis run in float32.
The device is not part of a run's identity (a run started on one device resumes on another); a dtype other
than float32 is.

Stopping (task runs; docs/method.md §12): `steps` is the cap. With `target`, training stops at the first
evaluation whose validation exact match (`eval_seqs` rows of the task's validation stream) reaches it; with
`patience`, at the first evaluation after `patience` evaluations in a row that improved on neither the best
exact match so far nor the best validation loss so far by more than PLATEAU_TOLERANCE of it. `stop_reason`
names why a run stopped: target, plateau or cap. The learning-rate schedule is always the cap's, so a run
stopped early took the same steps as the first steps of one that ran on.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
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
# An evaluation improves on the best validation loss only by more than this share of it: noise does not count.
PLATEAU_TOLERANCE = 0.01
# What each stop says about a variant: only a plateau says it cannot learn the task (docs/method.md §12).
OUTCOMES = {"target": "learned", "plateau": "unable to learn", "cap": "not learned within the cap"}


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
    target: float | None = None  # task runs: stop once validation exact match reaches it (module docstring)
    patience: int | None = None  # task runs: stop after this many evaluations in a row without improvement

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
        if self.target is not None and not 0.0 < self.target <= 1.0:
            problems.append(f"target {self.target} must be an exact-match share in (0, 1], e.g. 0.99")
        if self.patience is not None and self.patience < 1:
            problems.append(f"patience must be at least 1 evaluation, got {self.patience}")
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
        for name, default in (("task", None), ("dtype", "float32"), ("target", None), ("patience", None)):
            if values[name] == default:
                del values[name]
        return values

    def stopping_problems(self) -> list[str]:
        """Why this run cannot stop on its criterion: a corpus run has no exact match (a task lab's base options
        carry a target before each trial names its task, so the check is the trainer's and the lab's)."""
        if self.task is None and (self.target is not None or self.patience is not None):
            return ["--target and --patience stop a task run on its exact match; a corpus run trains its --steps"]
        return []

    def stop_reason(self, metrics: list[dict[str, float]]) -> str | None:
        """Why training stops after the last row of `metrics` (one per step; val_acc and val_loss NaN between
        evaluations): target, plateau, cap, or None to go on (module docstring)."""
        evals = [row for row in metrics if not math.isnan(row["val_loss"])]
        last = evals[-1] if evals and evals[-1] is metrics[-1] else None
        if last is not None and self.target is not None and last["val_acc"] >= self.target:
            return "target"
        if last is not None and self.patience is not None and _stalled(evals, self.patience):
            return "plateau"
        return "cap" if metrics and metrics[-1]["step"] >= self.steps else None

    def criterion(self) -> str:
        """The stopping rule in words."""
        rules = []
        if self.target is not None:
            rules.append(f"until its validation exact match ({self.eval_seqs} rows) reached {100 * self.target:g}%")
        if self.patience is not None:
            rules.append(f"or had not improved for {self.patience} evaluations of every {self.eval_every} steps")
        cap = f"under a cap of {self.steps} steps"
        return f"{' '.join(rules)}, {cap}" if rules else f"for {self.steps} steps"

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise PosleakError(f"unknown training options {unknown}; known: {sorted(names)}")
        return cls(**values)


def outcome(stops: Sequence[str]) -> tuple[str, str]:
    """Seeds' stop reasons counted ("target 2, plateau 1") and what they say: learned (every seed reached the
    target), unable to learn (none did, and every one stopped on a plateau), not learned within the cap (none did,
    and one or more reached the cap), or learned by k of n seeds."""
    counts = Counter(stops)
    text = ", ".join(f"{reason} {counts[reason]}" for reason in OUTCOMES if reason in counts)
    learned = counts["target"]
    if learned == len(stops) or (learned == 0 and len(counts) == 1):
        return text, OUTCOMES[stops[0]]
    if learned == 0:
        return text, OUTCOMES["cap"]
    return text, f"learned by {learned} of {len(stops)} seeds"


def _stalled(evals: list[dict[str, float]], patience: int) -> bool:
    """The last `patience` evaluations improved on neither the best exact match nor the best loss before them."""
    if len(evals) <= patience:
        return False
    before, recent = evals[:-patience], evals[-patience:]
    best_acc = max(row["val_acc"] for row in before)
    best_loss = min(row["val_loss"] for row in before)
    return all(row["val_acc"] <= best_acc and row["val_loss"] >= best_loss * (1 - PLATEAU_TOLERANCE) for row in recent)
