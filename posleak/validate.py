"""One validation step before any work: collect every problem, then refuse them all at once.

Each command checks its options against each other, against the model's facts and against its output
folder before it runs a forward pass or writes a file, and reports what it found as one `BadInput`
(one `posleak: error:` line per problem, exit status 2). The checks live next to what they check
(`AnalyzeConfig.problems`, `Interventions.problems`, `shape_problems` of the token batches);
this module holds the collector, the output-folder check that every command shares, and a parser of
counts that never raises.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from posleak.errors import BadInput, PosleakError


class Problems:
    """The problems found so far in one command's input."""

    def __init__(self) -> None:
        self.found: list[str] = []

    def add(self, message: str) -> None:
        self.found.append(message)

    def extend(self, messages: list[str]) -> None:
        self.found.extend(messages)

    @contextmanager
    def collecting(self) -> Iterator[None]:
        """Run a check; a PosleakError it raises becomes problems here (the rest of the block is skipped)."""
        try:
            yield
        except PosleakError as err:
            self.found.extend(err.problems)

    def raise_any(self) -> None:
        """Raise every problem found as one BadInput; return when there is none."""
        if self.found:
            raise BadInput(list(dict.fromkeys(self.found)))


def out_folder_problems(out: Path | str, option: str = "--out") -> list[str]:
    """Whether `out` can be a command's output folder: an existing writable folder, or one that can be
    created (its nearest existing parent is a writable folder). Looks only; writes nothing."""
    path = Path(out)
    if path.exists():
        if not path.is_dir():
            return [f"{option} {path} is a file; give a folder (a new one, or the folder of a run to resume)"]
        if not os.access(path, os.W_OK | os.X_OK):
            return [f"{option} {path} is not writable; choose a folder you can write to"]
        return []
    parent = next(p for p in path.absolute().parents if p.exists())
    if not parent.is_dir():
        return [f"{option} {path} cannot be created: {parent} is a file; choose another path"]
    if not os.access(parent, os.W_OK | os.X_OK):
        return [f"{option} {path} cannot be created: {parent} is not writable; choose a folder you can write to"]
    return []


def natural_number(text: str) -> int | None:
    """The integer ≥ 0 that `text` spells in ASCII digits (at most 18 of them, far beyond any count posleak
    takes), or None: unlike `int`, never an error, whatever the text."""
    if not (text.isascii() and text.isdigit()) or len(text) > 18:
        return None
    return int(text)
