"""ΔR² leakage (docs/method.md) from running sums.

Per head, ordinary least squares of y over all valid (n, i, j) on [1, d] (relative) and on [1, i, j]
(full), for y = s (logit) and y = ℓ = s − log Z_i (log-attention); ΔR² = R²_full − R²_rel. Because
d = i − j, [1, d] is nested in [1, i, j]. The sums needed are Σy, Σy², Σy·i, Σy·j over the data and the
moments of i and j over the valid pairs, which follow from the mask alone (`KeyRanges`).

The layer's sums (layer_sums.py) supply per sequence and query the row sum R_i = Σ_j s_ij, over all
sequences Σ_d d·s_{i,i−d} per query, and Σ s² (the Gram matrices' trace); the ℓ sums then follow from
z_i = log Z_i: Σℓ = Σs − Σ_i n_i z_i, Σℓ·i = Σs·i − Σ_i i n_i z_i, Σℓ·j = Σs·j − Σ_i z_i J_i,
Σℓ² = Σs² − 2 Σ_i z_i R_i + Σ_i n_i z_i²   (n_i valid keys of query i, J_i = Σ of their positions).
Every term comes from the same float64 logits, so the sums are consistent and cancel only in float64.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from posleak.capture.masks import MaskSpec
from posleak.measure.layer_sums import LayerSums

# Order of the eight running sums kept per head: y = s, then y = ℓ.
SUM_FIELDS = ("s", "ss", "si", "sj", "l", "ll", "li", "lj")
# Relative size below which a variance or a determinant counts as zero (a degenerate design).
_DEGENERATE = 1e-12


# ------------------------------------------------------------------------------------------ design


@dataclass(frozen=True)
class KeyRanges:
    """The valid keys of each query under a causal (optionally windowed) mask: j ∈ [first_i, i]."""

    count: torch.Tensor  # (T,) float64: n_i
    j_sum: torch.Tensor  # (T,) float64: Σ_j j
    j_sq_sum: torch.Tensor  # (T,) float64: Σ_j j²

    @staticmethod
    def of(mask: MaskSpec, seq_len: int) -> KeyRanges:
        return _key_ranges(mask, seq_len)


@lru_cache(maxsize=16)
def _key_ranges(mask: MaskSpec, seq_len: int) -> KeyRanges:
    if not mask.causal or mask.prefix > 0:
        raise NotImplementedError(f"ΔR² supports causal masks with an optional sliding window, not {mask}")
    last = torch.arange(seq_len, dtype=torch.float64)
    first = torch.zeros_like(last) if mask.window is None else torch.clamp(last - mask.window + 1, min=0)

    def power_sum(upto: torch.Tensor, power: int) -> torch.Tensor:  # Σ_{j=0}^{upto} j^power, exact in float64
        return upto * (upto + 1) / 2 if power == 1 else upto * (upto + 1) * (2 * upto + 1) / 6

    return KeyRanges(
        count=last - first + 1,
        j_sum=power_sum(last, 1) - power_sum(first - 1, 1),
        j_sq_sum=power_sum(last, 2) - power_sum(first - 1, 2),
    )


@dataclass(frozen=True)
class DesignMoments:
    """Means, variances and covariance of i and j over all valid (n, i, j); independent of n."""

    count: float  # number of valid (n, i, j)
    mean_i: float
    mean_j: float
    var_i: float
    var_j: float
    cov_ij: float

    @staticmethod
    def of(mask: MaskSpec, seq_len: int, num_seqs: int) -> DesignMoments:
        ranges = KeyRanges.of(mask, seq_len)
        i = torch.arange(seq_len, dtype=torch.float64)
        pairs = ranges.count.sum()
        mean_i = (i * ranges.count).sum() / pairs
        mean_j = ranges.j_sum.sum() / pairs
        return DesignMoments(
            count=float(pairs) * num_seqs,
            mean_i=float(mean_i),
            mean_j=float(mean_j),
            var_i=float((i * i * ranges.count).sum() / pairs - mean_i**2),
            var_j=float(ranges.j_sq_sum.sum() / pairs - mean_j**2),
            cov_ij=float((i * ranges.j_sum).sum() / pairs - mean_i * mean_j),
        )


def delta_r2(sums: torch.Tensor, design: DesignMoments) -> torch.Tensor:
    """ΔR² for y = s and y = ℓ from the running sums (..., 8) → (..., 2); NaN where the design or y
    is degenerate (a constant y, or i and j — or d — without spread, as at T = 1 or a window of 1)."""
    return torch.stack([_delta_r2_one(sums[..., k : k + 4], design) for k in (0, 4)], dim=-1)


def _delta_r2_one(sums: torch.Tensor, design: DesignMoments) -> torch.Tensor:
    # Centred moments: the raw normal equations are badly conditioned for long sequences (i ~ T).
    n = design.count
    mean_y = sums[..., 0] / n
    var_y = sums[..., 1] / n - mean_y**2
    cov_yi = sums[..., 2] / n - mean_y * design.mean_i
    cov_yj = sums[..., 3] / n - mean_y * design.mean_j
    var_d = design.var_i - 2 * design.cov_ij + design.var_j
    det = design.var_i * design.var_j - design.cov_ij**2
    # full model [1, i, j]: explained variance c_yᵀ C⁻¹ c_y with C the covariance of (i, j)
    explained_full = (design.var_j * cov_yi**2 - 2 * design.cov_ij * cov_yi * cov_yj + design.var_i * cov_yj**2) / det
    explained_rel = (cov_yi - cov_yj) ** 2 / var_d
    scale_y = sums[..., 1] / n
    degenerate = (
        (var_y <= _DEGENERATE * scale_y)
        | (det <= _DEGENERATE * design.var_i * design.var_j)
        | (var_d <= _DEGENERATE * (design.var_i + design.var_j))
    )
    result = (explained_full - explained_rel) / var_y
    return torch.where(degenerate, torch.full_like(result, float("nan")), result)


# ------------------------------------------------------------------------------------ the sums


def running_sums(sums: LayerSums) -> torch.Tensor:
    """The eight sums of SUM_FIELDS per head, (H, 8) float64, from one layer's logit-pass sums.

    With R_n(i) = Σ_d s_{i,i−d}, z = log Z and Σ_d d·s per query: Σ_j j·s_ij = i·R(i) − Σ_d d·s_{i,i−d};
    Σ s² is the trace of the Gram matrices; the ℓ = s − log Z sums follow from z (module docstring).
    """
    ranges = KeyRanges.of(sums.mask, sums.seq_len)
    n, j_sum = ranges.count, ranges.j_sum
    i = torch.arange(sums.seq_len, dtype=torch.float64)
    rows, z = sums.rows, sums.log_z  # (N, H, T)
    total = rows.sum(0)  # (H, T)
    s = total.sum(-1)
    si = (total * i).sum(-1)
    sj = si - sums.offset_weighted.sum(-1)
    ss = sums.gram.diagonal(dim1=-2, dim2=-1).sum(dim=(0, -1))
    return torch.stack(
        [
            s,
            ss,
            si,
            sj,
            s - (n * z).sum(dim=(0, -1)),
            ss - 2 * (z * rows).sum(dim=(0, -1)) + (n * z * z).sum(dim=(0, -1)),
            si - (i * n * z).sum(dim=(0, -1)),
            sj - (j_sum * z).sum(dim=(0, -1)),
        ],
        dim=-1,
    )
