"""The grid of (query bin × offset bin) cells on which profiles and offset maps are written.

The grid is a resolution for tables and figures only: every magnitude, ΔR² and sink score is computed
over single (i, d) pairs whatever the grid (docs/method.md, "Grid"). Query positions i ∈ [0, T) and offsets
d = i − j ∈ [0, T) are cut into bins with the same edges: one position per bin below `linear_until`,
geometric beyond (`bins_per_octave` bins per doubling, edges rounded to integers and kept strictly
increasing). The exact grid has one position per bin everywhere. A cell (query bin a, offset bin b) holds
the valid pairs (i, d) of a mask with i ∈ a and d ∈ b; only cells with at least one valid pair exist, and a
cell's value is the mean over its valid pairs.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Literal

import torch
import torch.nn.functional as F

from posleak.capture.masks import MaskSpec

GridKind = Literal["exact", "coarse"]


@dataclass(frozen=True)
class Grid:
    """Bin edges for sequences of length `seq_len`; `linear_until` and `bins_per_octave` shape the coarse grid."""

    seq_len: int
    kind: GridKind = "coarse"
    linear_until: int = 64
    bins_per_octave: int = 8

    def __post_init__(self) -> None:
        if self.seq_len < 1:
            raise ValueError(f"seq_len must be ≥ 1, got {self.seq_len}")
        if self.kind not in ("exact", "coarse"):
            raise ValueError(f"unknown grid kind {self.kind!r}; use 'exact' or 'coarse'")
        if self.linear_until < 1 or self.bins_per_octave < 1:
            raise ValueError("linear_until and bins_per_octave must be ≥ 1")

    @cached_property
    def edges(self) -> tuple[int, ...]:
        """Bin b covers positions edges[b] .. edges[b + 1] − 1; edges[0] = 0, edges[-1] = T."""
        linear = self.seq_len if self.kind == "exact" else min(self.linear_until, self.seq_len)
        edges = list(range(linear + 1))
        step = 1
        while edges[-1] < self.seq_len:
            geometric = round(self.linear_until * 2 ** (step / self.bins_per_octave))
            # rounding can repeat an edge where bins are narrower than one position: keep edges increasing
            edges.append(min(self.seq_len, max(geometric, edges[-1] + 1)))
            step += 1
        return tuple(edges)

    @property
    def num_bins(self) -> int:
        return len(self.edges) - 1

    @property
    def linear_bins(self) -> int:
        """The leading bins of one position each: positions below this have a bin of their own."""
        return self.seq_len if self.kind == "exact" else min(self.linear_until, self.seq_len)

    @cached_property
    def bin_of_position(self) -> torch.Tensor:
        """The bin of each position 0..T−1, shape (T,)."""
        edges = torch.tensor(self.edges)
        return torch.bucketize(torch.arange(self.seq_len), edges, right=True) - 1

    def add_binned(self, dense: torch.Tensor, per_offset: torch.Tensor, first_query: int) -> None:
        """Sum per-(query, offset) values onto the cells: `per_offset` (..., rows, W) holds queries
        first_query.. and offsets 0..W−1 (0 where invalid); each row's float64 cumulative sums along the
        offset are differenced at the bin edges, then rows are summed within query bins, into `dense`
        (..., bins, bins) indexed (query bin, offset bin)."""
        rows, width = per_offset.shape[-2:]
        edges = torch.tensor(self.edges, device=dense.device).clamp(max=width)
        cumulative = F.pad(per_offset.double().cumsum(-1), (1, 0))
        query_bin = self.bin_of_position[first_query : first_query + rows].to(dense.device)
        dense.index_add_(-2, query_bin, cumulative[..., edges[1:]] - cumulative[..., edges[:-1]])

    def describe(self) -> dict[str, object]:
        """What a manifest records about the grid."""
        described: dict[str, object] = {"kind": self.kind, "seq_len": self.seq_len, "bins": self.num_bins}
        if self.kind == "coarse":
            described |= {"linear_until": self.linear_until, "bins_per_octave": self.bins_per_octave}
        return described

    def layout(self, mask: MaskSpec) -> CellLayout:
        """The cells of `mask` on this grid (cached per grid and mask)."""
        return _layout(self, mask)


@dataclass
class CellLayout:
    """The cells of one causal (optionally windowed) mask on one grid, in row-major (query bin, offset bin)
    order. Tensors indexed by cell have shape (C,)."""

    grid: Grid
    mask: MaskSpec
    q_bin: torch.Tensor
    d_bin: torch.Tensor
    count: torch.Tensor  # float64: number of valid (i, d) pairs
    q_lo: torch.Tensor
    q_hi: torch.Tensor  # inclusive
    d_lo: torch.Tensor
    d_hi: torch.Tensor  # inclusive
    pairs: torch.Tensor  # (T, bins) float64: valid offsets of query i in offset bin b
    max_offset: torch.Tensor  # (T,): the largest valid offset of query i, min(i, W − 1)

    @property
    def num_cells(self) -> int:
        return self.q_bin.numel()

    @cached_property
    def storage_index(self) -> torch.Tensor:
        """Index of each cell in a (bins, bins) array flattened row-major, (C,)."""
        return self.q_bin * self.grid.num_bins + self.d_bin

    def cells_of(self, dense: torch.Tensor) -> torch.Tensor:
        """(..., bins, bins) indexed (query bin, offset bin) → (..., C)."""
        return dense.flatten(-2)[..., self.storage_index]

    def query_means(self, per_query: torch.Tensor) -> torch.Tensor:
        """Mean over each cell's valid pairs of a per-query quantity: (..., T) → (..., C), float64."""
        weighted = per_query.double()[..., :, None] * self.pairs  # (..., T, bins)
        dense = torch.zeros(*per_query.shape[:-1], self.grid.num_bins, self.grid.num_bins, dtype=torch.float64)
        return self.cells_of(dense.index_add_(-2, self.grid.bin_of_position, weighted)) / self.count

    def offset_means(self, per_offset: torch.Tensor) -> torch.Tensor:
        """Mean over each cell's valid pairs of a per-offset quantity v: (..., W) → (..., C), float64.

        Offset d is valid for query i when d ≤ min(i, W − 1), and v is defined for d < W only, so within query
        bin [lo, hi) offset d is reached by hi − max(lo, d) queries (none from d = hi on). A cell's sum is then
        Σ_d v(d)·(hi − max(lo, d)) over its offset bin: the offsets up to lo count hi − lo times each, those
        past lo hi − d times, so two prefix sums (of v and of d·v) read at four points per cell give it."""
        values = per_offset.double()
        width = values.shape[-1]
        sums = F.pad(values.cumsum(-1), (1, 0))  # V[x] = Σ_{d<x} v(d)
        weighted = F.pad((values * torch.arange(width, dtype=torch.float64)).cumsum(-1), (1, 0))  # Σ_{d<x} d·v(d)
        lo, hi = self.q_lo, self.q_hi + 1
        first, end = self.d_lo.clamp(max=width), (self.d_hi + 1).clamp(max=width)
        full_lo, full_hi = torch.minimum(first, lo + 1), torch.minimum(end, lo + 1)  # offsets d ≤ lo
        part_lo = torch.maximum(first, lo + 1).clamp(max=width)  # offsets lo < d < hi
        part_hi = torch.maximum(part_lo, torch.minimum(end, hi))
        full = (hi - lo).double() * (sums[..., full_hi] - sums[..., full_lo])
        partial = hi.double() * (sums[..., part_hi] - sums[..., part_lo])
        partial -= weighted[..., part_hi] - weighted[..., part_lo]
        return (full + partial) / self.count


