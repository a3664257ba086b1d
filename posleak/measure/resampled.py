"""Bootstrap magnitudes for many resamples at once, from second moments over cells.

In a resample with unit weights w, r, r^A and r^B are linear in the weighted unit sums except through
m, which depends on the resample's g by a log-sum-exp. Each is written as a·F − δm: F holds a few
per-cell features fixed for the layer (the units' deviations from the mean of the sums, the point
estimate of r, and m of the point estimate), a holds coefficients that depend only on w, and
δm = m(w) − m(point). The mask component is m = F_m + δm. A magnitude needs the mean and the second
moment of such quantities over a range's cells, weighted by ω; they follow from
  Σω F and Σω F Fᵀ            once per layer and range, (K) and (K, K) per head, and
  Σω F δm, Σω δm, Σω δm²     per resample, from δm per query alone,
because on a *uniform* cell (every query of the bin holds the same number of its pairs) the mean of δm
over the cell is the mean over its query bin; only the few other cells need their own mean.
The cost per resample is O(H·(T + K²)) instead of forming (R, H, C) arrays, and the features are
deviations of size r (not logits), which keeps the expanded products from cancelling.
`components.magnitudes` on `components.components` with the same weights is the reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from posleak.measure.components import MAGNITUDES, CellRange, Components, UnitArrays, Units, mask_component
from posleak.measure.grid import CellLayout


@dataclass
class _Quantity:
    """a·F + sign·δm for each resample: coefficients (R, K)."""

    coefficients: torch.Tensor
    sign: float


@dataclass
class _Moments:
    """Over one range's cells, weighted by ω: Σω F (K, H) and Σω F Fᵀ (H, K, K), and per resample
    Σω F δm (R, H, K), Σω δm and Σω δm² (R, H)."""

    first: torch.Tensor
    second: torch.Tensor
    with_delta: torch.Tensor
    delta_mean: torch.Tensor
    delta_square: torch.Tensor

    @staticmethod
    def of(
        features: torch.Tensor,
        layout: CellLayout,
        weight: torch.Tensor,
        delta_uniform: torch.Tensor,
        delta_partial: torch.Tensor,
    ) -> _Moments:
        """`delta_uniform`: δm's mean over each query bin (R, H, bins), its value on every uniform cell;
        `delta_partial`: its mean on each cell that is not uniform (R, H, P)."""
        weighted = features * weight
        uniform, partial = layout.uniform, layout.partial
        bins = torch.zeros(layout.grid.num_bins, dtype=torch.float64)
        weight_uniform = bins.index_add(0, layout.q_bin[uniform], weight[uniform])
        features_uniform = torch.zeros(*features.shape[:2], bins.numel(), dtype=torch.float64).index_add_(
            -1, layout.q_bin[uniform], weighted[..., uniform]
        )
        return _Moments(
            first=weighted.sum(-1),
            second=weighted.permute(1, 0, 2) @ features.permute(1, 2, 0),
            with_delta=torch.einsum("rhb,khb->rhk", delta_uniform, features_uniform)
            + torch.einsum("rhp,khp->rhk", delta_partial, weighted[..., partial]),
            delta_mean=delta_uniform @ weight_uniform + delta_partial @ weight[partial],
            delta_square=delta_uniform.square() @ weight_uniform + delta_partial.square() @ weight[partial],
        )

    def mean(self, x: _Quantity) -> torch.Tensor:
        return x.coefficients @ self.first + x.sign * self.delta_mean

    def covariance(self, x: _Quantity, y: _Quantity) -> torch.Tensor:
        product = (
            torch.einsum("rk,hkl,rl->rh", x.coefficients, self.second, y.coefficients)
            + y.sign * torch.einsum("rk,rhk->rh", x.coefficients, self.with_delta)
            + x.sign * torch.einsum("rk,rhk->rh", y.coefficients, self.with_delta)
            + x.sign * y.sign * self.delta_square
        )
        return product - self.mean(x) * self.mean(y)


def resampled_magnitudes(
    arrays: UnitArrays,
    layout: CellLayout,
    units: Units,
    weights: torch.Tensor,
    ranges: dict[str, tuple[int, int]],
    point: Components,
) -> dict[str, torch.Tensor]:
    """Every magnitude of MAGNITUDES for each row of weights (R, U), each (R, H); `point` is
    `components` of the whole sample (weights of ones)."""
    features = _features(arrays, layout, units, point)
    sizes = units.sizes
    count = weights @ sizes
    half_a, half_b = (weights * (units.halves == half) for half in (0, 1))

    def residual(own: torch.Tensor) -> _Quantity:  # r of the units `own` with g and m of the whole resample
        one = torch.ones(weights.shape[0], 1, dtype=torch.float64)
        coefficients = [own / (own @ sizes)[:, None], -weights / count[:, None], one, torch.zeros_like(one)]
        return _Quantity(torch.cat(coefficients, dim=1), -1.0)

    r, r_a, r_b = residual(weights), residual(half_a), residual(half_b)
    mask = _Quantity(torch.zeros_like(r.coefficients), 1.0)
    mask.coefficients[:, -1] = 1.0  # m = m of the point estimate + δm

    # δm per query for each resample: g from the units' per-offset-bin sums, then m
    offset_sums = layout.offset_sums(arrays.cells)  # (U, H, bins)
    g = torch.einsum("ru,uhb->rhb", weights, offset_sums) / (count[:, None, None] * layout.offset_count)
    delta = mask_component(g, layout, arrays.sink, arrays.sigmoid) - point.m
    delta_uniform, delta_partial = layout.bin_means(delta), layout.partial_means(delta)

    out = {}
    for name, (lo, hi) in ranges.items():
        weight = CellRange.of(layout, lo, hi).on_all_cells
        moments = _Moments.of(features, layout, weight, delta_uniform, delta_partial)
        out[f"mask_{name}"] = moments.covariance(mask, mask).clamp(min=0).sqrt()
        out[f"resid_{name}_raw"] = moments.covariance(r, r).clamp(min=0).sqrt()
        out[f"resid_{name}"] = moments.covariance(r_a, r_b).clamp(min=0).sqrt()  # clamp keeps NaN (an empty half)
    return {name: out[name] for name in MAGNITUDES}


def _features(arrays: UnitArrays, layout: CellLayout, units: Units, point: Components) -> torch.Tensor:
    """F (K = 2U + 2, H, C): per unit u the deviation of Σ (s/count − log Z) and of Σ g from size_u times
    their means over sequences, then r and m of the point estimate on cells."""
    sizes = units.sizes[:, None, None]
    own = arrays.cells / layout.count - arrays.log_z
    relative = layout.from_offsets(layout.offset_sums(arrays.cells) / layout.offset_count)
    deviations = [x - sizes * x.sum(0) / sizes.sum() for x in (own, relative)]
    return torch.cat([*deviations, point.r, point.m_cell])
