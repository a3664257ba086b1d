"""Running lab trials: `run_trials` runs any list of trials on a backend (`posleak.runner`); `run_plan` is the one
path of every lab entry point (`posleak lab`, `posleak lab --tasks`, `posleak sweep`), whose `plan()` gives the
trials plus what to write: the trials run, then are gathered into one results folder (`posleak.lab.results`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from posleak.lab.results import write_results
from posleak.lab.trial import Trial, TrialJob
from posleak.report.html import Section
from posleak.runner import backend_problems, run_jobs
from posleak.store import RunFolder
from posleak.validate import Problems, out_folder_problems


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
    for config in dict.fromkeys(trial.train for trial in trials):
        problems.extend(config.stopping_problems())
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
