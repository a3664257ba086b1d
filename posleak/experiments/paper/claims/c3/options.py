"""C3's options in a plan (`Plan.options`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class C3Options:
    """How many of C3's runs a plan runs per unit and sample."""

    control_draws: int  # draws of matched non-sink heads, as many as there are sink heads (per unit)
    both_bos: bool  # C3 also in each model's other BOS setting (--quick: its own only, for time)
    # the runs that are reported, not judged (value ablations, the whole position-0 patch) in each model's own BOS
    # setting (--quick leaves them out, for time: 3 to 4 runs per unit and sample)
    reported: bool
    file_keys: ClassVar[Mapping[str, str]] = {"control_draws": "control_draws", "c3_reported": "reported"}
