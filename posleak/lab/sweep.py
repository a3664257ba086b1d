"""Sweeps: a YAML grid of lab configurations × seeds, each a trial (train, then measure), locally or on Ray.

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

import multiprocessing
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm.auto import tqdm

from posleak.errors import PosleakError
from posleak.lab.results import write_results
from posleak.lab.trainer import TrainConfig
from posleak.lab.trial import EvalConfig, Trial, finished_row, run_trial
from posleak.models.lab.config import LabSpec
from posleak.runner import BACKENDS, run_on_ray
from posleak.store.specfile import check_grid, grid_points, read_mapping
from posleak.validate import Problems, out_folder_problems

LAB_KEYS = frozenset(f.name for f in fields(LabSpec))
TRAIN_KEYS = frozenset(f.name for f in fields(TrainConfig)) - {"seed"}


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
        raw = read_mapping(path, "sweep spec", "posleak.lab.sweep", "name, base, grid, seeds, eval")
        return cls.from_dict(raw, default_name=Path(path).stem)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], default_name: str = "sweep") -> SweepSpec:
        unknown = sorted(set(raw) - {"name", "base", "grid", "seeds", "eval"})
        if unknown:
            raise PosleakError(f"sweep spec has unknown sections {unknown}; use name, base, grid, seeds, eval")
        base, grid = dict(raw.get("base") or {}), dict(raw.get("grid") or {})
        for section, keys in (("base", base), ("grid", grid)):
            bad = sorted(set(keys) - LAB_KEYS - TRAIN_KEYS)
            if bad:
                raise PosleakError(
                    f"sweep spec {section} has unknown options {bad}; use lab options {sorted(LAB_KEYS)} "
                    f"or training options {sorted(TRAIN_KEYS)} (seeds go in 'seeds')"
                )
        check_grid("sweep", grid)
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
        for point in grid_points(self.grid):
            options = {**self.base, **point}
            name = ",".join(f"{key}={value}" for key, value in point.items()) or "base"
            spec = LabSpec(**{k: v for k, v in options.items() if k in LAB_KEYS})
            train_options = {k: v for k, v in options.items() if k in TRAIN_KEYS}
            for seed in self.seeds:
                trials.append(Trial(name, spec, TrainConfig.from_dict({**train_options, "seed": seed}), self.eval))
        return trials


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
    if backend not in BACKENDS:
        problems.add(f"unknown backend '{backend}'; use local or ray")
    if jobs < 1:
        problems.add(f"jobs must be at least 1, got {jobs}")
    if address is None:  # the trials run on this machine: a device it lacks is refused before any trial starts
        for placement in dict.fromkeys(trial.train.placement for trial in trials):
            problems.extend(placement.problems())
    problems.raise_any()
    root = Path(root).resolve()
    rows: list[dict[str, Any] | None] = [finished_row(root, trial) for trial in trials]
    todo = [trials[index] for index, row in enumerate(rows) if row is None]
    if not todo:
        new_rows: list[dict[str, Any]] = []
    elif backend == "ray":
        new_rows = _run_on_ray(todo, root, address, progress)
    elif jobs > 1 and len(todo) > 1:
        new_rows = _run_in_processes(todo, root, min(jobs, len(todo)), progress)
    else:
        new_rows = [run_trial(trial, root, progress) for trial in tqdm(todo, desc="trials", disable=not progress)]
    fresh = iter(new_rows)
    return [row if row is not None else next(fresh) for row in rows]


def _run_in_processes(trials: Sequence[Trial], root: Path, jobs: int, progress: bool) -> list[dict[str, Any]]:
    # spawn, not fork: a forked child inherits torch's thread pool in an undefined state.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        futures = [pool.submit(run_trial, trial, root, False) for trial in trials]
        with tqdm(total=len(futures), desc=f"trials ({jobs} at a time)", disable=not progress) as bar:
            for future in as_completed(futures):
                future.result()  # fail early: the first trial error stops the lab
                bar.update()
        return [future.result() for future in futures]


def _run_on_ray(trials: Sequence[Trial], root: Path, address: str | None, progress: bool) -> list[dict[str, Any]]:
    """One Ray task (1 CPU) per trial, on a local cluster started here or on the cluster at `address`."""
    calls = [(trial, str(root), False) for trial in trials]
    names = [f"{trial.name} ({trial.key})" for trial in trials]
    return run_on_ray(run_trial, calls, names, what="trial", address=address, progress=progress)


def run_sweep(
    spec: SweepSpec,
    out: str | Path,
    backend: str = "local",
    address: str | None = None,
    progress: bool = True,
    jobs: int = 1,
) -> pd.DataFrame:
    """Run every trial of `spec` into `out` and gather them: sweep.parquet and report.html."""
    trials = spec.trials()
    rows = run_trials(trials, out, backend, address, progress, jobs)
    table = pd.DataFrame(rows)
    write_results(
        Path(out).resolve(),
        trials,
        table,
        table_name="sweep",
        title=f"posleak sweep: {spec.name}",
        intro=(
            f"{len(trials)} trials: {len(trials) // len(spec.seeds)} configurations × {len(spec.seeds)} seeds. "
            f"Grid: {', '.join(f'{k} ∈ {v}' for k, v in spec.grid.items()) or 'none'}; base options: "
            f"{spec.base or 'defaults'}."
        ),
        settings={"spec": {"name": spec.name, "base": spec.base, "grid": spec.grid, "seeds": list(spec.seeds)}},
    )
    return table
