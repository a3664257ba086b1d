"""Nulls: the same tokens with their order broken, to show what order contributes.

- ``shift``: each row rolled circularly by its own seeded offset (1 … L−1, so every row moves);
  local order survives except at the seam, the absolute placement of every token changes.
- ``shuffle``: each row permuted by its own seeded permutation; no order survives.

A BOS that the policy put at position 0 stays there (it is where the model expects it, and
position 0's closed system is a subject of its own); only the L content tokens after it move.
"""

from __future__ import annotations

import dataclasses

import torch

from posleak.data.batches import TokenBatch
from posleak.data.kinds import NULLS, NullKind
from posleak.errors import PosleakError


def make_null(batch: TokenBatch, kind: NullKind, seed: int = 0) -> TokenBatch:
    """The `kind` null of a batch ("shift" or "shuffle"), reproducible for a seed."""
    if kind not in NULLS:
        raise PosleakError(f"unknown null '{kind}'; use one of {', '.join(NULLS)}")
    if batch.null is not None:
        raise PosleakError(f"this batch is already the '{batch.null}' null; make nulls from the original batch")
    fixed = int(batch.bos_id is not None)
    content = batch.ids[:, fixed:]
    generator = torch.Generator().manual_seed(seed)
    order = _shift_order if kind == "shift" else _shuffle_order
    moved = torch.gather(content, 1, order(*content.shape, generator))
    ids = torch.cat([batch.ids[:, :fixed], moved], dim=1)
    return dataclasses.replace(batch, ids=ids, pos0_token_ids=ids[:, 0].clone(), null=kind, null_seed=seed)


def _shift_order(rows: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """Gather indices rolling each row right by an offset in 1 … length−1 (0 when length is 1)."""
    offsets = torch.randint(1, max(length, 2), (rows, 1), generator=generator) % length
    return (torch.arange(length).unsqueeze(0) - offsets) % length


def _shuffle_order(rows: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """Gather indices of an independent uniform permutation per row."""
    return torch.rand(rows, length, generator=generator).argsort(dim=1)
