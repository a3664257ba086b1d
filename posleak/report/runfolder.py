"""Run folders: the on-disk form of every posleak result (DESIGN.md §2, §6, §7).

A run folder holds Parquet tables (`NAME.parquet`), `manifest.json` (provenance), `figures/*.png` and
`report.html`. Every file is written atomically (a temp file in the same folder, then `os.replace`), so a
crash or Ctrl-C leaves either the old file or the new one, never half of one. A folder is *complete*
only once `manifest.json` says `"status": "complete"`.

Resuming: `begin(args)` fingerprints the arguments that determine the result and stores them in
`.partial/args.json`; finished pieces of work go to `.partial/` through `save_partial` and come back
through `load_partial` on the next attempt. A folder that holds a different run is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import secrets
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import IO, Any, Literal

import pandas as pd
import torch

import posleak
from posleak.errors import PosleakError

MANIFEST = "manifest.json"
REPORT = "report.html"
PARTIAL = ".partial"
COMPLETE = "complete"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")

RunState = Literal["new", "resume", "complete"]


def atomic_write(target: Path, write: Callable[[IO[bytes]], None]) -> Path:
    """Write `target` through `write(file)` into a temp file beside it, then move it into place.

    The temp file lives in the same folder so that `os.replace` is a rename on one file system (atomic
    on POSIX and Windows); it is synced first so that a power cut cannot leave an empty file behind.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    # open(..., "xb") rather than tempfile.mkstemp: mkstemp makes files private (0600), ignoring the umask
    # that results shared with colleagues should follow; the random name keeps concurrent writers apart.
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
    try:
        with open(tmp, "xb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


def fingerprint(args: Mapping[str, Any]) -> str:
    """SHA-256 of the arguments in canonical JSON (sorted keys), the identity of a run's result."""
    canonical = json.dumps(args, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _json_bytes(obj: Any) -> bytes:
    # allow_nan=False: NaN is not JSON, and a NaN in provenance is a bug worth failing loudly on.
    return (json.dumps(obj, indent=2, allow_nan=False, default=str) + "\n").encode()


def _check_name(name: str) -> str:
    if not _NAME.match(name):
        raise ValueError(f"run-folder entry names are plain file names, got {name!r}")
    return name


@dataclass
class RunFolder:
    """One results folder; creating the object creates the folder."""

    path: Path

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        self.path.mkdir(parents=True, exist_ok=True)

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
        if not self.manifest_path.exists():
            raise PosleakError(f"{self.path} is not a posleak run folder (no {MANIFEST}); point to a finished run")
        return json.loads(self.manifest_path.read_text())

    @property
    def is_complete(self) -> bool:
        return self.manifest_path.exists() and self.read_manifest().get("status") == COMPLETE

    # --- figures and report -------------------------------------------------------------------------------

    def figure_path(self, name: str) -> Path:
        """Where figure `name` goes (`figures/NAME.png`); the folder is created on demand."""
        folder = self.path / "figures"
        folder.mkdir(exist_ok=True)
        return folder / f"{_check_name(name)}.png"

    @property
    def report_path(self) -> Path:
        return self.path / REPORT

    # --- resuming -----------------------------------------------------------------------------------------

    @property
    def partial_dir(self) -> Path:
        return self.path / PARTIAL

    def begin(self, args: Mapping[str, Any]) -> RunState:
        """Claim the folder for the run defined by `args`; call it before writing anything.

        Returns "new" for an empty folder, "resume" when an interrupted run with the same arguments left
        partial work here, "complete" when the same run already finished here. Raises PosleakError when the
        folder holds a different run, or files that are not a posleak run.
        """
        wanted = fingerprint(args)
        stored = self._stored_fingerprint()
        if stored is None:
            if any(self.path.iterdir()):
                raise PosleakError(
                    f"{self.path} is not empty and holds no posleak run; choose another --out or delete it"
                )
            self._write_json(self._args_path, {"fingerprint": wanted, "args": dict(args)})
            return "new"
        if stored != wanted:
            raise PosleakError(
                f"{self.path} holds a different run (its arguments differ); choose another --out or delete it"
            )
        return COMPLETE if self.is_complete else "resume"

    @property
    def _args_path(self) -> Path:
        return self.partial_dir / "args.json"

    def _stored_fingerprint(self) -> str | None:
        if self._args_path.exists():
            return json.loads(self._args_path.read_text())["fingerprint"]
        if self.manifest_path.exists():
            # A finished run has no .partial/ any more; its manifest keeps the fingerprint. One without
            # (written by hand or by another tool) can never match, which is the safe answer.
            return self.read_manifest().get("fingerprint", "")
        return None

    def _write_json(self, path: Path, obj: Any) -> Path:
        return atomic_write(path, lambda file: file.write(_json_bytes(obj)))

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
        """Write the manifest with status complete and the run's fingerprint, then drop `.partial/`.

        The manifest goes first: a crash between the two steps leaves a complete run plus stale partial
        state, which `begin` treats as complete.
        """
        if not self._args_path.exists():
            raise RuntimeError(f"{self.path} was never begun; call RunFolder.begin(args) before finish")
        path = self.write_manifest({**manifest, "status": COMPLETE, "fingerprint": self._stored_fingerprint()})
        self.clear_partial()
        return path


@dataclass(frozen=True)
class TokenCount:
    """A token found at position 0, and in how many of the run's sequences."""

    id: int
    text: str
    sequences: int


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    """The software a result depends on; read from package metadata so that nothing heavy is imported."""
    return {
        "posleak": posleak.__version__,
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "numpy": _version("numpy"),
        "pandas": _version("pandas"),
        "pyarrow": _version("pyarrow"),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def provenance(
    *,
    model_id: str,
    model_hash: str | None,
    dtype: str,
    attention_path: str,
    bos_policy: str,
    position0_tokens: Sequence[TokenCount],
    seq_len: int,
    num_seqs: int,
    corpus: str,
    seed: int,
    grid: Mapping[str, Any],
    interventions: Sequence[Mapping[str, Any]],
    timings: Mapping[str, float],
) -> dict[str, Any]:
    """Everything DESIGN.md §2 asks a result to record, plus versions and the time it was made.

    `model_hash` is the SHA-256 of the checkpoint file (None for a lab model trained in-process);
    `interventions` is empty for a baseline run; `timings` are seconds per stage.
    """
    return {
        "model": {"id": model_id, "sha256": model_hash, "dtype": dtype, "attention_path": attention_path},
        "bos": {"policy": bos_policy, "position0_tokens": [asdict(token) for token in position0_tokens]},
        "data": {"corpus": corpus, "seed": seed, "seq_len": seq_len, "num_seqs": num_seqs},
        "grid": dict(grid),
        "interventions": [dict(intervention) for intervention in interventions],
        "timings_s": dict(timings),
        "versions": versions(),
        "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
    }
