"""Train a lab model: AdamW, warm-up then cosine decay, clipping, periodic evaluation, resumable checkpoints.

`train(spec, config, out)` writes into `out`:

- `model.safetensors`, `config.json` (a `LabConfig`), the tokenizer files, `metrics.parquet`
  (`step, train_loss, val_loss, val_acc, tokens_per_s`; val_loss and val_acc are NaN between evaluations,
  val_acc also in corpus runs, which have no exact match) and, last, `train.json` (the options, provenance,
  the step it stopped at and why: `stopped_step`, `stop_reason`) — its presence means the run finished;
- `checkpoints/step-NNNNNN/` (model, optimizer state in safetensors, trainer state in JSON) and
  `checkpoints/latest`, a one-line pointer replaced atomically once a checkpoint is complete.

Determinism: the weights are initialised under `torch.manual_seed(seed)` and the batch of step s is
a pure function of (seed, s) — the rows of an epoch are a seeded permutation of every training
window — so nothing but the step number has to be restored. A resumed run therefore takes the same
batches and the same learning rates as an uninterrupted one and ends with the same weights.

Stopping: a run trains up to `steps` (the cap) and stops earlier on its task's target exact match or on a
plateau (`posleak.lab.train_config`); the decision is a function of the metrics, which checkpoints keep, so a
resumed run stops where an uninterrupted one does.

Data: the corpus split by document and the windows cut from it, or a task's rows (`posleak.lab.data`).

Threads: lab models are small, and torch's intra-op threads cost more in synchronisation than they
save: on this project's 2-core machine one thread trains the tiny preset about three times faster than
two. `train` therefore runs with `threads=1` unless told otherwise (None keeps torch's setting), and
parallelism comes from running trials side by side (`posleak.lab.sweep`).

Device and precision: see `posleak.lab.train_config`. Checkpoints: `posleak.lab.checkpoint`.

Prefix attention (`prefix:P`): positions below P − 1 see the token they would predict, so their
targets are left out of the loss, here and in every evaluation.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from posleak.errors import BadInput
from posleak.lab import checkpoint
from posleak.lab.data import TASK_TRAIN, TASK_VAL, BatchOrder, LabData, lab_sequences, prepare_data, task_rows
from posleak.lab.tasks import TaskBatch, solved, task_tokenizer
from posleak.lab.train_config import MAX_LENGTH_MULTIPLE, TrainConfig
from posleak.models.lab.config import LabSpec
from posleak.models.lab.hf_config import LabConfig
from posleak.models.lab.model import LabForCausalLM, build_lab_model, load_lab_model
from posleak.validate import out_folder_problems

__all__ = ["TrainConfig", "TrainResult", "evaluate_loss", "task_solved", "torch_threads", "train"]

METRICS_COLUMNS = ("step", "train_loss", "val_loss", "val_acc", "tokens_per_s")


def loss_mask(config: LabConfig, seq_len: int) -> torch.Tensor:
    """Which next-token targets (positions 1..T−1) count: all but those a bidirectional prefix can see."""
    keep = torch.ones(seq_len - 1, dtype=torch.bool)
    keep[: max(0, config.prefix_length - 1)] = False
    return keep


def token_losses(model: LabForCausalLM, ids: torch.Tensor) -> torch.Tensor:
    """Per-target cross-entropy (B, T−1) of predicting ids[:, 1:] from the prefix, on the model's device."""
    ids = ids.to(model.device)
    logits = model(input_ids=ids).logits[:, :-1]
    return F.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten(), reduction="none").view(ids.shape[0], -1)


