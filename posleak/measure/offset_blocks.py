"""Logits of a block of queries in offset order: s_{i,i−d} for the block's rows i and offsets d, no gather.

A block of queries q0..q1−1 is multiplied against the keys q1 − 1 down to q1 − rows − offsets + 1, read from
the keys stored in reverse order (zero past position 0): row r of the product holds s_{q0+r, q1−1−m} at
column m, so offset d sits at column rows − 1 − r + d, and a strided view re-indexes the block by offset.
Zero keys give logit 0 (also after soft-capping), so entries with d > i vanish without a mask.
"""

from __future__ import annotations

import torch

from posleak.capture.session import soft_cap


def reverse_keys(keys: torch.Tensor, span: int) -> torch.Tensor:
    """Keys (..., T, D) in reverse order, zero-padded by `span` positions past position 0 (blocks of offsets
    below `span` read no further)."""
    *lead, seq_len, dim = keys.shape
    out = keys.new_empty(*lead, seq_len + span, dim)
    out[..., seq_len:, :] = 0
    out[..., :seq_len, :] = keys.flip(-2)
    return out


def offset_block(
    query: torch.Tensor, reversed_keys: torch.Tensor, q0: int, q1: int, span: int, softcap: float | None
) -> torch.Tensor:
    """s_{i,i−d} for queries q0..q1−1 and offsets d < min(q1, span), (N, H, rows, offsets) float64, 0 where
    d > i. `query` (N, KV, G, T, D) is scaled and grouped by KV head; `reversed_keys` (N, KV, T + span, D)
    comes from `reverse_keys`; the product runs in their dtype."""
    num_seqs, kv, groups, seq_len, dim = query.shape
    rows, offsets = q1 - q0, min(q1, span)
    cols = rows + offsets - 1
    start = seq_len - q1  # reversed_keys[p] = k[T − 1 − p]
    raw = query[:, :, :, q0:q1].reshape(num_seqs, kv, groups * rows, dim) @ reversed_keys[:, :, start : start + cols].mT
    heads = kv * groups
    raw = soft_cap(raw, softcap).view(num_seqs, heads, rows, cols)
    by_offset = raw.as_strided(
        (num_seqs, heads, rows, offsets),
        (heads * rows * cols, rows * cols, cols - 1, 1),
        raw.storage_offset() + rows - 1,
    )
    return by_offset.double()
