"""Fault injection for the Ray tests (test_lab.py, test_batch.py): `install` is every Ray worker's setup hook.

The test writes a plan to $POSLEAK_TEST_FAULTS/plan.json, {"unit": UNIT, "at": "checkpoint" | "measure",
"times": N}, where UNIT is a lab trial's position encoding or an analysis's run folder name. A worker on that unit
then kills itself with SIGKILL, as the kernel's OOM killer would, right after it saves a training checkpoint
("checkpoint") or as its measurements start ("measure": a lab trial's, or an analysis's per-layer measurement,
once its forwards are captured), until N workers have died (counted in deaths.log). Every checkpoint step saved
for that trial goes to checkpoints.log. Without plan.json nothing happens.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any


def _folder() -> Path:
    return Path(os.environ["POSLEAK_TEST_FAULTS"])


def _plan(unit: str) -> dict[str, Any] | None:
    path = _folder() / "plan.json"
    plan = json.loads(path.read_text()) if path.is_file() else None
    return plan if plan is not None and plan["unit"] == unit else None


def plan_fault(faults: Path, unit: str, at: str, times: int) -> None:
    """Write the plan (module docstring) into the fault folder `faults`."""
    (faults / "plan.json").write_text(json.dumps({"unit": unit, "at": at, "times": times}))


def _append(name: str, line: str) -> None:
    with open(_folder() / name, "a") as file:
        file.write(line + "\n")


def _die_if_planned(unit: str, at: str) -> None:
    plan = _plan(unit)
    deaths = _folder() / "deaths.log"
    died = len(deaths.read_text().splitlines()) if deaths.is_file() else 0
    if plan is not None and plan["at"] == at and died < plan["times"]:
        _append("deaths.log", f"{unit} {at}")
        os.kill(os.getpid(), signal.SIGKILL)


def install() -> None:
    from posleak.lab import checkpoint, trial
    from posleak.pipeline import run as pipeline_run

    save_checkpoint, measure = checkpoint.save_checkpoint, trial.measure

    def checkpoint_then_maybe_die(out: Path, identity: dict[str, Any], step: int, *args: Any) -> None:
        save_checkpoint(out, identity, step, *args)
        pe = identity["spec"]["pe"]
        if _plan(pe) is not None:
            _append("checkpoints.log", str(step))
        _die_if_planned(pe, "checkpoint")

    def maybe_die_then_measure(model: Any, data: Any, run: trial.Trial, *args: Any) -> dict[str, float]:
        _die_if_planned(run.spec.pe, "measure")
        return measure(model, data, run, *args)

    measure_layers = pipeline_run._measure

    def maybe_die_then_measure_layers(captures: Any, spec: Any, run: Any, *args: Any) -> Any:
        if run is not None:
            _die_if_planned(run.path.name, "measure")
        return measure_layers(captures, spec, run, *args)

    checkpoint.save_checkpoint = checkpoint_then_maybe_die
    trial.measure = maybe_die_then_measure
    pipeline_run._measure = maybe_die_then_measure_layers
