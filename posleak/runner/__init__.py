"""Where posleak runs its independent units of work (lab trials, analyses of a batch or of `paper`): here, or as
Ray tasks.

This module imports neither torch nor Ray: the command line offers its choices instantly, and Ray is
imported only when a Ray backend is asked for (it is an optional extra, `posleak[ray]`).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from posleak.errors import PosleakError

BACKENDS: tuple[str, ...] = ("local", "ray")


def backend_problems(backend: str) -> list[str]:
    """The one "unknown backend" message, or none."""
    return [] if backend in BACKENDS else [f"unknown backend '{backend}'; use local or ray"]


def ray_module() -> ModuleType:
    """The `ray` package, or a one-line error saying how to install it."""
    try:
        return importlib.import_module("ray")
    except ImportError as err:
        raise PosleakError("--backend ray needs Ray, which is not installed; pip install 'posleak[ray]'") from err


def run_on_ray(
    fn: Callable[..., Any],
    calls: Sequence[tuple[Any, ...]],
    names: Sequence[str],
    *,
    what: str,
    address: str | None = None,
    resources: Sequence[dict[str, float]] | None = None,
    progress: bool = True,
) -> list[Any]:
    """`fn(*call)` for every call as one Ray task each, results in order, on a local cluster started here (all
    CPUs) or on the cluster at `address` (or on the one this process already joined).

    `resources`: Ray's options per call (default one CPU each). A worker that dies more often than Ray retries
    ends the run with a one-line error naming that `what` (trial, analysis); what finished is the callers' to
    keep (their units write resumable folders), so a rerun resumes."""
    from tqdm.auto import tqdm  # here, not at the top: the command line imports this module for its choices

    ray = ray_module()
    started_here = not ray.is_initialized()
    if started_here:
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=os.cpu_count() or 1, include_dashboard=False, log_to_driver=False)
    try:
        task = ray.remote(fn)
        options = resources if resources is not None else [{"num_cpus": 1}] * len(calls)
        refs = [task.options(**opts).remote(*call) for call, opts in zip(calls, options, strict=True)]
        index = {ref: position for position, ref in enumerate(refs)}
        results: list[Any] = [None] * len(refs)
        pending = list(refs)
        with tqdm(total=len(refs), desc=f"{what} tasks (ray)", disable=not progress) as bar:
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                position = index[ready[0]]
                try:
                    # A failed task raises here; Ray's error subclasses the task's own exception type.
                    results[position] = ray.get(ready[0])
                except ray.exceptions.WorkerCrashedError as err:  # killed (out of memory?) more often than retried
                    raise PosleakError(
                        f"a Ray worker died running {what} {names[position]} and Ray gave up retrying it; "
                        "what finished is kept: rerun the same command to resume"
                    ) from err
                bar.update()
        return results
    finally:
        if started_here:
            ray.shutdown()
