"""g, m and r of docs/method.md and their magnitudes over single (i, d) pairs, from a layer's sums.

Everything is computed for R weightings of the N sequences at once: the point estimate is the weighting of
all ones, a bootstrap resample the number of times each sequence was drawn (bootstrap.py). Every sum in
`LayerSums` is a sum over sequences, so a resample's sums are weights × per-sequence sums and its Gram
sums are wᵀ G w: a resample costs O(H·(T + N²)) and no pass over the logits.

With the groups X of sequences (all, half A = the first ⌊N/2⌋, half B = the next ⌊N/2⌋), a_X(i, d) the
weighted mean over X of s_{i,i−d}, g the relative part and m the causal-mask component of the whole
(re)sample, c_X(i) = mean over X of log Z_i + m(i) and r_X = a_X − g − c_X, the sums over the cells of
a query range Q are

  Σ r_X     = Σ_i R̄_X(i) − Σ_i P(i) − Σ_i n_i c_X(i)
  Σ r_X r_Y = Σ a_X a_Y − Σ_d g(d) (C_X(d) + C_Y(d)) − Σ_i (c_Y R̄_X + c_X R̄_Y)(i)
              + Σ_i P₂(i) + Σ_i (c_X + c_Y)(i) P(i) + Σ_i n_i c_X(i) c_Y(i)

over i ∈ Q, where R̄_X are row sums and C_X column sums over Q of a_X, Σ a_X a_Y = w_Xᵀ G_Q w_Y / (W_X W_Y),
n_i = D_i + 1 the valid offsets of query i, P(i) = Σ_{d≤D_i} g(d) and P₂(i) = Σ_{d≤D_i} g(d)². The terms
are of the size of logits and r is smaller, so the expansion costs a few of float64's sixteen digits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from posleak.measure.grid import CellLayout
from posleak.measure.layer_sums import LayerSums

MAGNITUDES = ("mask_early", "mask_all", "resid_early", "resid_all", "resid_early_raw", "resid_all_raw")
# (R, H, T) float64 elements per array in one chunk of resamples (about a dozen such arrays are alive).
_CHUNK_ELEMENTS = 1 << 21


def halves(num_seqs: int) -> torch.Tensor:
    """The half of each sequence, (N,): 0 = A (index < ⌊N/2⌋), 1 = B (next ⌊N/2⌋), −1 = the odd last one."""
    half = num_seqs // 2
    index = torch.arange(num_seqs)
    return torch.where(index < half, 0, torch.where(index < 2 * half, 1, -1))


def relative_part(sums: LayerSums, weights: torch.Tensor) -> torch.Tensor:
    """g(d) = mean over the weighted sequences and valid queries of s_{i,i−d}: (R, N) → (R, H, W)."""
    columns = sums.columns.sum(0)  # (N, H, W): over all queries
    return torch.einsum("rn,nhd->rhd", weights, columns) / (weights.sum(1)[:, None, None] * sums.offset_count)


def mask_component(g: torch.Tensor, sums: LayerSums) -> torch.Tensor:
    """m(i) = −log(Σ_{d ≤ D_i} exp g(d) [+ exp sink]) for g (..., H, W) → (..., H, T); 0 for sigmoid
    attention, which has no normaliser. A learned sink logit is a position-independent term of the
    denominator, so purely relative logits give r ≡ 0 with or without one."""
    if sums.sigmoid:
        return torch.zeros(*g.shape[:-1], sums.seq_len, dtype=torch.float64)
    log_sum = torch.logcumsumexp(g, dim=-1)[..., sums.max_offset]
    if sums.sink is not None:
        log_sum = torch.logaddexp(log_sum, sums.sink[:, None])
    return -log_sum


def magnitudes(sums: LayerSums, weights: torch.Tensor, ranges: dict[str, tuple[int, int]]) -> dict[str, torch.Tensor]:
    """Every magnitude of MAGNITUDES for each row of `weights` (R, N), each (R, H). Magnitudes are RMS over
    the range's valid (i, d) pairs of the component minus its mean; the corrected r is the square root of
    the covariance of the two halves' r (NaN when a half is empty), the raw one is beside it."""
    chunk = max(1, _CHUNK_ELEMENTS // (sums.rows.shape[1] * sums.seq_len))
    parts = [_magnitudes(sums, weights[r0 : r0 + chunk], ranges) for r0 in range(0, weights.shape[0], chunk)]
    return {name: torch.cat([part[name] for part in parts]) for name in MAGNITUDES}


def _magnitudes(sums: LayerSums, weights: torch.Tensor, ranges: dict[str, tuple[int, int]]) -> dict[str, torch.Tensor]:
    terms = _RowTerms.of(sums, weights)
    out = {}
    for name, (lo, hi) in ranges.items():
        segments = sums.segments(lo, hi)
        out |= terms.range_magnitudes(name, slice(lo, hi), sums.columns[segments].sum(0), sums.gram[segments].sum(0))
    return {name: out[name] for name in MAGNITUDES}


@dataclass
class _RowTerms:
    """Per resample (R), head and query: what the sums over a range's cells need besides its column sums
    and Gram matrix (module docstring). Groups X: "all", "a", "b"."""

    groups: dict[str, torch.Tensor]  # X → (R, N) weights of X's sequences
    size: dict[str, torch.Tensor]  # X → (R, 1, 1) total weight; 0 for an empty half
    g: torch.Tensor  # (R, H, W)
    m: torch.Tensor  # (R, H, T)
    valid: torch.Tensor  # (T,) n_i
    prefix: torch.Tensor  # (R, H, T) P(i)
    prefix_sq: torch.Tensor  # (R, H, T) P₂(i)
    row_mean: dict[str, torch.Tensor]  # X → (R, H, T) R̄_X
    shift: dict[str, torch.Tensor]  # X → (R, H, T) c_X

    @staticmethod
    def of(sums: LayerSums, weights: torch.Tensor) -> _RowTerms:
        half = halves(sums.num_seqs)
        groups = {"all": weights, "a": weights * (half == 0), "b": weights * (half == 1)}
        size = {x: w.sum(1)[:, None, None] for x, w in groups.items()}
        g = relative_part(sums, weights)
        m = mask_component(g, sums)
        reach = sums.max_offset
        terms = _RowTerms(
            groups=groups,
            size=size,
            g=g,
            m=m,
            valid=(reach + 1).double(),
            prefix=torch.cumsum(g, -1)[..., reach],
            prefix_sq=torch.cumsum(g.square(), -1)[..., reach],
            row_mean={},
            shift={},
        )
        for x in groups:
            terms.row_mean[x] = terms.mean_over(x, sums.rows)
            terms.shift[x] = terms.mean_over(x, sums.log_z) + m
        return terms

    def mean_over(self, x: str, per_seq: torch.Tensor) -> torch.Tensor:
        """Weighted mean over group X of a per-sequence quantity: (N, H, ·) → (R, H, ·)."""
        return torch.einsum("rn,nht->rht", self.groups[x], per_seq) / self.size[x]

    def range_magnitudes(
        self, name: str, span: slice, columns: torch.Tensor, gram: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """The magnitudes of the range `span` of queries, given its column sums (N, H, W) and Gram (H, N, N)."""
        valid = self.valid[span]
        n = valid.sum()
        with_g = {x: (self.mean_over(x, columns) * self.g).sum(-1) for x in self.groups}  # Σ_d g(d) C_X(d)

        def total(x: str) -> torch.Tensor:  # Σ over the cells of r_X
            return (self.row_mean[x] - self.prefix - self.valid * self.shift[x])[..., span].sum(-1)

        def product(x: str, y: str) -> torch.Tensor:  # Σ over the cells of r_X r_Y
            squares = torch.einsum("rn,hnk,rk->rh", self.groups[x], gram, self.groups[y])
            squares = squares / (self.size[x] * self.size[y])[..., 0]
            cx, cy = self.shift[x], self.shift[y]
            per_row = (
                -cy * self.row_mean[x]
                - cx * self.row_mean[y]
                + self.prefix_sq
                + (cx + cy) * self.prefix
                + self.valid * cx * cy
            )
            return squares - with_g[x] - with_g[y] + per_row[..., span].sum(-1)

        m = self.m[..., span]
        mask = (valid * m * m).sum(-1) / n - ((valid * m).sum(-1) / n) ** 2
        raw = product("all", "all") / n - (total("all") / n) ** 2
        corrected = product("a", "b") / n - total("a") * total("b") / n**2
        return {
            f"mask_{name}": mask.clamp(min=0).sqrt(),
            f"resid_{name}_raw": raw.clamp(min=0).sqrt(),
            f"resid_{name}": corrected.clamp(min=0).sqrt(),  # clamp keeps NaN (an empty half)
        }


@dataclass
class LayerProfile:
    """One layer's point estimates: g per offset, m per query, and on the cells of `layout` (the table
    grid) the means over each cell's valid pairs of g, m and r, and the offset-normalised map."""

    layer: int
    layout: CellLayout
    g: torch.Tensor  # (H, W)
    m: torch.Tensor  # (H, T)
    g_cell: torch.Tensor  # (H, C)
    m_cell: torch.Tensor  # (H, C)
    r: torch.Tensor  # (H, C)
    offset_map: torch.Tensor  # (C,): mean over n and heads of s_ij − g(i − j)

    def state(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in ("g", "m", "g_cell", "m_cell", "r", "offset_map")}


def profile(sums: LayerSums) -> LayerProfile:
    """The point estimate of g, m and r on the table grid's cells (means over each cell's valid pairs)."""
    ones = torch.ones(1, sums.num_seqs, dtype=torch.float64)
    g = relative_part(sums, ones)[0]
    m = mask_component(g, sums)
    layout = sums.table_grid.layout(sums.mask)
    mean_s = layout.cells_of(sums.table) / (sums.num_seqs * layout.count)
    g_cell = layout.offset_means(g)
    m_cell = layout.query_means(m)
    shift_cell = layout.query_means(sums.log_z.mean(0) + m)
    return LayerProfile(
        layer=sums.layer,
        layout=layout,
        g=g,
        m=m,
        g_cell=g_cell,
        m_cell=m_cell,
        r=mean_s - g_cell - shift_cell,
        offset_map=(mean_s - g_cell).mean(0),
    )
