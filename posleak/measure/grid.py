"""The grid of (query bin × offset bin) cells on which the decomposition accumulates (DESIGN.md §3.1).

Query positions i ∈ [0, T) and offsets d = i − j ∈ [0, T) are cut into bins with the same edges:
one position per bin below `linear_until`, geometric beyond (`bins_per_octave` bins per doubling,
edges rounded to integers and kept strictly increasing). The exact grid has one position per bin
everywhere. A cell (query bin a, offset bin b) holds the valid pairs (i, d) of a mask with i ∈ a and
d ∈ b; only cells with at least one valid pair exist. `CellLayout` lists them in row-major (a, b)
order and carries the tables that map per-query and per-offset quantities onto cells.
"""

from __future__ import annotations

import warnings
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
    def near_bins(self) -> int:
        """The leading bins of one position each: offsets (and queries) below this have a bin of their own."""
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
    """The cells of one mask on one grid, in row-major (query bin, offset bin) order.

    Every tensor indexed by cell has shape (C,). `query_to_cell` is a sparse (C, T) matrix: row c holds,
    for each query i of cell c, the share of the cell's pairs that belong to i, so that multiplying a
    per-query quantity by it gives the quantity's mean over the cell's valid pairs.
    """

    grid: Grid
    mask: MaskSpec
    q_bin: torch.Tensor
    d_bin: torch.Tensor
    count: torch.Tensor  # float64: number of valid (i, d) pairs
    q_lo: torch.Tensor
    q_hi: torch.Tensor  # inclusive
    d_lo: torch.Tensor
    d_hi: torch.Tensor  # inclusive
    query_to_cell: torch.Tensor  # sparse CSR, float64
    max_offset: torch.Tensor  # (T,): the largest valid offset of query i, min(i, W − 1)
    uniform: torch.Tensor  # (C,) bool: every query of the cell's bin has the same number of pairs in it
    partial_to_cell: torch.Tensor  # sparse CSR (P, T): the rows of query_to_cell of the cells not uniform

    @property
    def num_cells(self) -> int:
        return self.q_bin.numel()

    @property
    def storage_shape(self) -> tuple[int, int]:
        """Cell sums are accumulated in a dense array per head: (query bins, offset bins) on a coarse grid,
        (T, min(T, W)) indexed (i, d) on the exact grid, so that a block of logits re-indexed by offset
        adds in place without a gather. Entries of no cell (d > i) stay 0."""
        if self.grid.kind == "exact":
            return self.grid.seq_len, int(self.max_offset.max()) + 1
        return self.grid.num_bins, self.grid.num_bins

    @cached_property
    def storage_index(self) -> torch.Tensor:
        """Index of each cell in the storage array flattened row-major, (C,)."""
        return self.q_bin * self.storage_shape[1] + self.d_bin

    @cached_property
    def offset_count(self) -> torch.Tensor:
        """Valid pairs per offset bin, shape (bins,), float64 (0 for bins beyond the window)."""
        return torch.zeros(self.grid.num_bins, dtype=torch.float64).index_add_(0, self.d_bin, self.count)

    @cached_property
    def last_bin(self) -> torch.Tensor:
        """The offset bin holding query i's largest valid offset, shape (T,)."""
        return self.grid.bin_of_position[self.max_offset]

    @cached_property
    def last_bin_count(self) -> torch.Tensor:
        """How many of query i's valid offsets fall in its last bin, shape (T,), float64."""
        edges = torch.tensor(self.grid.edges)
        return (self.max_offset - edges[self.last_bin] + 1).double()

    @cached_property
    def bin_width(self) -> torch.Tensor:
        """Offsets per bin, shape (bins,), float64."""
        edges = torch.tensor(self.grid.edges, dtype=torch.float64)
        return edges[1:] - edges[:-1]

    @cached_property
    def query_bin_mean(self) -> torch.Tensor:
        """Sparse CSR (bins, T): row a averages a per-query quantity over query bin a. On a uniform cell
        the mean over its pairs is its query bin's mean (see `to_cells`, and resampled.py)."""
        bins = self.grid.bin_of_position
        return _sparse_rows(bins, torch.arange(self.grid.seq_len), 1 / self.bin_width[bins], self.grid.seq_len)

    @cached_property
    def partial(self) -> torch.Tensor:
        """Indices of the cells that are not uniform, (P,), in the row order of `partial_to_cell`."""
        return (~self.uniform).nonzero().flatten()

    def inside(self, lo: int, hi: int) -> torch.Tensor:
        """Cells whose query bin lies wholly in lo ≤ i < hi, shape (C,) bool.

        A query bin straddling a range boundary is left out rather than split: its cells are means over
        all of the bin's queries. On the default grid bins below 64 hold one position, so the early
        range (K ≤ 64) is never affected; only the bin holding query 0 is excluded from `all`.
        """
        return (self.q_lo >= lo) & (self.q_hi < hi)

    def to_cells(self, per_query: torch.Tensor) -> torch.Tensor:
        """Mean over each cell's valid pairs of a per-query quantity: (..., T) → (..., C), float64."""
        if self.grid.near_bins == self.grid.seq_len:  # one query per bin: each cell reads its own query
            return per_query.double()[..., self.q_bin]
        return _rows_times(self.query_to_cell, per_query)

    def bin_means(self, per_query: torch.Tensor) -> torch.Tensor:
        """Mean over each query bin: (..., T) → (..., bins), float64; a uniform cell's `to_cells` value."""
        return _rows_times(self.query_bin_mean, per_query)

    def partial_means(self, per_query: torch.Tensor) -> torch.Tensor:
        """`to_cells` on the non-uniform cells only: (..., T) → (..., P), float64."""
        return _rows_times(self.partial_to_cell, per_query)

    def from_offsets(self, per_bin: torch.Tensor) -> torch.Tensor:
        """A per-offset-bin quantity on each cell: (..., bins) → (..., C)."""
        return per_bin[..., self.d_bin]

    def offset_sums(self, per_cell: torch.Tensor) -> torch.Tensor:
        """Sum of a per-cell quantity over the cells of each offset bin: (..., C) → (..., bins)."""
        out = torch.zeros(*per_cell.shape[:-1], self.grid.num_bins, dtype=per_cell.dtype)
        return out.index_add_(-1, self.d_bin, per_cell)


