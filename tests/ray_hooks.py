"""Fault injection for the Ray sweep tests (test_lab.py): `install` is every Ray worker's setup hook.

The test writes a plan to $POSLEAK_TEST_FAULTS/plan.json, {"pe": PE, "at": "checkpoint" | "measure", "times": N}.
A worker training the trial of that position encoding then kills itself with SIGKILL, as the kernel's OOM killer
would, right after it saves a training checkpoint ("checkpoint") or as its measurements start ("measure"), until N
workers have died (counted in deaths.log). Every checkpoint step saved for that trial goes to checkpoints.log.
Without plan.json nothing happens.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any


def _folder() -> Path:
    return Path(os.environ["POSLEAK_TEST_FAULTS"])


def _plan(pe: str) -> dict[str, Any] | None:
    path = _folder() / "plan.json"
    plan = json.loads(path.read_text()) if path.is_file() else None
    return plan if plan is not None and plan["pe"] == pe else None


def _append(name: str, line: str) -> None:
    with open(_folder() / name, "a") as file:
        file.write(line + "\n")


def _die_if_planned(pe: str, at: str) -> None:
    plan = _plan(pe)
    deaths = _folder() / "deaths.log"
    died = len(deaths.read_text().splitlines()) if deaths.is_file() else 0
    if plan is not None and plan["at"] == at and died < plan["times"]:
        _append("deaths.log", f"{pe} {at}")
        os.kill(os.getpid(), signal.SIGKILL)


def install() -> None:
    from posleak.lab import trainer, trial

    save_checkpoint, measure = trainer._save_checkpoint, trial.measure

    def checkpoint_then_maybe_die(out: Path, identity: dict[str, Any], step: int, *args: Any) -> None:
        save_checkpoint(out, identity, step, *args)
        pe = identity["spec"]["pe"]
        if _plan(pe) is not None:
            _append("checkpoints.log", str(step))
        _die_if_planned(pe, "checkpoint")

    def maybe_die_then_measure(model: Any, data: Any, run: trial.Trial, *args: Any) -> dict[str, float]:
        _die_if_planned(run.spec.pe, "measure")
        return measure(model, data, run, *args)

    trainer._save_checkpoint = checkpoint_then_maybe_die
    trial.measure = maybe_die_then_measure
