"""One lab trial: train a model (or reuse a trained one), then measure it; the unit that lab and sweeps run.

A trial is `Trial(name, spec, train, eval, overrides)`. Under an output root:

- `models/<train key>/` holds the trained model (`posleak.lab.trainer`); the key hashes the lab spec and the
  training options, so trials that differ only in evaluation (RoPE scaling applied at evaluation, say)
  share one training, serialised by a file lock;
- `trials/<trial key>/` holds the measurements: `probe.parquet`, `per_layer.parquet`, `analysis/` (the
  analysis run folder (`posleak.pipeline`)) and, written last, `complete.json` — the result row with the start and end
  time. A trial with `complete.json` is never rerun; its stored row is returned.

Measurements, all on the validation documents:

- perplexity at each multiple of the training length: exp(mean next-token loss) over every window of
  that length the validation stream holds, so that all lengths cover the same text;
- the position probe (`posleak.measure.probe`) on `probe_seqs` windows of the training length;
- the decomposition (`posleak.pipeline.analyze_model`) on `analyze_seqs` windows of the training length;
  `mask_all` / `resid_all` in the row are its per-layer means over heads, averaged over layers. It is
  defined for causal and sliding-window masks only, so `prefix:P` models get NaN there.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from posleak.data.batches import TokenBatch
from posleak.data.kinds import GridKind
from posleak.device import Placement
from posleak.errors import PosleakError
from posleak.lab.data import TASK_ANALYSIS, TASK_EVAL, TASK_PROBE, LabData, lab_sequences, prepare_data, task_rows
from posleak.lab.tasks import TASKS, task_tokenizer
from posleak.lab.tasks.vocab import BOS
from posleak.lab.trainer import TrainConfig, evaluate_loss, task_solved, torch_threads, train
from posleak.measure.probe import ProbeConfig, best_r2, probe_positions
from posleak.models.lab.config import LabSpec
from posleak.models.lab.model import LabForCausalLM, load_lab_model
from posleak.pipeline import AnalysisOptions, Execution, MeasureOptions, analyze_model, prepared_model
from posleak.store.jsonfile import dumps, nan_for_none, write_json

MARKER = "complete.json"


@dataclass(frozen=True)
class EvalConfig:
    """What a trial measures after training."""

    length_multiples: tuple[int, ...] = (1, 2, 4)
    probe_seqs: int = 32
    analyze_seqs: int = 32
    batch_size: int = 8
    grid: GridKind = "coarse"
    bootstrap: int = 100
    task_seqs: int = 200  # rows of a task scored at each length (exact match)
    beyond: int | None = None  # the decomposition's range "beyond" = W ≤ i < T on every variant (MeasureOptions)

    def __post_init__(self) -> None:
        if not self.length_multiples or min(self.length_multiples) < 1:
            raise PosleakError(f"length multiples {self.length_multiples} must be positive integers")
        if self.probe_seqs < 8 or self.analyze_seqs < 2 or self.task_seqs < 1:
            raise PosleakError("use at least 8 probe sequences, 2 analysis sequences and 1 task row")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> EvalConfig:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise PosleakError(f"unknown evaluation options {unknown}; known: {sorted(names)}")
        if "length_multiples" in values:
            values = {**values, "length_multiples": tuple(int(m) for m in values["length_multiples"])}
        return cls(**values)


@dataclass(frozen=True)
class Trial:
    """A named lab model, its training, what is measured, and config overrides applied at evaluation."""

    name: str
    spec: LabSpec
    train: TrainConfig
    eval: EvalConfig = field(default_factory=EvalConfig)
    overrides: tuple[tuple[str, Any], ...] = ()

    @property
    def train_key(self) -> str:
        return _key({"spec": self.spec.to_dict(), "train": self.train.to_dict()})

    @property
    def key(self) -> str:
        evaluation = asdict(self.eval)
        if self.train.task is None:
            del evaluation["task_seqs"]  # corpus trials keep the keys they had before tasks existed
        if self.eval.beyond is None:
            del evaluation["beyond"]  # and trials that set no range "beyond" the keys they had before it
        return _key(
            {
                "spec": self.spec.to_dict(),
                "train": self.train.to_dict(),
                "eval": evaluation,
                "overrides": [list(item) for item in self.overrides],
            }
        )


def _key(identity: dict[str, Any]) -> str:
    canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def trial_folder(root: Path, trial: Trial) -> Path:
    return Path(root) / "trials" / trial.key


def finished_row(root: Path, trial: Trial) -> dict[str, Any] | None:
    """The stored result of a finished trial, or None."""
    marker = trial_folder(root, trial) / MARKER
    # a measure it could not take (a task without a chance level) was written as null: NaN again, as in a fresh row
    return nan_for_none(json.loads(marker.read_text())["row"]) if marker.is_file() else None


@dataclass(frozen=True)
class TrialJob:
    """A trial under an output root: the unit `posleak.runner` runs (one CPU per Ray task)."""

    trial: Trial
    root: Path

    @property
    def name(self) -> str:
        return f"{self.trial.name} ({self.trial.key})"

    def finished(self) -> bool:
        return finished_row(self.root, self.trial) is not None

    def run(self, progress: bool) -> dict[str, Any]:
        return run_trial(self.trial, self.root, progress)

    def resources(self) -> dict[str, float]:
        return {"num_cpus": 1}


def run_trial(trial: Trial, root: str | Path, progress: bool = True, threads: int | None = 1) -> dict[str, Any]:
    """Train (or reuse) and measure; return the result row. A finished trial returns its stored row.

    Runs with `threads` torch threads (see `posleak.lab.trainer` on why one is the default)."""
    root = Path(root)
    done = finished_row(root, trial)
    if done is not None:
        return done
    with torch_threads(threads):
        return _run(trial, root, progress)


def _run(trial: Trial, root: Path, progress: bool) -> dict[str, Any]:
    started = datetime.now(UTC)
    clock = time.perf_counter()
    model_dir = root / "models" / trial.train_key
    with _locked(root / "models" / f"{trial.train_key}.lock"):
        result = train(trial.spec, trial.train, model_dir, progress=progress, threads=None)
    train_s = time.perf_counter() - clock
    model = load_lab_model(str(model_dir), **dict(trial.overrides)).to(trial.train.placement.torch_device())
    folder = trial_folder(root, trial)
    folder.mkdir(parents=True, exist_ok=True)
    if trial.train.task is None:
        values = measure(
            model, prepare_data(trial.train, AutoTokenizer.from_pretrained(str(model_dir))), trial, folder, progress
        )
    else:
        values = measure_task(model, trial, folder, progress)
    row = {
        "trial": trial.key,
        "name": trial.name,
        "seed": trial.train.seed,
        **({"task": trial.train.task} if trial.train.task is not None else {}),
        **trial.spec.to_dict(),
        "eval_overrides": dumps(dict(trial.overrides), sort_keys=True) if trial.overrides else "",
        "final_train_loss": float(result.metrics["train_loss"].iloc[-1]),
        "final_val_loss": float(result.metrics["val_loss"].dropna().iloc[-1]),
        "steps_trained": result.step,
        "stop": result.stop_reason,
        **values,
        "train_s": round(train_s, 2),
        "eval_s": round(time.perf_counter() - clock - train_s, 2),
    }
    record = {"row": row, "started_utc": started.isoformat(), "finished_utc": datetime.now(UTC).isoformat()}
    write_json(folder / MARKER, record)
    return row


def measure(model: LabForCausalLM, data: LabData, trial: Trial, folder: Path, progress: bool) -> dict[str, float]:
    """Perplexities, the probe and the decomposition of one model; tables go to `folder`."""
    spec, config, ev = trial.spec, trial.train, trial.eval
    values: dict[str, float] = {}
    for multiple in ev.length_multiples:
        ids = lab_sequences(data, "val", multiple * config.seq_len, None, spec.bos, config.seed).ids
        values[f"ppl_{multiple}x"] = math.exp(evaluate_loss(model, ids, ev.batch_size))
    probe_ids = lab_sequences(data, "val", config.seq_len, ev.probe_seqs, spec.bos, config.seed).ids
    batch = lab_sequences(data, "val", config.seq_len, ev.analyze_seqs, spec.bos, config.seed)
    values |= _position_measures(model, probe_ids, batch, trial, folder, data.tokenizer, progress)
    return values


def measure_task(model: LabForCausalLM, trial: Trial, folder: Path, progress: bool) -> dict[str, float]:
    """A task model: exact-match accuracy of `task_seqs` fresh rows at each multiple of the training length
    (`acc_{m}x`, with the analytic chance level `chance_{m}x` where the task has one, else NaN), then the probe and
    the decomposition on rows of the training length. Evaluation rows come from their own random stream."""
    spec, config, ev = trial.spec, trial.train, trial.eval
    task = config.task
    assert task is not None
    values: dict[str, float] = {}
    for multiple in ev.length_multiples:
        length = multiple * config.seq_len
        rows = task_rows(task, ev.task_seqs, length, spec.bos, (config.seed, TASK_EVAL, multiple))
        values[f"acc_{multiple}x"] = float(task_solved(model, rows, ev.batch_size).double().mean())
        chance = TASKS[task].chance(length + (not spec.bos))
        values[f"chance_{multiple}x"] = math.nan if chance is None else chance
    probe_ids = task_rows(task, ev.probe_seqs, config.seq_len, spec.bos, (config.seed, TASK_PROBE)).ids
    rows = task_rows(task, ev.analyze_seqs, config.seq_len, spec.bos, (config.seed, TASK_ANALYSIS)).ids
    batch = TokenBatch(
        rows,
        "on" if spec.bos else "off",
        BOS if spec.bos else None,
        rows[:, 0].clone(),
        source=f"task:{task}",
        source_name=f"task:{task}",
        seed=config.seed,
    )
    values |= _position_measures(model, probe_ids, batch, trial, folder, task_tokenizer(), progress)
    return values


def _position_measures(
    model: LabForCausalLM,
    probe_ids: torch.Tensor,
    batch: TokenBatch,
    trial: Trial,
    folder: Path,
    tokenizer: PreTrainedTokenizerBase,
    progress: bool,
) -> dict[str, float]:
    """The position probe on `probe_ids` and the decomposition of `batch`; tables go to `folder`."""
    config, ev = trial.train, trial.eval
    values: dict[str, float] = {}
    probe = probe_positions(model, probe_ids, ProbeConfig(seed=config.seed, batch_size=ev.batch_size))
    probe.to_parquet(folder / "probe.parquet", index=False)
    values["probe_r2_best"] = best_r2(probe, "log1p")
    values["probe_r2_best_linear"] = best_r2(probe, "linear")
    if model.config.prefix_length:
        # docs/method.md §2 defines the decomposition over causal (optionally windowed) pairs j ≤ i; a
        # bidirectional prefix has pairs j > i, so prefix models get no decomposition.
        values["mask_all"] = values["resid_all"] = math.nan
        return values
    options = AnalysisOptions(
        MeasureOptions(grid=ev.grid, bootstrap=ev.bootstrap, seed=config.seed, beyond=ev.beyond),
        # the device is recorded in the manifest; the analysis runs where the model is, in float32
        Execution(batch_size=ev.batch_size, placement=Placement(device=config.device)),
    )
    prepared = prepared_model(model, batch, options, f"lab:{trial.name}", tokenizer)
    # report=False: the lab's report is drawn from the trials' tables
    analysis = analyze_model(prepared, folder / "analysis", progress=progress, report=False)
    per_layer = analysis.per_layer
    per_layer.to_parquet(folder / "per_layer.parquet", index=False)
    values["mask_all"] = float(per_layer["mask_all"].mean())
    values["resid_all"] = float(per_layer["resid_all"].mean())
    return values


def read_tables(root: Path, trials: list[Trial], table: str) -> pd.DataFrame:
    """One per-trial table (probe, per_layer) of finished trials, stacked with their trial key and name."""
    frames = []
    for trial in trials:
        path = trial_folder(root, trial) / f"{table}.parquet"
        if path.is_file():
            frames.append(pd.read_parquet(path).assign(trial=trial.key, name=trial.name, seed=trial.train.seed))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` (created), held for the block: one trainer per model folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
