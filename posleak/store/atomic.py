"""Atomic writes: every file of a run folder goes through a temp file in the same folder and `os.replace`, so a
crash, Ctrl-C or SIGKILL leaves either the old file or the new one, never half of one; a full disk ends in a
one-line error naming the file, and the folder resumes once there is space again."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from posleak.errors import PosleakError, is_disk_full


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


def is_temp_file(entry: Path) -> bool:
    """The temp file of a write that never finished (the name `atomic_write` gives it)."""
    return entry.name.startswith(".") and entry.name.endswith(".tmp")
