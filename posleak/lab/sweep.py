"""Running lab trials, and sweeps: a YAML grid of lab configurations × seeds, each a trial (train, then measure),
locally or on Ray.

`run_trials` runs any list of trials on a backend (`posleak.runner`); `run_plan` is the one path of every lab
entry point (`posleak lab`, `posleak lab --tasks`, `posleak sweep`): trials plus what to write, run, then
gathered into one results folder (`posleak.lab.results`).

Spec file:

```yaml
name: pe-by-norm            # optional, the report's title
base:                       # lab and training options shared by every trial
  size: tiny
  steps: 300
  seq_len: 64
grid:                       # every combination of these values is one configuration
  pe: [rope, nope]
  norm: [softmax, sigmoid]
seeds: [0, 1]               # each configuration runs once per seed
eval:                       # optional EvalConfig fields
  probe_seqs: 16
```

Keys of `base` and `grid` are `LabSpec` fields (size, pe, attention, norm, bos, rope_base, rope_scaling,
rotary_fraction) or `TrainConfig` fields (steps, seq_len, batch_size, lr, …, and `task`: a `posleak.lab.tasks`
name, to train on that task's rows and score exact-match accuracy `acc_{m}x` instead of perplexity); the seed
comes from `seeds`.

Trials live under OUT/trials/<key> (see `posleak.lab.trial`), named by a hash of their configuration, so a
finished trial is never rerun — not by a second invocation, nor by a larger sweep that contains it. The
gathered rows go to OUT/sweep.parquet with a report. With the Ray backend every unfinished trial is a Ray
task needing one CPU, on a local cluster started for the sweep or on the cluster at `address`; OUT must
then be a folder every node can write (a shared file system).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pandas as pd

from posleak.errors import PosleakError
from posleak.lab.results import write_results
from posleak.lab.trainer import TrainConfig
from posleak.lab.trial import EvalConfig, Trial, TrialJob
from posleak.models.lab.config import LabSpec
from posleak.report.html import Section
from posleak.runner import backend_problems, run_jobs
from posleak.store import RunFolder
from posleak.store.specfile import SpecFormat, grid_options
from posleak.validate import Problems, out_folder_problems

LAB_KEYS = frozenset(f.name for f in fields(LabSpec))
TRAIN_KEYS = frozenset(f.name for f in fields(TrainConfig)) - {"seed"}
SWEEP_FILE = SpecFormat(
    kind="sweep spec",
    short="sweep",
    owner="sweep spec",
    module="posleak.lab.sweep",
    sections=("name", "base", "grid", "seeds", "eval"),
    options=LAB_KEYS | TRAIN_KEYS,
    options_hint=(f"use lab options {sorted(LAB_KEYS)} or training options {sorted(TRAIN_KEYS)} (seeds go in 'seeds')"),
)


@dataclass(frozen=True)
class SweepSpec:
    """A parsed sweep file."""

    name: str
    base: dict[str, Any]
    grid: dict[str, list[Any]]
    seeds: tuple[int, ...]
    eval: EvalConfig

    @classmethod
    def read(cls, path: str | Path) -> SweepSpec:
        return cls.from_dict(SWEEP_FILE.read(path), default_name=Path(path).stem)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], default_name: str = "sweep") -> SweepSpec:
        SWEEP_FILE.check_sections(raw)
        base, grid = SWEEP_FILE.base_and_grid(raw)
        seeds = raw.get("seeds", [0])
        if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) for s in seeds):
            raise PosleakError("sweep 'seeds' must be a non-empty list of integers")
        return cls(
            name=str(raw.get("name", default_name)),
            base=base,
            grid=grid,
            seeds=tuple(seeds),
            eval=EvalConfig.from_dict(dict(raw.get("eval") or {})),
        )

    def trials(self) -> list[Trial]:
        """Every grid point × seed, in grid order then seed order."""
        trials = []
        for point, options in grid_options(self.base, self.grid):
            name = ",".join(f"{key}={value}" for key, value in point.items()) or "base"
            spec = LabSpec(**{k: v for k, v in options.items() if k in LAB_KEYS})
            train_options = {k: v for k, v in options.items() if k in TRAIN_KEYS}
            for seed in self.seeds:
                trials.append(Trial(name, spec, TrainConfig.from_dict({**train_options, "seed": seed}), self.eval))
        return trials

    def plan(self) -> LabPlan:
        trials = self.trials()
        return LabPlan(
            trials,
            table_name="sweep",
            title=f"posleak sweep: {self.name}",
            intro=(
                f"{len(trials)} trials: {len(trials) // len(self.seeds)} configurations × {len(self.seeds)} seeds. "
                f"Grid: {', '.join(f'{k} ∈ {v}' for k, v in self.grid.items()) or 'none'}; base options: "
                f"{self.base or 'defaults'}."
            ),
            settings={"spec": {"name": self.name, "base": self.base, "grid": self.grid, "seeds": list(self.seeds)}},
        )


def run_trials(
    trials: Sequence[Trial],
    root: str | Path,
    backend: str = "local",
    address: str | None = None,
    progress: bool = True,
    jobs: int = 1,
) -> list[dict[str, Any]]:
    """The result rows of `trials`, in order; finished trials are read back, the others run on `backend`.

    Locally, `jobs` > 1 runs that many trials at a time in worker processes (one torch thread each)."""
    problems = Problems()
    problems.extend(out_folder_problems(root))
    problems.extend(backend_problems(backend))
    if jobs < 1:
        problems.add(f"jobs must be at least 1, got {jobs}")
    if address is None:  # the trials run on this machine: a device it lacks is refused before any trial starts
        for placement in dict.fromkeys(trial.train.placement for trial in trials):
            problems.extend(placement.problems())
    problems.raise_any()
    root = Path(root).resolve()
    units = [TrialJob(trial, root) for trial in trials]
    return run_jobs(units, backend, address=address, workers=jobs, what="trial", progress=progress)


# Extra tables and report sections from the trials' table (a task lab's choices), given the results folder.
Extras = Callable[[RunFolder, pd.DataFrame], tuple[dict[str, pd.DataFrame], list[Section]]]


@dataclass(frozen=True)
class LabPlan:
    """What a lab entry point runs and writes: its trials, how their rows become the summary table, and the
    report's words; `extras` adds tables (written beside the summary) and sections after it."""

    trials: list[Trial]
    table_name: str
    title: str
    intro: str
    settings: Mapping[str, Any]
    table: Callable[[list[dict[str, Any]]], pd.DataFrame] = pd.DataFrame
    extras: Extras | None = None