@lru_cache(maxsize=16)
def _layout(grid: Grid, mask: MaskSpec) -> CellLayout:
    if not mask.causal or mask.prefix > 0:
        raise NotImplementedError(
            "the decomposition supports causal masks with an optional sliding window; "
            f"this layer's mask ({mask}) is not causal or has a bidirectional prefix"
        )
    seq_len = grid.seq_len
    edges = torch.tensor(grid.edges)
    window = seq_len if mask.window is None else mask.window
    max_offset = torch.clamp(torch.arange(seq_len), max=window - 1)
    # valid offsets of query i in offset bin b: |[first_b, last_b] ∩ [0, max_offset_i]|
    pairs = torch.clamp(torch.minimum(edges[None, 1:] - 1, max_offset[:, None]) - edges[None, :-1] + 1, min=0)
    dense = torch.zeros(grid.num_bins, grid.num_bins, dtype=torch.long).index_add_(0, grid.bin_of_position, pairs)
    q_bin, d_bin = torch.nonzero(dense, as_tuple=True)
    return CellLayout(
        grid=grid,
        mask=mask,
        q_bin=q_bin,
        d_bin=d_bin,
        count=dense[q_bin, d_bin].double(),
        q_lo=edges[q_bin],
        q_hi=edges[q_bin + 1] - 1,
        d_lo=edges[d_bin],
        d_hi=edges[d_bin + 1] - 1,
        pairs=pairs.double(),
        max_offset=max_offset,
    )
