"""C1's options in a plan (`Plan.options`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class C1Options:
    """What C1 (and C2, which reads the same runs) runs beyond each role's baseline."""

    # the shuffle and shift nulls of the models C1 and C2 judge on both samples, or on the shown one (SHOWN) alone:
    # they are reported beside the magnitudes, never deciding (--quick: on A only, for time: 6 runs)
    nulls_both_samples: bool
    file_keys: ClassVar[Mapping[str, str]] = {}  # none is set by a plan file
