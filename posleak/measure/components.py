"""g, m and r of DESIGN.md §3.1 from a layer's per-unit sums, and the magnitudes of §3.1.

The sums (decomposition.py) are kept per unit: per sequence, or per half A / B when per-sequence sums do
not fit the memory budget (`Units`). Every quantity here is computed for R weightings of the units at
once: the point estimate is the weighting of all ones, a bootstrap resample draws integer weights
(bootstrap.py). resampled.py computes the same magnitudes for many resamples from second moments.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import torch

from posleak.measure.grid import CellLayout, Grid

UnitMode = Literal["sequence", "halves"]
MAGNITUDES = ("mask_early", "mask_all", "resid_early", "resid_all", "resid_early_raw", "resid_all_raw")


@dataclass(frozen=True)
class Units:
    """How the N sequences are grouped into the units whose sums are kept (module docstring).

    In "halves" mode only the non-empty ones of A, B and rest are kept: N even → A, B; N = 1 → rest.
    """

    mode: UnitMode
    num_seqs: int

    def _half(self, sequence_index: torch.Tensor) -> torch.Tensor:
        """0 = A (index < ⌊N/2⌋), 1 = B (⌊N/2⌋ ≤ index < 2⌊N/2⌋), 2 = rest."""
        half = self.num_seqs // 2
        return (sequence_index >= half).long() + (sequence_index >= 2 * half).long()

    @property
    def _present(self) -> torch.Tensor:
        return self._half(torch.arange(self.num_seqs)).unique()

    @property
    def count(self) -> int:
        return self.num_seqs if self.mode == "sequence" else self._present.numel()

    def of(self, sequence_index: torch.Tensor) -> torch.Tensor:
        """The unit of each sequence index."""
        if self.mode == "sequence":
            return sequence_index
        return torch.searchsorted(self._present, self._half(sequence_index))

    @property
    def sizes(self) -> torch.Tensor:
        """Sequences per unit, (U,) float64."""
        return torch.zeros(self.count, dtype=torch.float64).index_add_(
            0, self.of(torch.arange(self.num_seqs)), torch.ones(self.num_seqs, dtype=torch.float64)
        )

    @property
    def halves(self) -> torch.Tensor:
        """Half of each unit, (U,): 0 = A, 1 = B, −1 = neither (the odd last sequence)."""
        half = self._half(torch.arange(self.num_seqs)) if self.mode == "sequence" else self._present
        return torch.where(half == 2, -1, half)


@dataclass
class Components:
    """g, m and r of one layer for R (re)samples: shapes (R, H, bins), (R, H, T), (R, H, C)."""

    g: torch.Tensor  # per offset bin: mean of s over its valid pairs (NaN for a bin beyond the window)
    m: torch.Tensor  # per query
    m_cell: torch.Tensor
    r: torch.Tensor
    r_a: torch.Tensor  # r of half A (with g and m of the whole sample)
    r_b: torch.Tensor
    mean_s: torch.Tensor  # per cell, mean over n and the cell's pairs of s


@dataclass
class UnitArrays:
    """A layer's per-unit sums on its cells, (U, H, C) float64: Σ of s over each cell's pairs, and Σ over
    sequences of the mean of log Z_i over each cell's pairs. Both are linear in the sequences, so a
    resample's sums are weights × these. `sink` (H,) and `sigmoid` say how the layer normalises."""

    cells: torch.Tensor
    log_z: torch.Tensor
    sink: torch.Tensor | None
    sigmoid: bool


