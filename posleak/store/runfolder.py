"""Run folders: the on-disk form of every posleak result.

A run folder holds Parquet tables (`NAME.parquet`), `manifest.json` (provenance), `figures/*.png` and
`report.html`. Every file is written atomically (`posleak.store.atomic`).

States: `begin(args)` writes `manifest.json` with `"status": "partial"`, the fingerprint of the arguments
that determine the result and the arguments themselves; `finish` rewrites it with `"status": "complete"`.
So a folder is either complete or says in its manifest that it is not, whenever it was stopped. Finished
pieces of work go to `.partial/` through `save_partial` and come back through `load_partial` on the next
attempt with the same arguments; a folder that holds a different run is refused.

One writer at a time: `claim(args)` holds the folder's lock (`posleak.store.lock`) for the block.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pandas as pd
import torch

from posleak.errors import PosleakError
from posleak.store.atomic import atomic_write, is_temp_file
from posleak.store.jsonfile import write_json
from posleak.store.lock import LOCK, hold_lock, refuse_if_held
from posleak.store.manifest import fingerprint, utc_now

MANIFEST = "manifest.json"
REPORT = "report.html"
PARTIAL = ".partial"
COMPLETE = "complete"
IN_PROGRESS = "partial"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")

RunState = Literal["new", "resume", "complete"]


def _check_name(name: str) -> str:
    if not _NAME.match(name):
        raise ValueError(f"run-folder entry names are plain file names, got {name!r}")
    return name


@dataclass
class RunFolder:
    """One results folder; creating the object writes nothing, the first write creates the folder."""

    path: Path

    def __post_init__(self) -> None:
        self.path = Path(self.path)

    # --- tables -------------------------------------------------------------------------------------------

    def table_path(self, name: str) -> Path:
        return self.path / f"{_check_name(name)}.parquet"

    def write_table(self, name: str, df: pd.DataFrame) -> Path:
        return atomic_write(self.table_path(name), lambda file: df.to_parquet(file))

    def read_table(self, name: str) -> pd.DataFrame:
        path = self.table_path(name)
        if not path.exists():
            raise PosleakError(f"{self.path} has no table {name!r}; rerun the analysis into this folder to produce it")
        return pd.read_parquet(path)

    # --- manifest -----------------------------------------------------------------------------------------

    @property
    def manifest_path(self) -> Path:
        return self.path / MANIFEST

    def write_manifest(self, manifest: Mapping[str, Any]) -> Path:
        return self._write_json(self.manifest_path, dict(manifest))

    def read_manifest(self) -> dict[str, Any]:
        if not self.manifest_path.is_file():
            raise PosleakError(f"{self.path} is not a posleak run folder (no {MANIFEST}); point to a finished run")
        try:
            return json.loads(self.manifest_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise PosleakError(
                f"{self.manifest_path} is not valid JSON (edited by hand?); rerun the command that made the folder"
            ) from None

    @property
    def is_complete(self) -> bool:
        return self.manifest_path.is_file() and self.read_manifest().get("status") == COMPLETE

    def require_complete(self) -> None:
        """Refuse a folder that is not a finished run, saying whether it is an unfinished one or none at all."""
        if self.is_complete:
            return
        if self.manifest_path.is_file() and self.read_manifest().get("status") == IN_PROGRESS:
            raise PosleakError(
                f"{self.path} is an unfinished run (interrupted, or still running); "
                "rerun the command that started it to finish it"
            )
        raise PosleakError(f"{self.path} is not a finished posleak run; run posleak analyze into it first")

    # --- figures and report -------------------------------------------------------------------------------

    def figure_path(self, name: str) -> Path:
        """Where figure `name` goes (`figures/NAME.png`); the folder is created on demand."""
        folder = self.path / "figures"
        folder.mkdir(parents=True, exist_ok=True)
        return folder / f"{_check_name(name)}.png"

    @property
    def report_path(self) -> Path:
        return self.path / REPORT

    # --- resuming -----------------------------------------------------------------------------------------

    @property
    def partial_dir(self) -> Path:
        return self.path / PARTIAL

    def state(self, args: Mapping[str, Any]) -> RunState:
        """What `claim(args)` would find, without writing anything (the check before a run).

        "new" for a missing or empty folder, "resume" when an unfinished run with the same arguments left
        work here, "complete" when the same run finished here. Raises PosleakError when the path is a file,
        another process holds the folder, or it holds a different run or files that are not a posleak run.
        """
        refuse_if_held(self.path)
        return self._state(args)

    def _state(self, args: Mapping[str, Any]) -> RunState:
        if not self.path.exists():
            return "new"
        if not self.path.is_dir():
            raise PosleakError(f"{self.path} is a file, not a folder; choose another --out")
        stored = self.read_manifest().get("fingerprint", "") if self.manifest_path.exists() else None
        if stored is None:
            # A finished run always has a manifest; one without (written by hand or by another tool) can
            # never match, which is the safe answer. The lock and temp files are posleak's own.
            if any(not _is_own_leftover(entry) for entry in self.path.iterdir()):
                raise PosleakError(
                    f"{self.path} is not empty and holds no posleak run; choose another --out or delete it"
                )
            return "new"
        if stored != fingerprint(args):
            raise PosleakError(
                f"{self.path} holds a different run (its arguments differ); choose another --out or delete it"
            )
        return COMPLETE if self.is_complete else "resume"

    def begin(self, args: Mapping[str, Any]) -> RunState:
        """Claim the folder for the run defined by `args` (see `state`); call it before writing anything.

        Temp files of writes that a killed process never finished are removed, and so is the partial state
        left beside a finished run; a new run gets a manifest with status partial.
        """
        state = self._state(args)
        self._remove_leftovers(complete=state == COMPLETE)
        if state == "new":
            self.write_manifest(
                {
                    "status": IN_PROGRESS,
                    "note": "an unfinished run: rerun the command that started it to resume",
                    "fingerprint": fingerprint(args),
                    "args": dict(args),
                    "started_utc": utc_now(),
                }
            )
        return state

    @contextmanager
    def claim(self, args: Mapping[str, Any]) -> Iterator[RunState]:
        """`begin(args)` while holding the folder's lock for the block (`lock`)."""
        with self.lock():
            yield self.begin(args)

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the folder for this process for the block; refuses (naming the holder) when another holds it."""
        with hold_lock(self.path):
            yield

    def _remove_leftovers(self, complete: bool) -> None:
        """Temp files of writes a killed process never finished; all partial state once the run is complete."""
        if not self.path.is_dir():
            return
        for folder in (self.path, self.path / "figures"):
            for tmp in folder.glob(".*.tmp"):
                tmp.unlink(missing_ok=True)
        if complete:
            self.clear_partial()
        elif self.partial_dir.exists():
            for tmp in self.partial_dir.rglob(".*.tmp"):
                tmp.unlink(missing_ok=True)

    def _write_json(self, path: Path, obj: Any) -> Path:
        return write_json(path, obj, default=str)  # strict: a missing number is null (posleak.store.jsonfile)

    def save_partial(self, name: str, obj: Any) -> Path:
        """Keep one finished piece of work for a later resume: tensors in plain containers (a state dict)."""
        return atomic_write(self.partial_dir / f"{_check_name(name)}.pt", lambda file: torch.save(obj, file))

    def load_partial(self, name: str) -> Any | None:
        """The piece saved under `name`, or None when this run has not finished it yet."""
        path = self.partial_dir / f"{_check_name(name)}.pt"
        # weights_only: a run folder may come from someone else, and unpickling arbitrary objects runs code.
        return torch.load(path, weights_only=True) if path.exists() else None

    def clear_partial(self) -> None:
        shutil.rmtree(self.partial_dir, ignore_errors=True)

    def finish(self, manifest: Mapping[str, Any]) -> Path:
        """Write the manifest with status complete, the run's fingerprint and arguments, then drop `.partial/`.

        The manifest goes first: a crash between the two steps leaves a complete run plus stale partial
        state, which `begin` removes.
        """
        begun = self.read_manifest() if self.manifest_path.exists() else {}
        if begun.get("status") != IN_PROGRESS:
            raise RuntimeError(f"{self.path} was never begun; call RunFolder.begin(args) before finish")
        path = self.write_manifest(
            {**manifest, "status": COMPLETE, "fingerprint": begun["fingerprint"], "args": begun["args"]}
        )
        self.clear_partial()
        return path


def _is_own_leftover(entry: Path) -> bool:
    """The lock file, or the temp file of a write that never finished."""
    return entry.name == LOCK or is_temp_file(entry)
