"""g, m and r of docs/method.md and their magnitudes over single (i, d) pairs, from a layer's sums.

Everything is computed for R weightings of the N sequences at once: the point estimate is the weighting of
all ones, a bootstrap resample the number of times each sequence was drawn (bootstrap.py). Every sum in
`LayerSums` is a sum over sequences, so a resample's sums are weights × per-sequence sums and its Gram
sums are wᵀ G w. `Moments` rearranges them once per layer into per-sequence vectors and N × N matrices,
so that a weighting costs a few quadratic forms, its g and m, and contractions of m with per-query
arrays: O(H·(T + N²)) per resample and no pass over the logits.

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

RANGES = ("early", "all", "beyond")
MAGNITUDES = tuple(f"{kind}_{name}" for kind in ("mask", "resid") for name in RANGES) + tuple(
    f"resid_{name}_raw" for name in RANGES
)
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
    log_sum = _log_cumulative_sum_exp(g)[..., sums.max_offset]
    if sums.sink is not None:
        log_sum = torch.logaddexp(log_sum, sums.sink[:, None])
    return -log_sum


def _log_cumulative_sum_exp(g: torch.Tensor) -> torch.Tensor:
    """log Σ_{d' ≤ d} exp g(d') along the last dimension. Every term is positive, so the cumulative sums of
    exp(g − max g) lose no precision to cancellation; 8× faster than torch.logcumsumexp, which it falls back
    to where a term would underflow (g more than 700 below its maximum)."""
    top = g.amax(-1, keepdim=True)
    shifted = g - top
    if shifted.numel() and shifted.min() < -700:
        return torch.logcumsumexp(g, dim=-1)
    return shifted.exp_().cumsum_(-1).log_().add_(top)


def magnitudes(sums: LayerSums, weights: torch.Tensor, ranges: dict[str, tuple[int, int]]) -> dict[str, torch.Tensor]:
    """Every magnitude of MAGNITUDES for each row of `weights` (R, N), each (R, H). Magnitudes are RMS over
    the range's valid (i, d) pairs of the component minus its mean; the corrected r is the square root of
    the covariance of the two halves' r (NaN when a half is empty), the raw one is beside it."""
    return Moments.of(sums, ranges).magnitudes(weights)


@dataclass
class _RangeMoments:
    """One query range's sums over sequences that the expansion of the module docstring needs: per
    sequence (N, H) and per pair of sequences (H, N, N), and the per-query arrays (K, H, Q) that are
    contracted with each resample's m(i)."""

    span: slice
    valid: torch.Tensor  # (Q,) n_i of the range's queries
    rows: torch.Tensor  # (N, H): Σ_i R_n(i)
    prefix: torch.Tensor  # (N, H): Σ_i Pc_n(i), Pc_n(i) = Σ_{d≤D_i} C_n(d) / count(d)
    log_z: torch.Tensor  # (N, H): Σ_i n_i z_n(i)
    gram: torch.Tensor  # (H, N, N): Σ_i Σ_d s^n s^m
    columns: torch.Tensor  # (H, N, N): Σ_d C_n(d) C_{Q,m}(d) / count(d) (g against the range's columns)
    prefix_sq: torch.Tensor  # (H, N, N): Σ_i Σ_{d≤D_i} C_n(d) C_m(d) / count(d)²
    z_rows: torch.Tensor  # (H, N, N): Σ_i z_n(i) R_m(i)
    z_prefix: torch.Tensor  # (H, N, N): Σ_i z_n(i) Pc_m(i)
    z_z: torch.Tensor  # (H, N, N): Σ_i n_i z_n(i) z_m(i)
    against_m: torch.Tensor  # (3N, H, Q): R_n(i), Pc_n(i), n_i z_n(i), each to be contracted with m(i)


