"""YAML files of shared options and a grid of values (lab sweeps, analysis batches): read, checked, expanded.

Both kinds hold a mapping of sections, among them `base` (options every point shares) and `grid` (option → a
non-empty list of values; every combination is one point). What the options mean is the caller's.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import yaml

from posleak.errors import PosleakError


def read_mapping(path: str | Path, kind: str, module: str, sections: str) -> dict[str, Any]:
    """The mapping of sections in the YAML file `path` (an empty file: none); `kind` names the file in errors
    ("sweep spec"), `module` documents its format, `sections` lists them."""
    path = Path(path)
    if not path.is_file():
        raise PosleakError(f"{kind} '{path}' does not exist; pass a YAML file (see {module})")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        reason = " ".join(str(err).split())  # YAML's message spans lines and points with a caret
        raise PosleakError(f"{kind} '{path}' is not valid YAML ({reason}); fix the file") from err
    if raw is not None and not isinstance(raw, dict):
        raise PosleakError(f"{kind} '{path}' is not a mapping of sections; write {sections}")
    return raw if raw is not None else {}


def check_grid(name: str, grid: dict[str, Any]) -> None:
    """Every grid option has a non-empty list of values; `name` ("sweep", "batch") starts the error."""
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise PosleakError(f"{name} grid '{key}' must be a non-empty list of values")


def grid_points(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of the grid's values, option → value, the last option varying fastest."""
    keys = list(grid)
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*(grid[key] for key in keys))]
