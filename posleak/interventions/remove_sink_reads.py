"""`--remove-sink-reads auto|L.H,...` (docs/method.md §9): in the chosen heads, queries i ≥ 1 give key 0 no
weight and the other keys' weights are renormalised, inside the attention function
(posleak.interventions.key0_reads); `auto` chooses the sink heads of a baseline pass. The clock removal
(posleak.interventions.hold_sink_clock) with the held weight 0: whether later positions lose position 0's identity
when the sink heads no longer read it (claim C6)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from posleak.interventions.base import setting
from posleak.interventions.hold_sink_clock import HoldSinkClock


@dataclass(frozen=True)
class RemoveSinkReads(HoldSinkClock):
    name = "remove_sink_reads"
    chosen_heads_key = "sink_heads_reads_removed"

    heads: str | None = setting(
        "remove_sink_reads",
        metavar="auto|L.H,...",
        help="in these heads, queries i ≥ 1 give key 0 no weight (the rest renormalised)",
    )
    target: ClassVar[Literal["mean", "zero"]] = "zero"