def components(arrays: UnitArrays, layout: CellLayout, units: Units, weights: torch.Tensor) -> Components:
    """g, m, r from the unit sums under weights (R, U): resampled sums are weights × unit sums."""

    def weighted(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # sums of s and of log Z on cells, and the number of sequences, of each (re)sample
        return (
            _weighted_sum(w, arrays.cells),
            _weighted_sum(w, arrays.log_z),
            (w @ units.sizes)[:, None, None],
        )

    cells, log_z, size = weighted(weights)
    g = layout.offset_sums(cells) / (size * layout.offset_count)
    m = mask_component(g, layout, arrays.sink, arrays.sigmoid)
    g_cell, m_cell = layout.from_offsets(g), layout.to_cells(m)

    def residual(cells: torch.Tensor, log_z: torch.Tensor, size: torch.Tensor) -> torch.Tensor:
        # r = mean over the cell's pairs and n of (s − g(d)) − (log Z_i + m(i)), with the whole sample's g and m;
        # in place: on the exact grid these arrays are large
        return cells.div_(layout.count).sub_(log_z).div_(size).sub_(g_cell).sub_(m_cell)

    r_a, r_b = (residual(*weighted(weights * (units.halves == half))) for half in (0, 1))
    mean_s = cells / (size * layout.count)
    return Components(g=g, m=m, m_cell=m_cell, r=residual(cells, log_z, size), r_a=r_a, r_b=r_b, mean_s=mean_s)


def _weighted_sum(weights: torch.Tensor, per_unit: torch.Tensor) -> torch.Tensor:
    """(R, U) × (U, ...) → (R, ...): one matrix product (einsum takes a slow path for large trailing sizes)."""
    return (weights @ per_unit.flatten(1)).view(weights.shape[0], *per_unit.shape[1:])


def mask_component(g: torch.Tensor, layout: CellLayout, sink: torch.Tensor | None, sigmoid: bool) -> torch.Tensor:
    """m(i) = −log(Σ over query i's valid offsets of exp g(d) [+ exp sink]), (..., H, bins) → (..., H, T).

    With offsets binned, each offset takes its bin's g: the bins wholly below query i's largest valid
    offset contribute width·exp g (a running log-sum-exp over bins), its last bin the valid part of it.
    """
    if sigmoid:  # no normaliser, no mask component (module docstring)
        return torch.zeros(*g.shape[:-1], layout.grid.seq_len, dtype=torch.float64)
    present = layout.offset_count > 0
    terms = torch.where(present, g + layout.bin_width.log(), float("-inf"))
    below = torch.logcumsumexp(terms, dim=-1)
    last = layout.last_bin
    before = torch.where(last > 0, below[..., (last - 1).clamp(min=0)], float("-inf"))
    log_sum = torch.logaddexp(before, g[..., last] + layout.last_bin_count.log())
    if sink is not None:
        log_sum = torch.logaddexp(log_sum, sink[:, None])
    return -log_sum


def magnitudes(parts: Components, layout: CellLayout, ranges: dict[str, tuple[int, int]]) -> dict[str, torch.Tensor]:
    """Every magnitude of MAGNITUDES, each (R, H): RMS over the range's cells (weighted by their pairs) of
    the component minus its mean; the corrected r uses the covariance of the two halves' deviations."""
    out = {}
    for name, (lo, hi) in ranges.items():
        cells = CellRange.of(layout, lo, hi)
        out[f"mask_{name}"] = cells.mean(cells.centred(parts.m_cell).square_()).sqrt()
        out[f"resid_{name}_raw"] = cells.mean(cells.centred(parts.r).square_()).sqrt()
        corrected = cells.mean(cells.centred(parts.r_a).mul_(cells.centred(parts.r_b)))
        out[f"resid_{name}"] = corrected.clamp(min=0).sqrt()  # clamp keeps NaN (an empty half)
    return {name: out[name] for name in MAGNITUDES}


@dataclass(frozen=True)
class CellRange:
    """Pair-weighted means over the cells of a query range. A narrow range is copied out of the per-cell
    arrays; a wide one is weighted in place (weight 0 outside), which passes over memory fewer times."""

    inside: torch.Tensor
    narrow: bool
    weight: torch.Tensor  # sums to 1 (NaN for an empty range)

    @staticmethod
    def of(layout: CellLayout, lo: int, hi: int) -> CellRange:
        inside = layout.inside(lo, hi)
        narrow = 2 * int(inside.sum()) < inside.numel()
        weight = layout.count[inside] if narrow else layout.count * inside
        return CellRange(inside, narrow, weight / weight.sum())

    def mean(self, values: torch.Tensor) -> torch.Tensor:
        """(..., C or C_inside) → (...)."""
        return values @ self.weight

    @property
    def on_all_cells(self) -> torch.Tensor:
        """The weights on every cell of the layout, 0 outside the range, (C,)."""
        if not self.narrow:
            return self.weight
        return torch.zeros(self.inside.shape, dtype=torch.float64).masked_scatter_(self.inside, self.weight)

    def centred(self, values: torch.Tensor) -> torch.Tensor:
        values = values[..., self.inside] if self.narrow else values
        return values - self.mean(values)[..., None]


@dataclass
class LayerProfile:
    """One layer's point estimates on the cells of `layout` (H heads, C cells): the measurement grid's,
    or a coarser grid's for tables (then each cell value is the count-weighted mean over the finer cells)."""

    layer: int
    layout: CellLayout
    g: torch.Tensor  # (H, bins of the measurement grid): g per offset bin (NaN for bins beyond the window)
    m: torch.Tensor  # (H, T): m(i) per query
    g_cell: torch.Tensor  # (H, C): mean of g over each cell's pairs
    m_cell: torch.Tensor  # (H, C): mean of m over each cell's pairs
    r: torch.Tensor  # (H, C)
    offset_map: torch.Tensor  # (C,): mean over n and heads of s_ij − g(i − j), §3.2

    def on(self, grid: Grid | None) -> LayerProfile:
        """The profile on `grid`'s cells (itself when `grid` is None or its own)."""
        if grid is None or grid == self.layout.grid:
            return self
        coarse = grid.layout(self.layout.mask)
        values = {name: rebin(getattr(self, name), self.layout, coarse) for name in ("g_cell", "m_cell", "r")}
        return replace(self, layout=coarse, offset_map=rebin(self.offset_map, self.layout, coarse), **values)


def rebin(values: torch.Tensor, fine: CellLayout, coarse: CellLayout) -> torch.Tensor:
    """Per-cell values (..., C) of `fine` as count-weighted means over the cells of `coarse`.

    Exact only when every fine cell lies inside one coarse cell (always so from the exact grid)."""
    bins = coarse.grid.num_bins
    position_bin = coarse.grid.bin_of_position
    lookup = torch.full((bins * bins,), -1, dtype=torch.long)
    lookup[coarse.q_bin * bins + coarse.d_bin] = torch.arange(coarse.num_cells)
    target = lookup[position_bin[fine.q_lo] * bins + position_bin[fine.d_lo]]
    weight = fine.count.to(values.dtype)
    sums = torch.zeros(*values.shape[:-1], coarse.num_cells, dtype=values.dtype)
    totals = torch.zeros(coarse.num_cells, dtype=values.dtype).index_add_(0, target, weight)
    return sums.index_add_(-1, target, values * weight) / totals