@torch.no_grad()
def evaluate_loss(
    model: LabForCausalLM, ids: torch.Tensor, batch_size: int = 16, targets: torch.Tensor | None = None
) -> float:
    """Mean next-token cross-entropy (nats) over every counted target of `ids` (`targets`, (N, T − 1) bool: a
    task's answers; else all but a prefix's)."""
    was_training = model.training
    model.eval()
    keep = loss_mask(model.config, ids.shape[1]).expand(ids.shape[0], -1) if targets is None else targets
    total, count = 0.0, 0
    for start in range(0, ids.shape[0], batch_size):
        losses = token_losses(model, ids[start : start + batch_size])[keep[start : start + batch_size].to(model.device)]
        total += float(losses.double().sum())
        count += losses.numel()
    model.train(was_training)
    return total / count


@torch.no_grad()
def task_solved(model: LabForCausalLM, rows: TaskBatch, batch_size: int = 16) -> torch.Tensor:
    """(N,) bool: rows whose every answer the model predicts top-1, with the row as its prefix."""
    was_training = model.training
    model.eval()
    predictions = [
        model(input_ids=rows.ids[start : start + batch_size].to(model.device)).logits[:, :-1].argmax(-1).cpu()
        for start in range(0, rows.ids.shape[0], batch_size)
    ]
    model.train(was_training)
    return solved(torch.cat(predictions), rows)


@dataclass
class TrainResult:
    """Where the run lives and what it measured."""

    out: Path
    metrics: pd.DataFrame
    finished: bool  # False when `until` stopped it before it met its criterion or its cap
    step: int  # the last step trained
    stop_reason: str | None = None  # target, plateau or cap once finished (posleak.lab.train_config)

    def model(self) -> LabForCausalLM:
        return load_lab_model(str(self.out))


def train(
    spec: LabSpec,
    config: TrainConfig,
    out: str | Path,
    *,
    until: int | None = None,
    progress: bool = True,
    threads: int | None = 1,
) -> TrainResult:
    """Train (or resume, or return a finished run) into `out`; stop after step `until` when given."""
    if problems := out_folder_problems(out) + config.placement.problems() + config.stopping_problems():
        raise BadInput(problems)
    with torch_threads(threads):
        return _train(spec, config, Path(out), until, progress)


@contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """torch's intra-op thread count set to `threads` inside the block (None: unchanged)."""
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _train(spec: LabSpec, config: TrainConfig, out: Path, until: int | None, progress: bool) -> TrainResult:
    identity = {"spec": spec.to_dict(), "train": config.to_dict()}
    finished = _finished_run(out, identity)
    if finished is not None:
        return finished
    data = prepare_data(config) if config.task is None else None
    tokenizer = data.tokenizer if data is not None else task_tokenizer()
    model_config = LabConfig.from_spec(
        spec, tokenizer.vocab_size, MAX_LENGTH_MULTIPLE * config.seq_len, tokenizer.bos_token_id, tokenizer.eos_token_id
    )
    device = config.placement.torch_device()
    model = build_lab_model(model_config, seed=config.seed).to(device).train()
    optimizer = _optimizer(model, config)
    scaler = torch.amp.GradScaler(device.type, enabled=config.dtype == "float16")  # float16 gradients underflow
    state = checkpoint.resume(out, identity, model, optimizer, scaler)
    batches = _batches(config, spec, model_config, data)
    val = _validation(config, spec, data)
    stop = config.steps if until is None else min(until, config.steps)
    metrics: list[dict[str, float]] = state["metrics"]
    reason = config.stop_reason(metrics)
    if reason is not None:  # a checkpoint taken where the criterion stopped it: nothing left to train
        stop = state["step"]
    # the bar as a context: closed (its line ended) before an error is printed below it
    with tqdm(total=stop, initial=state["step"], desc=f"train {spec.pe}/{spec.norm}", disable=not progress) as bar:
        for step in range(state["step"], stop):
            started = time.perf_counter()
            for group in optimizer.param_groups:
                group["lr"] = config.lr_at(step)
            ids, keep = batches(step)
            with config.precision(device):  # the device resolved once, not probed every step
                loss = token_losses(model, ids.to(device))[keep.to(device)].mean()
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            scaler.step(optimizer)
            scaler.update()
            tokens_per_s = config.batch_size * config.seq_len / (time.perf_counter() - started)
            train_loss = loss.item()
            done = step + 1
            evaluated = done % config.eval_every == 0 or done == config.steps
            val_loss, val_acc = val(model) if evaluated else (math.nan, math.nan)
            values = (done, train_loss, val_loss, val_acc, tokens_per_s)
            metrics.append(dict(zip(METRICS_COLUMNS, values, strict=True)))
            bar.set_postfix(loss=f"{train_loss:.3f}", tok_s=f"{tokens_per_s:,.0f}", refresh=False)
            bar.update()
            reason = config.stop_reason(metrics)
            if done % config.checkpoint_every == 0 or done == stop or reason is not None:
                checkpoint.save_checkpoint(out, identity, done, model, optimizer, metrics, scaler)
            if reason is not None:
                break
    frame = pd.DataFrame(metrics, columns=list(METRICS_COLUMNS))
    last = int(frame["step"].iloc[-1]) if len(frame) else 0
    if reason is None:
        return TrainResult(out=out, metrics=frame, finished=False, step=last)
    checkpoint.save_final(out, identity, model, tokenizer, frame, data, stopped=(last, reason))
    return TrainResult(out=out, metrics=frame, finished=True, step=last, stop_reason=reason)


