"""The decomposition by rows of docs/method.md §2 and its magnitudes over single (i, d) pairs, from a layer's sums.

Mean over sequences of ℓ_{i,i−d} = g(d) + c(i) + w(i, d), exactly, with g the relative part, c(i) the mean over
query i's valid offsets of (mean ℓ − g), the row term (the causal-mask component), and w the within-row term (the
residual-stream component). With a_X(i, d) the weighted mean over a group X of sequences of s_{i,i−d}, R̄_X(i) its
row sum, P(i) = Σ_{d≤D_i} g(d) and n_i = D_i + 1 the valid offsets of query i:

  u_X(i) = (R̄_X(i) − P_X(i)) / n_i,   c_X(i) = u_X(i) − mean over X of log Z_i,   w_X(i, d) = a_X − g_X(d) − u_X(i),

g_X and P_X those of the group X itself. w carries no log Z (it cancels within a row), so it is linear in the
logits, every row of w sums to 0, and w_X is an unbiased estimate of w whatever the noise: the halves' w^A and w^B
are independent, so the mean of w^A·w^B estimates that of w² with no floor. (With the g of all N sequences in both
halves, as first designed, they share g's noise and the covariance was biased by −Var g: −0.03 to −0.10 nats on
planted layers with no position at σ = 2–4, tests/test_planted.py.) The sums over the pairs of a query range Q are
quadratic forms in the weights:

  Σ w_X w_Y = Σ a_X a_Y − Σ_d (g_Y C_X + g_X C_Y)(d) + Σ_i Σ_{d≤D_i} g_X g_Y − Σ_i n_i u_X(i) u_Y(i),

with C_X the column sums over Q of a_X, Σ a_X a_Y = w_Xᵀ G_Q w_Y / (W_X W_Y) (G the Gram matrix of the sequences'
logits) and Σ_i n_i u_X u_Y expanded into R·R/n, R·P/n and P·P/n per pair of sequences.

Everything is computed for R weightings of the N sequences at once: the point estimate is the weighting of all
ones, a bootstrap resample the number of times each sequence was drawn (bootstrap.py). `Moments` rearranges a
layer's sums once into per-sequence arrays and N × N matrices, so that a weighting costs a few quadratic forms,
its g, its row term c (per query) and its count term m_count (a cumulative log-sum-exp): no pass over the logits.

Magnitudes (docs/method.md §3) are per head; a layer's value is the root of the mean over its heads of the
squares (for the noise-corrected w, of the covariances, with their sign), never the mean of clipped roots.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from posleak.measure.grid import CellLayout
from posleak.measure.layer_sums import LayerSums, halves
from posleak.measure.shift import range_queries

RANGES = ("early", "all", "beyond")
# Root-mean-square magnitudes: of c noise-corrected (mask_, a signed root) and not (mask_*_raw), of the count term
# (mask_count_), of w noise-corrected (resid_) and not (resid_*_raw).
MAGNITUDES = tuple(f"{kind}_{name}" for kind in ("mask", "mask_count", "resid") for name in RANGES) + tuple(
    f"{kind}_{name}_raw" for kind in ("resid", "mask") for name in RANGES
)
# Means over a range's (sampled) queries and, per layer, over heads: the attention shift of shift.py.
SHIFTS = tuple(f"shift_{kind}_{name}{raw}" for kind in ("kl", "tv") for name in RANGES for raw in ("", "_raw"))
# (R, H, T) float64 elements per array in one chunk of resamples (a few such arrays are alive).
_CHUNK_ELEMENTS = 1 << 21

__all__ = ["MAGNITUDES", "RANGES", "SHIFTS", "halves"]


def signed_root(x: torch.Tensor) -> torch.Tensor:
    """sign(x)·√|x|: the root of a covariance that keeps its sign, so that a component that is 0 gives estimates
    centred on 0 (docs/method.md §3: no floor)."""
    return x.sign() * x.abs().sqrt()


def layer_value(name: str, per_head: torch.Tensor) -> torch.Tensor:
    """A layer's value of a measure from its heads' (last dimension): the mean for a shift; for a magnitude the
    root of the mean over heads of the squares (signed squares v·|v| and a signed root for the corrected w)."""
    if name.startswith("shift_"):
        return per_head.mean(-1)
    return signed_root((per_head * per_head.abs()).mean(-1))


def relative_part(sums: LayerSums, weights: torch.Tensor) -> torch.Tensor:
    """g(d) = mean over the weighted sequences and valid queries of s_{i,i−d}: (R, N) → (R, H, W)."""
    columns = sums.columns.sum(0)  # (N, H, W): over all queries
    return torch.einsum("rn,nhd->rhd", weights, columns) / (weights.sum(1)[:, None, None] * sums.offset_count)


def mask_component(g: torch.Tensor, sums: LayerSums) -> torch.Tensor:
    """The count term m_count(i) = −log(Σ_{d ≤ D_i} exp g(d) [+ exp sink]) for g (..., H, W) → (..., H, T): what
    the mask does to relative logits; 0 for sigmoid attention, which has no normaliser."""
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
    """Every magnitude of MAGNITUDES for each row of `weights` (R, N), each (R, H)."""
    return Moments.of(sums, ranges).magnitudes(weights)


def row_term(sums: LayerSums, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """u(i) = (R̄(i) − P(i)) / n_i and the row term c(i) = u(i) − mean log Z_i of each weighting (R, N): (R, H, T).
    Sigmoid attention: both 0 (docs/method.md §2), and w = mean s − g."""
    scaled = weights / weights.sum(1, keepdim=True)
    if sums.sigmoid:  # no normaliser: a shift of a whole row moves every gate, so nothing is one number per query
        zero = torch.zeros(weights.shape[0], sums.rows.shape[1], sums.seq_len, dtype=torch.float64)
        return zero, zero
    prefix = torch.cumsum(sums.columns.sum(0) / sums.offset_count, -1)[..., sums.max_offset]  # Pc (N, H, T)
    valid = (sums.max_offset + 1).double()
    u = torch.einsum("rn,nhi->rhi", scaled, sums.rows - prefix) / valid
    return u, u - torch.einsum("rn,nhi->rhi", scaled, sums.log_z)


def shifts(sums: LayerSums, ranges: dict[str, tuple[int, int]], sampled: int) -> dict[str, torch.Tensor]:
    """Every measure of SHIFTS, each (H,): per range the mean over its sampled queries (shift.range_queries) of
    the per-query statistics of shift.py, across the halves (the mean of A against B and B against A for the
    symmetrised KL) and raw. NaN for a range the layer does not have."""
    heads = sums.rows.shape[1]
    out = {name: torch.full((heads,), float("nan"), dtype=torch.float64) for name in SHIFTS}
    position = {int(query): k for k, query in enumerate(sums.shift_queries)}
    for name, (lo, hi) in ranges.items():
        wanted = range_queries(lo, hi, sampled).tolist()
        if not wanted or any(query not in position for query in wanted):
            continue
        kl_all, kl_ab, kl_ba, tv_all, tv_halves = sums.shift[..., [position[q] for q in wanted]].mean(-1)
        out[f"shift_kl_{name}"], out[f"shift_kl_{name}_raw"] = (kl_ab + kl_ba) / 2, kl_all
        out[f"shift_tv_{name}"], out[f"shift_tv_{name}_raw"] = tv_halves, tv_all
    return out


@dataclass
class _RangeMoments:
    """One query range's sums over sequences that the expansion of the module docstring needs: per pair of
    sequences (H, N, N), and the per-query arrays of the range."""

    span: slice
    valid: torch.Tensor  # (Q,) n_i of the range's queries
    gram: torch.Tensor  # Σ_i Σ_d s^n s^m
    columns: torch.Tensor  # Σ_d C_n(d) C_{Q,m}(d) / count(d) (g against the range's columns)
    prefix_sq: torch.Tensor  # Σ_i Σ_{d≤D_i} C_n(d) C_m(d) / count(d)²
    row_row: torch.Tensor  # Σ_i R_n(i) R_m(i) / n_i
    row_prefix: torch.Tensor  # Σ_i R_n(i) Pc_m(i) / n_i
    prefix_prefix: torch.Tensor  # Σ_i Pc_n(i) Pc_m(i) / n_i
    row_total: torch.Tensor  # (N, H): Σ_i R_n(i), the sum of the range's logits
    reaching: torch.Tensor  # (W,): the range's pairs at offset d


@dataclass
class Moments:
    """A layer's sums rearranged so that every magnitude of a weighting w of the sequences is a handful of
    quadratic forms wᵀ M w, plus its row term and count term per query."""

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
        out = {}
        for name, (lo, hi) in ranges.items():
            span = slice(lo, hi)
            range_columns = sums.columns[sums.segments(lo, hi)].sum(0)
            # queries of the range whose reach includes offset d, per d
            reaching = torch.zeros(sums.span, dtype=torch.float64).index_add_(
                0, reach[span], torch.ones(hi - lo, dtype=torch.float64)
            )
            reaching = reaching.flip(0).cumsum(0).flip(0)
            r, pc, n = sums.rows[..., span], prefix[..., span], valid[span]
            out[name] = _RangeMoments(
                span=span,
                valid=n,
                gram=sums.gram[sums.segments(lo, hi)].sum(0),
                columns=torch.einsum("nhd,mhd->hnm", columns / count, range_columns),
                prefix_sq=torch.einsum("nhd,mhd->hnm", columns / count, columns * (reaching / count)),
                row_row=torch.einsum("nhi,mhi->hnm", r / n, r),
                row_prefix=torch.einsum("nhi,mhi->hnm", r / n, pc),
                prefix_prefix=torch.einsum("nhi,mhi->hnm", pc / n, pc),
                row_total=r.sum(-1),
                reaching=reaching,
            )
        return Moments(sums, columns, out)

    def magnitudes(self, weights: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every magnitude for each row of `weights` (R, N), each (R, H)."""
        chunk = max(1, _CHUNK_ELEMENTS // (self.sums.rows.shape[1] * self.sums.seq_len))
        parts = [self._magnitudes(weights[r0 : r0 + chunk]) for r0 in range(0, weights.shape[0], chunk)]
        return {name: torch.cat([part[name] for part in parts]) for name in MAGNITUDES}

    def _magnitudes(self, weights: torch.Tensor) -> dict[str, torch.Tensor]:
        half = self.sums.half
        groups = {"all": weights, "a": weights * (half == 0), "b": weights * (half == 1)}
        scaled = {x: w / w.sum(1, keepdim=True) for x, w in groups.items()}  # w_X / W_X (NaN for an empty half)
        g = torch.einsum("rn,nhd->rhd", scaled["all"], self.columns) / self.sums.offset_count
        c = {x: row_term(self.sums, w)[1] for x, w in groups.items()}  # each group's own g and rows
        # each group's own g, which only sigmoid attention's range means need (the bootstrap's hot path skips it)
        own_g = {
            x: torch.einsum("rn,nhd->rhd", w, self.columns) / self.sums.offset_count
            for x, w in scaled.items()
            if self.sums.sigmoid
        }
        weighting = _Weighting(scaled, own_g, c, mask_component(g, self.sums), self.sums.sigmoid)
        out = {}
        for name, moments in self.ranges.items():
            out |= weighting.range_magnitudes(name, moments)
        # a range the layer does not have (no window: no "beyond") is NaN
        missing = torch.full((weights.shape[0], self.sums.rows.shape[1]), float("nan"), dtype=torch.float64)
        return {name: out.get(name, missing) for name in MAGNITUDES}


@dataclass
class _Weighting:
    """R weightings of the sequences: per group X (all, a, b) the weights over their total, w_X / W_X (R, N), and
    the row term c and count term m_count of each weighting (R, H, T)."""

    scaled: dict[str, torch.Tensor]
    g: dict[str, torch.Tensor]  # each group's own g (R, H, W); sigmoid attention only
    c: dict[str, torch.Tensor]
    m_count: torch.Tensor
    sigmoid: bool

    def quadratic(self, x: str, y: str, matrix: torch.Tensor) -> torch.Tensor:
        """w_Xᵀ M w_Y / (W_X W_Y) for M (H, N, N): (R, H)."""
        return torch.einsum("rn,hnk,rk->rh", self.scaled[x], matrix, self.scaled[y])

    def range_magnitudes(self, name: str, moments: _RangeMoments) -> dict[str, torch.Tensor]:
        """The magnitudes of one query range (module docstring), each (R, H)."""
        n = moments.valid.sum()

        def covariance(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:  # over the pairs (n_i per query)
            x, y = x[..., moments.span], y[..., moments.span]
            # centred, not mean product − product of means: past a sliding window m_count is constant, its spread 0
            x = x - (moments.valid * x).sum(-1, keepdim=True) / n
            y = y - (moments.valid * y).sum(-1, keepdim=True) / n
            return (moments.valid * x * y).sum(-1) / n

        quadratic = self.quadratic

        def product(x: str, y: str) -> torch.Tensor:  # Σ over the range's pairs of w_X w_Y, each with its own g
            within = (
                quadratic(x, y, moments.row_row)
                - quadratic(x, y, moments.row_prefix)
                - quadratic(y, x, moments.row_prefix)
                + quadratic(x, y, moments.prefix_prefix)
            )  # Σ_i n_i u_X u_Y (sigmoid attention: u ≡ 0)
            within = within * (not self.sigmoid)
            centre = torch.zeros_like(within)
            if self.sigmoid:  # w is not centred per row: take out its mean over the range's pairs (method §3)
                centre = total(x) * total(y) / n
            return (
                quadratic(x, y, moments.gram)
                - quadratic(y, x, moments.columns)
                - quadratic(x, y, moments.columns)
                + quadratic(x, y, moments.prefix_sq)
                - within
                - centre
            )

        def total(x: str) -> torch.Tensor:  # Σ over the range's pairs of w_X = Σ_i R̄_X(i) − Σ_d reach(d) g_X(d)
            g = torch.where(moments.reaching > 0, self.g[x], 0.0)  # offsets no pair reaches have no g (NaN)
            return self.scaled[x] @ moments.row_total - torch.einsum("rhd,d->rh", g, moments.reaching)

        return {
            f"mask_{name}": signed_root(covariance(self.c["a"], self.c["b"])),  # NaN for an empty half
            f"mask_{name}_raw": covariance(self.c["all"], self.c["all"]).clamp(min=0).sqrt(),
            f"mask_count_{name}": covariance(self.m_count, self.m_count).clamp(min=0).sqrt(),
            f"resid_{name}_raw": (product("all", "all") / n).clamp(min=0).sqrt(),  # a sum of squares: ≥ 0 but rounding
            f"resid_{name}": signed_root(product("a", "b") / n),  # NaN for an empty half
        }


@dataclass
class LayerProfile:
    """One layer's point estimates: g per offset, the row term c and its count part m_count per query, and on the
    cells of `layout` (the table grid) the means over each cell's valid pairs of g, c, m_count and w, and the
    offset-normalised map. On every cell, mean ℓ = g + c + w."""

    layer: int
    layout: CellLayout
    g: torch.Tensor  # (H, W)
    c: torch.Tensor  # (H, T)
    m_count: torch.Tensor  # (H, T)
    g_cell: torch.Tensor  # (H, C)
    c_cell: torch.Tensor  # (H, C)
    m_count_cell: torch.Tensor  # (H, C)
    w: torch.Tensor  # (H, C)
    offset_map: torch.Tensor  # (C,): mean over n and heads of s_ij − g(i − j)

    def state(self) -> dict[str, torch.Tensor]:
        names = ("g", "c", "m_count", "g_cell", "c_cell", "m_count_cell", "w", "offset_map")
        return {name: getattr(self, name) for name in names}


def profile(sums: LayerSums) -> LayerProfile:
    """The point estimate of g, c, m_count and w on the table grid's cells (means over each cell's valid pairs)."""
    ones = torch.ones(1, sums.num_seqs, dtype=torch.float64)
    g = relative_part(sums, ones)[0]
    u, c = (x[0] for x in row_term(sums, ones))
    m_count = mask_component(g, sums)
    layout = sums.table_grid.layout(sums.mask)
    mean_s = layout.cells_of(sums.table) / (sums.num_seqs * layout.count)
    g_cell = layout.offset_means(g)
    return LayerProfile(
        layer=sums.layer,
        layout=layout,
        g=g,
        c=c,
        m_count=m_count,
        g_cell=g_cell,
        c_cell=layout.query_means(c),
        m_count_cell=layout.query_means(m_count),
        w=mean_s - g_cell - layout.query_means(u),
        offset_map=(mean_s - g_cell).mean(0),
    )
