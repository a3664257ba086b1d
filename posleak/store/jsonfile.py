"""Strict JSON, the one way posleak writes it: a missing number is `null`, never the bare `NaN` or `Infinity` that
Python's json module writes by default and that `jq`, JavaScript's `JSON.parse` and most other parsers reject.

`strict(obj)` maps every float NaN and ±inf in nested dicts, lists and tuples to None (and numpy scalars to plain
numbers); `dumps` and `write_json` serialise through it with allow_nan=False, so that a non-finite number can never
slip through. A reader that wants its numbers back maps None to NaN (`nan_for_none`) where the value is a number.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from posleak.store.atomic import atomic_write


def strict(obj: Any) -> Any:
    """`obj` with every non-finite float replaced by None, recursively through mappings, lists and tuples."""
    if isinstance(obj, bool | str | None):
        return obj
    if getattr(obj, "shape", None) == () and hasattr(obj, "item"):  # a numpy scalar or a 0-d tensor
        return strict(obj.item())
    if isinstance(obj, Mapping):
        return {key: strict(value) for key, value in obj.items()}
    if isinstance(obj, list | tuple):
        return [strict(value) for value in obj]
    if isinstance(obj, numbers.Integral):
        return int(obj)
    if isinstance(obj, numbers.Real):
        value = float(obj)
        return value if math.isfinite(value) else None
    return obj  # anything else is left to `default`


def dumps(obj: Any, *, default: Callable[[Any], Any] | None = None, **kwargs: Any) -> str:
    """json.dumps of `strict(obj)`; what `default` makes of an object json does not know is made strict too."""

    def strict_default(value: Any) -> Any:
        if default is None:
            raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
        return strict(default(value))

    return json.dumps(strict(obj), allow_nan=False, default=strict_default, **kwargs)


def json_bytes(obj: Any, *, default: Callable[[Any], Any] | None = None) -> bytes:
    """The file form: indented by 2, one final newline, UTF-8."""
    return (dumps(obj, indent=2, default=default) + "\n").encode()


def write_json(path: Path, obj: Any, *, default: Callable[[Any], Any] | None = None) -> Path:
    """Write `obj` to `path` as strict JSON, atomically (posleak.store.atomic)."""
    return atomic_write(path, lambda file: file.write(json_bytes(obj, default=default)))


def nan_for_none(values: Mapping[str, Any]) -> dict[str, Any]:
    """A flat record of numbers read back: None (a missing number, written as null) becomes NaN again."""
    return {key: math.nan if value is None else value for key, value in values.items()}
