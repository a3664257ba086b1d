"""The lab: small decoders trained from scratch with controlled position encodings, masks and normalisations.

Importing `posleak.lab.model` (or reading `LabConfig` / `LabForCausalLM` from here) registers the lab model
(`model_type` "posleak_lab") with transformers' AutoConfig and AutoModelForCausalLM. The package itself
imports its members only when they are first asked for (PEP 562), so that `posleak.lab.config`, which the
command line reads for its choices, comes without torch. The comparison and sweeps, which pull in the
analysis and reports, live in `posleak.lab.compare` and `posleak.lab.sweep` and are imported from there.
"""

from __future__ import annotations

import importlib
from typing import Any

_MEMBERS = {
    "LabConfig": "posleak.lab.model",
    "LabForCausalLM": "posleak.lab.model",
    "build_lab_model": "posleak.lab.model",
    "load_lab_model": "posleak.lab.model",
    "LabSpec": "posleak.lab.config",
    "TrainConfig": "posleak.lab.trainer",
    "TrainResult": "posleak.lab.trainer",
    "train": "posleak.lab.trainer",
}

__all__ = sorted(_MEMBERS)


def __getattr__(name: str) -> Any:
    if name in _MEMBERS:
        return getattr(importlib.import_module(_MEMBERS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
