"""Where posleak runs its independent units of work (lab trials, analyses of a batch): here, or as Ray tasks.

This module imports neither torch nor Ray: the command line offers its choices instantly, and Ray is
imported only when a Ray backend is asked for (it is an optional extra, `posleak[ray]`).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from posleak.errors import PosleakError

BACKENDS: tuple[str, ...] = ("local", "ray")


def ray_module() -> ModuleType:
    """The `ray` package, or a one-line error saying how to install it."""
    try:
        return importlib.import_module("ray")
    except ImportError as err:
        raise PosleakError("--backend ray needs Ray, which is not installed; pip install 'posleak[ray]'") from err
