"""Storage, the ground floor: run folders (Parquet tables, manifests, partial state), atomic writes, locks, and
the YAML spec files of sweeps and batches. Every floor may use it; it imports nothing of posleak but errors."""

from posleak.store.atomic import atomic_write
from posleak.store.lock import LOCK
from posleak.store.manifest import TokenCount, fingerprint, provenance, versions
from posleak.store.runfolder import COMPLETE, RunFolder, RunState

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
]