def _validation(
    config: TrainConfig, spec: LabSpec, data: LabData | None
) -> Callable[[LabForCausalLM], tuple[float, float]]:
    """The evaluation during training: validation loss (float32, as every evaluation) and, for a task, the exact
    match of the same validation rows (NaN for the corpus)."""
    if data is not None:
        ids = lab_sequences(data, "val", config.seq_len, config.eval_seqs, spec.bos, config.seed).ids
        return lambda model: (evaluate_loss(model, ids), math.nan)
    assert config.task is not None
    rows = task_rows(config.task, config.eval_seqs, config.seq_len, spec.bos, (config.seed, TASK_VAL))

    def task_val(model: LabForCausalLM) -> tuple[float, float]:
        loss = evaluate_loss(model, rows.ids, targets=rows.answers)
        return loss, float(task_solved(model, rows).double().mean())

    return task_val


def _batches(
    config: TrainConfig, spec: LabSpec, model_config: LabConfig, data: LabData | None
) -> Callable[[int], tuple[torch.Tensor, torch.Tensor]]:
    """The rows of step s and which of their targets count, a pure function of (seed, s): corpus windows in
    a seeded order, or a task's rows drawn from the stream (seed, TASK_TRAIN, s)."""
    if data is None:
        assert config.task is not None
        task = config.task

        def task_step(step: int) -> tuple[torch.Tensor, torch.Tensor]:
            rows = task_rows(task, config.batch_size, config.seq_len, spec.bos, (config.seed, TASK_TRAIN, step))
            return rows.ids, rows.answers

        return task_step
    rows = lab_sequences(data, "train", config.seq_len, None, spec.bos, config.seed).ids
    keep = loss_mask(model_config, config.seq_len).expand(config.batch_size, -1)
    order = BatchOrder(rows.shape[0], config.batch_size, config.seed)
    return lambda step: (rows[order.rows(step)], keep)


def _optimizer(model: LabForCausalLM, config: TrainConfig) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, config.beta2))


def _finished_run(out: Path, identity: dict[str, Any]) -> TrainResult | None:
    record = out / "train.json"
    if not record.is_file():
        return None
    saved = json.loads(record.read_text())
    checkpoint.check_identity(out, saved, identity)
    metrics = pd.read_parquet(out / "metrics.parquet")
    if "val_acc" not in metrics:  # a run trained before the criterion existed: its steps, no exact match
        metrics.insert(3, "val_acc", math.nan)
    return TrainResult(
        out=out,
        metrics=metrics,
        finished=True,
        step=saved.get("stopped_step", saved["train"]["steps"]),
        stop_reason=saved.get("stop_reason", "cap"),
    )