@lru_cache(maxsize=16)
def _layout(grid: Grid, mask: MaskSpec) -> CellLayout:
    if not mask.causal or mask.prefix > 0:
        raise NotImplementedError(
            "the decomposition supports causal masks with an optional sliding window; "
            f"this layer's mask ({mask}) is not causal or has a bidirectional prefix"
        )
    seq_len, bins = grid.seq_len, grid.num_bins
    edges = torch.tensor(grid.edges)
    window = seq_len if mask.window is None else mask.window
    max_offset = torch.clamp(torch.arange(seq_len), max=window - 1)
    # valid offsets of query i in offset bin b: |[first_b, last_b] ∩ [0, max_offset_i]|
    per_query = torch.clamp(
        torch.minimum(edges[None, 1:] - 1, max_offset[:, None]) - edges[None, :-1] + 1, min=0
    )  # (T, bins)
    query_bin = grid.bin_of_position
    dense = torch.zeros(bins, bins, dtype=torch.long).index_add_(0, query_bin, per_query)
    q_bin, d_bin = torch.nonzero(dense, as_tuple=True)
    count = dense[q_bin, d_bin].double()
    cell_of = torch.full((bins * bins,), -1, dtype=torch.long)
    cell_of[q_bin * bins + d_bin] = torch.arange(q_bin.numel())
    query, offset_bin = torch.nonzero(per_query, as_tuple=True)
    cell = cell_of[query_bin[query] * bins + offset_bin]
    pairs = per_query[query, offset_bin]
    share = pairs.double() / count[cell]
    # uniform: the cell holds every query of its bin, each with the same number of pairs
    cells = q_bin.numel()
    queries = torch.bincount(cell, minlength=cells)
    fewest = torch.full((cells,), seq_len, dtype=torch.long).scatter_reduce_(0, cell, pairs, "amin")
    most = torch.zeros(cells, dtype=torch.long).scatter_reduce_(0, cell, pairs, "amax")
    uniform = (queries == edges[q_bin + 1] - edges[q_bin]) & (fewest == most)
    partial_row = torch.cumsum(~uniform, 0) - 1  # row of each non-uniform cell in partial_to_cell
    in_partial = ~uniform[cell]
    return CellLayout(
        grid=grid,
        mask=mask,
        q_bin=q_bin,
        d_bin=d_bin,
        count=count,
        q_lo=edges[q_bin],
        q_hi=edges[q_bin + 1] - 1,
        d_lo=edges[d_bin],
        d_hi=edges[d_bin + 1] - 1,
        query_to_cell=_sparse_rows(cell, query, share, seq_len),
        max_offset=max_offset,
        uniform=uniform,
        partial_to_cell=_sparse_rows(partial_row[cell[in_partial]], query[in_partial], share[in_partial], seq_len),
    )


def _rows_times(matrix: torch.Tensor, per_query: torch.Tensor) -> torch.Tensor:
    """A sparse (rows, T) matrix applied to the last dimension of per-query values: (..., T) → (..., rows)."""
    lead, seq_len = per_query.shape[:-1], per_query.shape[-1]
    columns = per_query.double().reshape(-1, seq_len).T.contiguous()
    return (matrix @ columns).T.reshape(*lead, matrix.shape[0])


def _sparse_rows(row: torch.Tensor, column: torch.Tensor, value: torch.Tensor, columns: int) -> torch.Tensor:
    """A sparse CSR matrix (an order of magnitude faster than gathers and index_add for `to_cells`)."""
    shape = (int(row.max()) + 1 if row.numel() else 0, columns)
    coo = torch.sparse_coo_tensor(torch.stack([row, column]), value, shape, check_invariants=True).coalesce()
    with warnings.catch_warnings():  # torch flags CSR support as beta; matrix products with it are stable
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return coo.to_sparse_csr()
