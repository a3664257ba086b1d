"""The folder lock: one writer at a time per run folder.

`hold_lock(folder)` holds an exclusive `flock` on `.lock` in the folder for the block (the holder's pid, host
and start time are written in it, so a refusal can name it). The operating system drops the lock when its
process dies, however it dies; the file is removed when the block ends.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from posleak.errors import PosleakError
from posleak.store.atomic import disk_full_as_error
from posleak.store.jsonfile import dumps
from posleak.store.manifest import utc_now

LOCK = ".lock"


@contextmanager
def hold_lock(folder: Path) -> Iterator[None]:
    """Hold `folder` for this process for the block; refuses (naming the holder) when another holds it."""
    path = folder / LOCK
    with disk_full_as_error(path), _cannot_write(folder):
        folder.mkdir(parents=True, exist_ok=True)
        fd = _locked_file(path)
        try:
            holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": utc_now()}
            os.ftruncate(fd, 0)
            os.pwrite(fd, dumps(holder).encode(), 0)
        except BaseException:
            _release(fd, path)
            raise
    try:
        yield
    finally:
        _release(fd, path)


def refuse_if_held(folder: Path) -> None:
    """PosleakError naming the process that holds the folder's lock, if one does (probed, nothing written)."""
    try:
        fd = os.open(folder / LOCK, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _in_use(folder, os.pread(fd, 4096, 0)) from None
    finally:
        os.close(fd)


@contextmanager
def _cannot_write(folder: Path) -> Iterator[None]:
    """An OS refusal to create or open files in `folder` (the first writes of a run) as one PosleakError."""
    try:
        yield
    except OSError as err:
        raise PosleakError(f"cannot write in {folder} ({err.strerror}); choose another --out") from None


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


def _release(fd: int, path: Path) -> None:
    """Remove the lock file while still holding it (a process that opened it meanwhile will retry), then unlock."""
    path.unlink(missing_ok=True)
    os.close(fd)
