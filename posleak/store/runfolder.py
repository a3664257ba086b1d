"""Run folders: the on-disk form of every posleak result.

A run folder holds Parquet tables (`NAME.parquet`), `manifest.json` (provenance), `figures/*.png` and
`report.html`. Every file is written atomically (a temp file in the same folder, then `os.replace`), so a
crash, Ctrl-C or SIGKILL leaves either the old file or the new one, never half of one; a full disk ends in
a one-line error naming the file, and the folder resumes once there is space again.

States: `begin(args)` writes `manifest.json` with `"status": "partial"`, the fingerprint of the arguments
that determine the result and the arguments themselves; `finish` rewrites it with `"status": "complete"`.
So a folder is either complete or says in its manifest that it is not, whenever it was stopped. Finished
pieces of work go to `.partial/` through `save_partial` and come back through `load_partial` on the next
attempt with the same arguments; a folder that holds a different run is refused.

One writer at a time: `claim(args)` holds an exclusive `flock` on `.lock` in the folder for the block
(the holder's pid, host and start time are written in it, so a refusal can name it). The operating system
drops the lock when its process dies, however it dies; the file is removed when the block ends.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import re
import secrets
import shutil
import socket
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import IO, Any, Literal

import pandas as pd
import torch

import posleak
from posleak.errors import PosleakError, is_disk_full

MANIFEST = "manifest.json"
REPORT = "report.html"
PARTIAL = ".partial"
LOCK = ".lock"
COMPLETE = "complete"
IN_PROGRESS = "partial"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")

RunState = Literal["new", "resume", "complete"]


@contextmanager
def disk_full_as_error(target: Path) -> Iterator[None]:
    """Turn running out of space while writing `target` into a one-line PosleakError."""
    try:
        yield
    except Exception as err:
        if is_disk_full(err):
            raise PosleakError(
                f"disk full while writing {target}; free space and rerun the same command to resume"
            ) from None
        raise


def atomic_write(target: Path, write: Callable[[IO[bytes]], None], sync: bool = True) -> Path:
    """Write `target` through `write(file)` into a temp file beside it, then move it into place.

    The temp file lives in the same folder so that `os.replace` is a rename on one file system (atomic
    on POSIX and Windows); it is synced first (unless `sync` is False, for bulky intermediate files whose
    loss in a power cut only costs recomputing them) so that a power cut cannot leave an empty file behind.
    """
    # open(..., "xb") rather than tempfile.mkstemp: mkstemp makes files private (0600), ignoring the umask
    # that results shared with colleagues should follow; the random name keeps concurrent writers apart.
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
    with disk_full_as_error(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(tmp, "xb") as file:
                write(file)
                file.flush()
                if sync:
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
        self._refuse_if_held()
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
                    "started_utc": _now(),
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
        path = self.path / LOCK
        with disk_full_as_error(path), _cannot_write(self.path):
            self.path.mkdir(parents=True, exist_ok=True)
            fd = _locked_file(path)
            try:
                holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": _now()}
                os.ftruncate(fd, 0)
                os.pwrite(fd, json.dumps(holder).encode(), 0)
            except BaseException:
                _release(fd, path)
                raise
        try:
            yield
        finally:
            _release(fd, path)

    def _refuse_if_held(self) -> None:
        """PosleakError naming the process that holds the folder's lock, if one does (probed, nothing written)."""
        try:
            fd = os.open(self.path / LOCK, os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _in_use(self.path, os.pread(fd, 4096, 0)) from None
        finally:
            os.close(fd)

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


@contextmanager
def _cannot_write(folder: Path) -> Iterator[None]:
    """An OS refusal to create or open files in `folder` (the first writes of a run) as one PosleakError."""
    try:
        yield
    except OSError as err:
        raise PosleakError(f"cannot write in {folder} ({err.strerror}); choose another --out") from None


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _locked_file(path: Path) -> int:
    """A descriptor of `path` holding its exclusive flock; PosleakError naming the holder when another has it."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0)
            os.close(fd)
            raise _in_use(path.parent, holder) from None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)  # the holder removed the file between our open and our lock: lock the new one


def _in_use(folder: Path, holder: bytes) -> PosleakError:
    try:
        fields = json.loads(holder)
        who = f"pid {fields['pid']} on {fields['host']}, since {fields['since']}"
    except (ValueError, KeyError, TypeError):
        who = "it has not said who it is yet"
    return PosleakError(
        f"{folder} is being written by another posleak process ({who}); "
        "wait for it to finish, or stop it and rerun to resume"
    )


def _is_own_leftover(entry: Path) -> bool:
    """The lock file, or the temp file of a write that never finished."""
    return entry.name == LOCK or (entry.name.startswith(".") and entry.name.endswith(".tmp"))


def _release(fd: int, path: Path) -> None:
    """Remove the lock file while still holding it (a process that opened it meanwhile will retry), then unlock."""
    path.unlink(missing_ok=True)
    os.close(fd)


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
    """Everything a result records to be reproduced, plus versions and the time it was made.

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
        "created_utc": _now(),
    }
