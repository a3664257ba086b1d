"""Where posleak runs its independent units of work (lab trials, analyses of a batch or of `paper`): here, one
after another or in worker processes, or as Ray tasks.

A unit is a `Job`; this module knows nothing of what a job does, only that it has a name, knows whether it is
finished (its result stored where its `run` reads it back), runs, and says what one Ray task of it needs.

This module imports neither torch nor Ray: the command line offers its choices instantly, and Ray is
imported only when a Ray backend is asked for (it is an optional extra, `posleak[ray]`).
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from types import ModuleType
from typing import Any, Protocol

from posleak.errors import PosleakError

BACKENDS: tuple[str, ...] = ("local", "ray")


class Job(Protocol):
    """One unit of work. `run` returns its result, and a finished job's `run` reads the stored result back
    without redoing anything: that is how the results of jobs run elsewhere reach the caller."""

    @property
    def name(self) -> str: ...

    def finished(self) -> bool: ...

    def run(self, progress: bool) -> Any: ...

    def resources(self) -> dict[str, float]: ...


def backend_problems(backend: str) -> list[str]:
    """The problem with `backend`, if it is not one of BACKENDS."""
    return [] if backend in BACKENDS else [f"unknown backend '{backend}'; use local or ray"]


def run_jobs(
    jobs: Sequence[Job],
    backend: str = "local",
    *,
    address: str | None = None,
    workers: int = 1,
    what: str = "job",
    progress: bool = True,
) -> list[Any]:
    """Every job's result, in order. Finished jobs are read back, never redone; the others run here one after
    another, locally in `workers` processes at a time (`workers` > 1), or as Ray tasks. A job run in another
    process stores its result there; the caller reads it back once all have run. `what` (trial, analysis) names
    the jobs in progress bars and errors."""
    if problems := backend_problems(backend):
        raise PosleakError(problems[0])
    todo = [job for job in jobs if not job.finished()]
    if backend == "local" and (workers <= 1 or len(todo) <= 1):
        from tqdm.auto import tqdm  # here, not at the top: the command line imports this module for its choices

        with tqdm(total=len(todo), desc=f"{what} jobs", disable=not progress or not todo) as bar:
            results = []
            for job in jobs:
                fresh = not job.finished()
                results.append(job.run(progress))
                bar.update(fresh)
            return results
    if todo and backend == "ray":
        run_on_ray(todo, what=what, address=address, progress=progress)
    elif todo:
        _run_in_processes(todo, min(workers, len(todo)), what, progress)
    return [job.run(False) for job in jobs]


def _run_elsewhere(job: Job) -> None:
    """A job in a worker process: its result stays in what it writes (the caller reads it back)."""
    job.run(False)


def _run_in_processes(jobs: Sequence[Job], workers: int, what: str, progress: bool) -> None:
    from tqdm.auto import tqdm

    # spawn, not fork: a forked child inherits torch's thread pool in an undefined state.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures = [pool.submit(_run_elsewhere, job) for job in jobs]
        with tqdm(total=len(futures), desc=f"{what} jobs ({workers} at a time)", disable=not progress) as bar:
            for future in as_completed(futures):
                future.result()  # fail early: the first error stops the run
                bar.update()


def ray_module() -> ModuleType:
    """The `ray` package, or a one-line error saying how to install it."""
    try:
        return importlib.import_module("ray")
    except ImportError as err:
        raise PosleakError("--backend ray needs Ray, which is not installed; pip install 'posleak[ray]'") from err


def run_on_ray(jobs: Sequence[Job], *, what: str, address: str | None = None, progress: bool = True) -> None:
    """Every job as one Ray task asking for its `resources()`, on a local cluster started here (all CPUs) or on
    the cluster at `address` (or on the one this process already joined).

    A worker that dies more often than Ray retries ends the run with a one-line error naming that job; what
    finished is kept (jobs store their results), so a rerun resumes."""
    from tqdm.auto import tqdm

    ray = ray_module()
    started_here = not ray.is_initialized()
    if started_here:
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=os.cpu_count() or 1, include_dashboard=False, log_to_driver=False)
    try:
        task = ray.remote(_run_elsewhere)
        refs = [task.options(**job.resources()).remote(job) for job in jobs]
        index = {ref: position for position, ref in enumerate(refs)}
        pending = list(refs)
        with tqdm(total=len(refs), desc=f"{what} tasks (ray)", disable=not progress) as bar:
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                try:
                    # A failed task raises here; Ray's error subclasses the task's own exception type.
                    ray.get(ready[0])
                except ray.exceptions.WorkerCrashedError as err:  # killed (out of memory?) more often than retried
                    raise PosleakError(
                        f"a Ray worker died running {what} {jobs[index[ready[0]]].name} and Ray gave up retrying it; "
                        "what finished is kept: rerun the same command to resume"
                    ) from err
                bar.update()
    finally:
        if started_here:
            ray.shutdown()
