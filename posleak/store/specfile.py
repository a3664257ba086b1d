"""YAML files of shared options and a grid of values (lab sweeps, analysis batches): read, checked, expanded.

Both kinds hold a mapping of sections, among them `base` (options every point shares) and `grid` (option → a
non-empty list of values; every combination is one point). A `SpecFormat` names a kind's sections and the
options it accepts; what the options mean is the caller's.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from posleak.errors import PosleakError


@dataclass(frozen=True)
class SpecFormat:
    """One kind of spec file, as its errors name it.

    `kind` names the file ("sweep spec"), `short` its grid ("sweep"), `owner` the sections in the unknown-options
    error ("sweep spec"); `module` documents the format; `options` are the keys `base` and `grid` accept and
    `options_hint` says what they are (it ends that error)."""

    kind: str
    short: str
    owner: str
    module: str
    sections: tuple[str, ...]
    options: frozenset[str]
    options_hint: str

    def read(self, path: str | Path) -> dict[str, Any]:
        """The mapping of sections in the YAML file `path` (an empty file: none), its sections checked."""
        path = Path(path)
        listed = ", ".join(self.sections)
        if not path.is_file():
            raise PosleakError(f"{self.kind} '{path}' does not exist; pass a YAML file (see {self.module})")
        try:
            raw = yaml.safe_load(path.read_text())
        except yaml.YAMLError as err:
            reason = " ".join(str(err).split())  # YAML's message spans lines and points with a caret
            raise PosleakError(f"{self.kind} '{path}' is not valid YAML ({reason}); fix the file") from err
        if raw is not None and not isinstance(raw, dict):
            raise PosleakError(f"{self.kind} '{path}' is not a mapping of sections; write {listed}")
        return raw if raw is not None else {}

    def check_sections(self, raw: dict[str, Any]) -> None:
        unknown = sorted(set(raw) - set(self.sections))
        if unknown:
            raise PosleakError(f"{self.kind} has unknown sections {unknown}; use {', '.join(self.sections)}")

    def base_and_grid(self, raw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, list[Any]]]:
        """`base` and `grid`, every key an accepted option and every grid option a non-empty list of values."""
        base, grid = dict(raw.get("base") or {}), dict(raw.get("grid") or {})
        for section, keys in (("base", base), ("grid", grid)):
            bad = sorted(set(keys) - self.options)
            if bad:
                raise PosleakError(f"{self.owner} {section} has unknown options {bad}; {self.options_hint}")
        for key, values in grid.items():
            if not isinstance(values, list) or not values:
                raise PosleakError(f"{self.short} grid '{key}' must be a non-empty list of values")
        return base, grid


def grid_options(base: dict[str, Any], grid: dict[str, list[Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Every combination of the grid's values (the last option varying fastest): the point, option → value, and
    its options over `base`."""
    keys = list(grid)
    points = [dict(zip(keys, values, strict=True)) for values in itertools.product(*(grid[key] for key in keys))]
    return [(point, {**base, **point}) for point in points]
