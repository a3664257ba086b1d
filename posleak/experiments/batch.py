"""Many analyses at once: a YAML list of models × settings, each an `analyze` run folder, here or as Ray tasks.

Batch file (`posleak analyze --batch FILE --out DIR`):

```yaml
name: rope-bases                  # optional, the report's title
models: [smollm2-135m, gemma3-270m]   # built-in names, checkpoint folders or hub ids
base:                             # analyze options shared by every run (--seq-len → seq_len, ...)
  seq_len: 256
  num_seqs: 8
grid:                             # every combination of these values is one setting; each model runs at each
  rope_scaling: [null, "ntk:4"]
```

Keys of `base` and `grid` are the options of `posleak analyze`, written as `AnalyzeConfig` and the
interventions' options (posleak.interventions.registry) name them (`seed` sets both, as `--seed` does). Each
model × setting is one run folder, OUT/runs/<name>, named by the model and the setting; a finished run is read
back, never redone, and an interrupted one resumes from its checkpoint (the captures of its forwards, then each
measured layer). The finished runs are gathered into one comparison, `posleak compare`'s table, figures and
report, in OUT/comparison.

The same units carry `posleak paper`'s analyses (`AnalysisJob`s whose recipes name a sample's part of the
documents). On the Ray
backend each unfinished analysis is one task needing one CPU, and a GPU where its device is `cuda`; OUT must then
be a folder every node can write (a shared file system).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from posleak.data.batches import TokenBatch
from posleak.device import Placement
from posleak.errors import BadInput, PosleakError
from posleak.experiments.compare import compare_runs
from posleak.interventions import Interventions
from posleak.interventions.registry import option_defaults
from posleak.models.load import LoadedModel
from posleak.pipeline import (
    AnalysisResult,
    AnalyzeConfig,
    PreparedRun,
    analyze_model,
    checked_model,
    finished_here,
    load_for,
    prepare,
    sequences_for,
)
from posleak.runner import backend_problems, run_jobs
from posleak.store import RunFolder
from posleak.store.specfile import SpecFormat, grid_options
from posleak.validate import Problems, out_folder_problems

CONFIG_KEYS = AnalyzeConfig.OPTIONS
INTERVENTION_KEYS = frozenset(option_defaults())
# A loaded model's spec, the options of its load-time interventions and its placement (`load_key`)
LoadKey = tuple[str, tuple[tuple[str, Any], ...], Placement]
BATCH_FILE = SpecFormat(
    kind="batch file",
    short="batch",
    owner="batch",
    module="posleak.experiments.batch",
    sections=("name", "models", "base", "grid"),
    options=CONFIG_KEYS | INTERVENTION_KEYS,
    options_hint=f"use analyze options {sorted(CONFIG_KEYS | INTERVENTION_KEYS)}",
)


class ModelCache:
    """Loaded models by spec, load-time interventions (RoPE scaling) and placement; at most `size` at once (the
    least recently used goes), so that a run over several models holds a bounded amount of memory."""

    def __init__(self, size: int = 2) -> None:
        self.size = size
        self._models: dict[LoadKey, LoadedModel] = {}

    def get(self, spec: str, interventions: Interventions, placement: Placement) -> LoadedModel:
        key = load_key(spec, interventions, placement)
        loaded = self._models.pop(key, None)
        if loaded is None:
            if len(self._models) >= self.size:
                self._models.pop(next(iter(self._models)))
            loaded = load_for(spec, interventions, placement=placement)
        self._models[key] = loaded  # last: the most recently used
        return loaded


def load_key(spec: str, interventions: Interventions, placement: Placement) -> LoadKey:
    """What tells one loaded model from another: the spec, the interventions that change what is loaded (RoPE
    scaling) and the placement."""
    return spec, interventions.at_load(), placement


@dataclass(frozen=True)
class AnalysisJob:
    """One analysis: `model` under `config`, written to the run folder `out`.

    `report`: whether the run folder gets its own figures and report.html (`paper`'s analyses do not: the
    reproduction has its own report)."""

    name: str
    model: str
    config: AnalyzeConfig
    out: Path
    report: bool = True

    def sequences(self, models: ModelCache) -> TokenBatch:
        return draw_sequences(models, self.model, self.config)

    def resources(self) -> dict[str, float]:
        """What one Ray task of this job asks for."""
        return {"num_cpus": 1, "num_gpus": 1 if self.config.execution.placement.device == "cuda" else 0}

    def finished(self) -> bool:
        """Whether its folder holds this analysis, finished (by the model and options it recorded)."""
        return finished_here(RunFolder(self.out), self.model, self.config)

    def run(self, progress: bool, models: ModelCache | None = None) -> AnalysisResult:
        """Run (or resume, or read back) this analysis, its models from `models` (default: this process's)."""
        if self.finished():
            return AnalysisResult.read(RunFolder(self.out))
        models = models if models is not None else _PROCESS_MODELS
        batch = self.sequences(models)
        loaded = models.get(self.model, self.config.interventions, self.config.execution.placement)
        return analyze_model(
            PreparedRun.of(loaded, batch, self.config), self.out, progress=progress, report=self.report
        )


# A worker process (a Ray worker) keeps its last models for the next job it is given.
_PROCESS_MODELS = ModelCache()


@dataclass(frozen=True)
class _SharingModels:
    """An analysis run here with the caller's models (not sent elsewhere: the cache holds loaded models)."""

    job: AnalysisJob
    models: ModelCache

    @property
    def name(self) -> str:
        return self.job.name

    def finished(self) -> bool:
        return self.job.finished()

    def run(self, progress: bool) -> AnalysisResult:
        return self.job.run(progress, self.models)

    def resources(self) -> dict[str, float]:
        return self.job.resources()


def draw_sequences(models: ModelCache, model: str, config: AnalyzeConfig) -> TokenBatch:
    """The sequences of `config` for `model`, drawn before any intervention."""
    loaded = models.get(model, Interventions(), config.execution.placement)
    return sequences_for(loaded, config.recipe)


def run_analyses(
    jobs: Sequence[AnalysisJob],
    *,
    backend: str = "local",
    address: str | None = None,
    models: ModelCache | None = None,
    progress: bool = True,
) -> list[AnalysisResult]:
    """Every job's result, in order: finished ones read back, the others run here (one after another, models
    shared through `models`, each model's jobs together) or as Ray tasks."""
    if backend == "local":
        models = models if models is not None else ModelCache()
        order = by_model(jobs)
        results = run_jobs([_SharingModels(jobs[i], models) for i in order], what="analysis", progress=progress)
        in_order = dict(zip(order, results, strict=True))
        return [in_order[i] for i in range(len(jobs))]
    return run_jobs(jobs, backend, address=address, what="analysis", progress=progress)


def by_model(jobs: Sequence[AnalysisJob]) -> list[int]:
    """The jobs' indices with each model's together, a stable sort: by the model (spec and placement), then by
    what `ModelCache` loads (with its RoPE scaling), each in order of first appearance. A job also needs its
    model unscaled for its sequences, so a cache of two loads each once. A paper's jobs come by sample and claim:
    in that order they went back to models the cache had evicted (16 loads instead of 5 in `paper --quick`'s
    shared analyses)."""
    loads = [load_key(job.model, job.config.interventions, job.config.execution.placement) for job in jobs]
    models = {model: k for k, model in enumerate(dict.fromkeys(load[::2] for load in loads))}  # spec, placement
    kinds = {load: k for k, load in enumerate(dict.fromkeys(loads))}
    return sorted(range(len(jobs)), key=lambda i: (models[loads[i][::2]], kinds[loads[i]]))


# ----------------------------------------------------------------------------------------------- batch files


@dataclass(frozen=True)
class BatchSpec:
    """A parsed batch file."""

    name: str
    models: tuple[str, ...]
    base: dict[str, Any]
    grid: dict[str, list[Any]]

    @classmethod
    def read(cls, path: str | Path) -> BatchSpec:
        return cls.from_dict(BATCH_FILE.read(path), default_name=Path(path).stem)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], default_name: str = "batch") -> BatchSpec:
        BATCH_FILE.check_sections(raw)
        models = raw.get("models")
        if not isinstance(models, list) or not models or not all(isinstance(m, str) for m in models):
            raise PosleakError("batch 'models' must be a non-empty list of model names, folders or hub ids")
        base, grid = BATCH_FILE.base_and_grid(raw)
        return cls(str(raw.get("name", default_name)), tuple(models), base, grid)

    def jobs(self, out: Path) -> list[AnalysisJob]:
        """Every model × grid point, in model order then grid order."""
        jobs = []
        for model in self.models:
            for point, options in grid_options(self.base, self.grid):
                given = {k: v for k, v in options.items() if k in INTERVENTION_KEYS}
                interventions = Interventions.from_options(**given)
                config = AnalyzeConfig(
                    **{k: v for k, v in options.items() if k in CONFIG_KEYS}, interventions=interventions
                )
                name = "-".join([safe_name(Path(model).name), *(f"{k}={safe_name(str(v))}" for k, v in point.items())])
                jobs.append(AnalysisJob(name, model, config, out / "runs" / name))
        return jobs


