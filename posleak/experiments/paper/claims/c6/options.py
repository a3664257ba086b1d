"""C6's options in a plan (`Plan.options`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class C6Options:
    """How many sequences C6's identity probe reads per sample."""

    fingerprint_seqs: int
    file_keys: ClassVar[Mapping[str, str]] = {"fingerprint_seqs": "fingerprint_seqs"}
