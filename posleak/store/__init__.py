"""Storage, the ground floor: run folders (Parquet tables, manifests, partial state), atomic writes, locks, strict
JSON, and the YAML spec files of sweeps and batches. Every floor may use it; it imports nothing of posleak but errors.

Its names load on first use (PEP 562): run folders need pandas and torch, which `posleak models --json` and the
model zoo, writing strict JSON through `posleak.store.jsonfile`, must not pay for."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from posleak.store.atomic import atomic_write
    from posleak.store.jsonfile import write_json
    from posleak.store.lock import LOCK
    from posleak.store.manifest import TokenCount, fingerprint, provenance, versions
    from posleak.store.runfolder import COMPLETE, RunFolder, RunState

_WHERE = {
    "atomic_write": "atomic",
    "write_json": "jsonfile",
    "LOCK": "lock",
    "TokenCount": "manifest",
    "fingerprint": "manifest",
    "provenance": "manifest",
    "versions": "manifest",
    "COMPLETE": "runfolder",
    "RunFolder": "runfolder",
    "RunState": "runfolder",
}

__all__ = [
    "COMPLETE",
    "LOCK",
    "RunFolder",
    "RunState",
    "TokenCount",
    "atomic_write",
    "fingerprint",
    "provenance",
    "versions",
    "write_json",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'posleak.store' has no attribute {name!r}")
    return getattr(importlib.import_module(f"posleak.store.{_WHERE[name]}"), name)