def safe_name(text: str) -> str:
    """A run folder's name from a model spec or an option's value."""
    return re.sub(r"[^A-Za-z0-9._=:+-]", "_", text)


def batch_problems(jobs: Sequence[AnalysisJob], out: Path) -> list[str]:
    """Every problem with the batch's runs, found before any of them starts: each model is loaded once, here
    (with its load-time interventions), and every run's options are checked against it and its run folder."""
    problems = Problems()
    problems.extend(out_folder_problems(out))
    names = [job.name for job in jobs]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        problems.add(f"batch runs {twice} would share a folder; give the models different folder names")
    loaded: dict[LoadKey, LoadedModel | None] = {}
    for job in jobs:
        interventions, placement = job.config.interventions, job.config.execution.placement
        key = load_key(job.model, interventions, placement)
        if key not in loaded:
            found = Problems()
            loaded[key] = checked_model(found, job.model, False, placement, interventions)
            problems.extend([f"{job.model}: {p}" for p in found.found])
        if loaded[key] is None:
            continue
        with problems.collecting():
            prepare(job.model, job.config, job.out, base=loaded[key])
    return list(dict.fromkeys(problems.found))


def run_batch(
    spec: BatchSpec, out: Path | str, backend: str = "local", address: str | None = None, progress: bool = True
) -> pd.DataFrame:
    """Run every analysis of `spec` into OUT/runs and gather them: OUT/comparison.parquet, figures, report.html."""
    out = Path(out).resolve()
    jobs = spec.jobs(out)
    if problems := backend_problems(backend) + batch_problems(jobs, out):
        raise BadInput(problems)
    run_analyses(jobs, backend=backend, address=address, progress=progress)
    return compare_runs([job.out for job in jobs], out=out / "comparison", labels=[job.name for job in jobs])
