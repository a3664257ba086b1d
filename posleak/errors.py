"""The exception types that reach users as one line per problem (every problem reported at once, nothing written)."""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence

_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# safetensors and torch report the OS error inside their own exception types, by its text
_DISK_FULL_TEXTS = (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT))


class PosleakError(Exception):
    """A problem with the user's input or environment, with the fix in the message.

    The command line prints it as one line on stderr and exits with status 2; anything else that
    escapes is a bug in posleak and keeps its traceback.
    """

    @property
    def problems(self) -> tuple[str, ...]:
        """One message per problem: the command line prints each as its own `posleak: error:` line."""
        return (str(self),)


class BadInput(PosleakError):
    """Every problem that validation found in one command's input, reported together."""

    def __init__(self, problems: Sequence[str]) -> None:
        self._problems = tuple(problems)
        super().__init__("\n".join(self._problems))

    @property
    def problems(self) -> tuple[str, ...]:
        return self._problems


def is_disk_full(err: BaseException) -> bool:
    """Whether `err` says the file system is out of space or quota."""
    if isinstance(err, OSError) and err.errno in _DISK_FULL_ERRNOS:
        return True
    return any(text in str(err) for text in _DISK_FULL_TEXTS)