@dataclass(frozen=True)
class LabOutcome:
    """The summary table of a plan's trials and its extra tables, by name."""

    table: pd.DataFrame
    extras: dict[str, pd.DataFrame]


def run_plan(
    plan: LabPlan,
    out: str | Path,
    backend: str = "local",
    address: str | None = None,
    progress: bool = True,
    jobs: int = 1,
) -> LabOutcome:
    """Run every trial of `plan` into `out`, then write its tables, figures and report there."""
    rows = run_trials(plan.trials, out, backend, address, progress, jobs)
    run = RunFolder(Path(out).resolve())
    table = plan.table(rows)
    extras, sections = plan.extras(run, table) if plan.extras is not None else ({}, [])
    for name, frame in extras.items():
        run.write_table(name, frame)
    write_results(
        run.path,
        plan.trials,
        table,
        table_name=plan.table_name,
        title=plan.title,
        intro=plan.intro,
        settings=plan.settings,
        extra_sections=sections,
    )
    return LabOutcome(table, extras)


def run_sweep(
    spec: SweepSpec,
    out: str | Path,
    backend: str = "local",
    address: str | None = None,
    progress: bool = True,
    jobs: int = 1,
) -> pd.DataFrame:
    """Run every trial of `spec` into `out` and gather them: sweep.parquet and report.html."""
    return run_plan(spec.plan(), out, backend, address, progress, jobs).table
