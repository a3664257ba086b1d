"""What a run's fingerprint covers of an options dataclass (`identity`): its fields, less those its metadata marks
as left out at their default (`left_out_at_default`). An option added later is marked so: a run that leaves it at
its default keeps the fingerprint it had before the option existed, and its run folder keeps resuming."""

from __future__ import annotations

import dataclasses
from typing import Any

_LEFT_OUT = "left_out_at_default"  # the metadata key: the field whose default leaves this one out


def left_out_at_default(default: Any, *, follows: str | None = None) -> Any:
    """A dataclass field that `identity` leaves out while it is at its `default`, or, `follows` naming another
    field, while that one is at its default (a setting that means nothing without it: a null's seed)."""
    return dataclasses.field(default=default, metadata={_LEFT_OUT: follows})


def identity(options: Any) -> dict[str, Any]:
    """The fields of the dataclass `options` (`dataclasses.asdict`), less those left out at their default."""
    fields = {field.name: field for field in dataclasses.fields(options)}
    values = dataclasses.asdict(options)
    for name, field in fields.items():
        if _LEFT_OUT in field.metadata:
            governing = fields[field.metadata[_LEFT_OUT] or name]
            if getattr(options, governing.name) == governing.default:
                del values[name]
    return values
