"""What a run folder's manifest records: the fingerprint of a run's arguments, the software versions, and the
provenance of a result (model, BOS policy and the tokens found at position 0, data, grid, interventions,
timings)."""

from __future__ import annotations

import hashlib
import json
import platform
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from importlib import metadata
from typing import Any

import torch

from posleak.version import __version__


def fingerprint(args: Mapping[str, Any]) -> str:
    """SHA-256 of the arguments in canonical JSON (sorted keys), the identity of a run's result."""
    canonical = json.dumps(args, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def utc_now() -> str:
    """The current time in UTC, ISO 8601 to the second (the timestamps of manifests and locks)."""
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class TokenCount:
    """A token found at position 0, and in how many of the run's sequences."""

    id: int
    text: str
    sequences: int


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    """The software a result depends on; read from package metadata so that nothing heavy is imported."""
    return {
        "posleak": __version__,
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "numpy": _version("numpy"),
        "pandas": _version("pandas"),
        "pyarrow": _version("pyarrow"),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def provenance(
    *,
    model_id: str,
    model_hash: str | None,
    dtype: str,
    attention_path: str,
    data: Mapping[str, Any],
    position0_tokens: Sequence[TokenCount],
    grid: Mapping[str, Any],
    interventions: Sequence[Mapping[str, Any]],
    timings: Mapping[str, float],
) -> dict[str, Any]:
    """Everything a result records to be reproduced, plus versions and the time it was made.

    `model_hash` is the SHA-256 of the checkpoint file (None for a lab model trained in-process); `data` is what
    the sequences are (posleak.data.batches.TokenBatch.provenance), its "bos" the BOS policy;
    `interventions` is empty for a baseline run; `timings` are seconds per stage.
    """
    return {
        "model": {"id": model_id, "sha256": model_hash, "dtype": dtype, "attention_path": attention_path},
        "bos": {"policy": data["bos"], "position0_tokens": [asdict(token) for token in position0_tokens]},
        "data": dict(data),
        "grid": dict(grid),
        "interventions": [dict(intervention) for intervention in interventions],
        "timings_s": dict(timings),
        "versions": versions(),
        "created_utc": utc_now(),
    }