@dataclass
class Moments:
    """A layer's sums rearranged so that every magnitude of a weighting w of the sequences is a handful of
    quadratic forms wᵀ M w plus contractions of m_w(i) with per-query arrays: the only per-resample work over
    positions is g_w, m_w (a cumulative log-sum-exp) and those contractions."""

    sums: LayerSums
    columns: torch.Tensor  # (N, H, W): column sums over all queries
    ranges: dict[str, _RangeMoments]

    @staticmethod
    def of(sums: LayerSums, ranges: dict[str, tuple[int, int]]) -> Moments:
        columns = sums.columns.sum(0)
        count = sums.offset_count
        reach = sums.max_offset
        prefix = torch.cumsum(columns / count, -1)[..., reach]  # Pc (N, H, T)
        valid = (reach + 1).double()
        rows, log_z = sums.rows, sums.log_z
        out = {}
        for name, (lo, hi) in ranges.items():
            span = slice(lo, hi)
            range_columns = sums.columns[sums.segments(lo, hi)].sum(0)
            # queries of the range whose reach includes offset d, per d
            reaching = torch.zeros(sums.span, dtype=torch.float64).index_add_(
                0, reach[span], torch.ones(hi - lo, dtype=torch.float64)
            )
            reaching = reaching.flip(0).cumsum(0).flip(0)
            z, r, pc, n = log_z[..., span], rows[..., span], prefix[..., span], valid[span]
            out[name] = _RangeMoments(
                span=span,
                valid=n,
                rows=r.sum(-1),
                prefix=pc.sum(-1),
                log_z=(n * z).sum(-1),
                gram=sums.gram[sums.segments(lo, hi)].sum(0),
                columns=torch.einsum("nhd,mhd->hnm", columns / count, range_columns),
                prefix_sq=torch.einsum("nhd,mhd->hnm", columns / count, columns * (reaching / count)),
                z_rows=torch.einsum("nhi,mhi->hnm", z, r),
                z_prefix=torch.einsum("nhi,mhi->hnm", z, pc),
                z_z=torch.einsum("nhi,mhi->hnm", n * z, z),
                against_m=torch.cat([r, pc, n * z]),
            )
        return Moments(sums, columns, out)

    def magnitudes(self, weights: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every magnitude for each row of `weights` (R, N), each (R, H)."""
        chunk = max(1, _CHUNK_ELEMENTS // (self.sums.rows.shape[1] * self.sums.seq_len))
        parts = [self._magnitudes(weights[r0 : r0 + chunk]) for r0 in range(0, weights.shape[0], chunk)]
        return {name: torch.cat([part[name] for part in parts]) for name in MAGNITUDES}

    def _magnitudes(self, weights: torch.Tensor) -> dict[str, torch.Tensor]:
        half = halves(self.sums.num_seqs)
        groups = {"all": weights, "a": weights * (half == 0), "b": weights * (half == 1)}
        scaled = {x: w / w.sum(1, keepdim=True) for x, w in groups.items()}  # w_X / W_X (NaN for an empty half)
        g = torch.einsum("rn,nhd->rhd", scaled["all"], self.columns) / self.sums.offset_count
        weighting = _Weighting(scaled, mask_component(g, self.sums))
        out = {}
        for name, moments in self.ranges.items():
            out |= weighting.range_magnitudes(name, moments)
        # a range the layer does not have (no window: no "beyond") is NaN
        missing = torch.full((weights.shape[0], self.sums.rows.shape[1]), float("nan"), dtype=torch.float64)
        return {name: out.get(name, missing) for name in MAGNITUDES}


@dataclass
class _Weighting:
    """R weightings of the sequences: per group X (all, a, b) the weights over their total, w_X / W_X
    (R, N), and m of each weighting (R, H, T); g, m and P are always the whole weighting's ("all")."""

    scaled: dict[str, torch.Tensor]
    m: torch.Tensor

    def linear(self, x: str, per_seq: torch.Tensor) -> torch.Tensor:
        """w_X·v / W_X for v (N, H) or per weighting (R, H, N): (R, H)."""
        if per_seq.dim() == 2:
            return self.scaled[x] @ per_seq
        return torch.einsum("rn,rhn->rh", self.scaled[x], per_seq)

    def quadratic(self, x: str, y: str, matrix: torch.Tensor) -> torch.Tensor:
        """w_Xᵀ M w_Y / (W_X W_Y) for M (H, N, N): (R, H)."""
        return torch.einsum("rn,hnk,rk->rh", self.scaled[x], matrix, self.scaled[y])

    def range_magnitudes(self, name: str, moments: _RangeMoments) -> dict[str, torch.Tensor]:
        """The magnitudes of one query range (module docstring), each (R, H)."""
        m = self.m[..., moments.span]
        n = moments.valid.sum()
        against = torch.einsum("khi,rhi->rhk", moments.against_m, m)  # (R, H, 3N)
        m_rows, m_prefix, m_log_z = against.split(against.shape[-1] // 3, dim=-1)
        m_sum, m_sq = (moments.valid * m).sum(-1), (moments.valid * m.square()).sum(-1)
        # centred, not m_sq/n − mean²: m is constant past a sliding window, and its variance there is 0
        mask = (moments.valid * (m - (m_sum / n)[..., None]).square()).sum(-1) / n
        linear, quadratic = self.linear, self.quadratic

        def total(x: str) -> torch.Tensor:  # Σ over the range's pairs of r_X
            return linear(x, moments.rows) - linear("all", moments.prefix) - linear(x, moments.log_z) - m_sum

        def product(x: str, y: str) -> torch.Tensor:  # Σ over the range's pairs of r_X r_Y
            shift_rows = (  # Σ_i (c_Y R̄_X + c_X R̄_Y), with c = z̄ + m
                quadratic(y, x, moments.z_rows)
                + quadratic(x, y, moments.z_rows)
                + linear(x, m_rows)
                + linear(y, m_rows)
            )
            shift_prefix = (  # Σ_i (c_X + c_Y) P
                quadratic(x, "all", moments.z_prefix)
                + quadratic(y, "all", moments.z_prefix)
                + 2 * linear("all", m_prefix)
            )
            shift_shift = quadratic(x, y, moments.z_z) + linear(x, m_log_z) + linear(y, m_log_z) + m_sq  # Σ n_i c_X c_Y
            return (
                quadratic(x, y, moments.gram)
                - quadratic("all", x, moments.columns)
                - quadratic("all", y, moments.columns)
                - shift_rows
                + quadratic("all", "all", moments.prefix_sq)
                + shift_prefix
                + shift_shift
            )

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
