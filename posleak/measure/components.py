"""The decomposition by rows of docs/method.md §2 and its magnitudes over single (i, d) pairs, from a layer's sums.

Mean over sequences of ℓ_{i,i−d} = g(d) + c(i) + w(i, d), exactly, with g the relative part, c(i) the mean over
query i's valid offsets of (mean ℓ − g), the row term (the causal-mask component), and w the within-row term (the
residual-stream component). With a_X(i, d) the weighted mean over a group X of sequences of s_{i,i−d}, R̄_X(i) its
row sum, P(i) = Σ_{d≤D_i} g(d) and n_i = D_i + 1 the valid offsets of query i:

  u_X(i) = (R̄_X(i) − P_X(i)) / n_i,   c_X(i) = u_X(i) − mean over X of log Z_i,   w_X(i, d) = a_X − g_X(d) − u_X(i),

g_X and P_X those of the group X itself. w carries no log Z (it cancels within a row), so it is linear in the
logits and every row of w sums to 0; c is linear in the logits and log Z. So w_X is the weighted mean of the
sequences' own w^n (each with its own g), and every sequence's w^n is an unbiased estimate of w.

**The noise correction pairs distinct documents.** The mean square of w over a range is biased upwards by the
noise of the mean over sequences. Two sequences of distinct documents are independent, so E[w^n·w^n'] = w·w: the
mean over every ordered pair of sequences from distinct documents of Σ w^n w^n' is unbiased for Σ w², with no floor
and no document dropped, and pairs within a document (which share its content) left out. With V the weights'
total, V_u document u's and w̄, w̄_u the weighted means of all and of u's sequences,

  Σ_{n, n' of distinct documents} v_n v_n' w^n·w^n' = V² (w̄·w̄) − Σ_u V_u² (w̄_u·w̄_u),

divided by the weight of those pairs, V² − Σ_u V_u². Each term is the square of one group's mean: the all-sequence
square, which is also the raw (uncorrected) magnitude, and each document's own square, which does not change
between resamples (a resample counts a document's sequences alike), so it is formed once. c is corrected the
same way (its squares about its mean over the range's pairs). The sums over the pairs of a query range Q of a
group's square are quadratic forms in its weights:

  Σ w_X² = Σ a_X² − 2 Σ_d g_X C_X(d) + Σ_i Σ_{d≤D_i} g_X² − Σ_i n_i u_X(i)²,

with C_X the column sums over Q of a_X, Σ a_X² = w_Xᵀ G_Q w_X / W_X² (G the Gram matrix of the sequences'
logits) and Σ_i n_i u_X² expanded into R·R/n, R·P/n and P·P/n per pair of sequences.

**Key 0 apart.** Much of w sits in the column of key 0 (a sink). With w0(i) = w(i, d = i) and, for a query that
sees key 0, the rest of its row re-centred over keys j ≥ 1, Σ_{j≥1} (w − mean_{j'≥1} w)² = Σ_j w² − (1 + 1/i)·w0²
(its row sums to 0 and has i keys besides key 0). So over a range's pairs resid² = key0² + rest², with
key0² = Σ_i (1 + 1/i)·w0(i)² / pairs and rest² = resid² − key0² (`resid_*_key0`, `resid_*_rest`), each a
quadratic form in the sequences' own w0 (their key-0 logits less their own g and u): corrected over pairs like w.
A query past a window sees no key 0 and counts wholly in the rest. Sigmoid attention's w is not centred per row:
no split (NaN).

Everything is computed for R weightings of the N sequences at once: the point estimate is the weighting of all
ones, a bootstrap resample the number of times each sequence was drawn (bootstrap.py). `Moments` rearranges a
layer's sums once into per-sequence arrays and N × N matrices, so that a weighting costs a few quadratic forms,
its g, its row term c (per query) and its count term m_count (a cumulative log-sum-exp): no pass over the logits.

Magnitudes (docs/method.md §3) are per head; a layer's value is the root of the mean over its heads of the
squares (for the noise-corrected w and c, of the pair means, with their sign), never the mean of clipped roots.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from posleak.measure.grid import CellLayout
from posleak.measure.layer_sums import LayerSums
from posleak.measure.shift import range_queries

RANGES = ("early", "all", "beyond")
# w split by its keys (module docstring): the part key 0 carries and the rest, re-centred per row (resid² = key0² +
# rest², each over the range's pairs)
KEY0_PARTS = ("key0", "rest")
# Root-mean-square magnitudes: of c noise-corrected (mask_, a signed root) and not (mask_*_raw), of the count term
# (mask_count_), of w noise-corrected (resid_) and not (resid_*_raw), and of w's key-0 column and the rest of it
# (resid_*_key0, resid_*_rest; corrected, and raw with _raw).
MAGNITUDES = (
    tuple(f"{kind}_{name}" for kind in ("mask", "mask_count", "resid") for name in RANGES)
    + tuple(f"{kind}_{name}_raw" for kind in ("resid", "mask") for name in RANGES)
    + tuple(f"resid_{name}_{part}{raw}" for part in KEY0_PARTS for name in RANGES for raw in ("", "_raw"))
)
# Means over a range's (sampled) queries and, per layer, over heads: the attention shift of shift.py.
SHIFTS = tuple(f"shift_{kind}_{name}{raw}" for kind in ("kl", "tv") for name in RANGES for raw in ("", "_raw"))
# What the noise-corrected magnitudes pair (module docstring): recorded in every manifest and in the resume
# fingerprint, so that a run folder measured with the split halves of before is never read back as this one.
NOISE_CORRECTION = "pairs of sequences of distinct documents (docs/method.md §3)"
# (R, H, T) float64 elements per array in one chunk of resamples (a few such arrays are alive).
_CHUNK_ELEMENTS = 1 << 21

__all__ = ["MAGNITUDES", "NOISE_CORRECTION", "RANGES", "SHIFTS"]


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
    the per-query statistics of shift.py, across two halves of the documents (the mean of A against B and B against
    A for the symmetrised KL) and raw. NaN for a range the layer does not have."""
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
    key0: torch.Tensor  # Σ_{i: key 0 valid} (1 + 1/i) w0_n(i) w0_m(i), w0_n(i) sequence n's own w(i, i)


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
            # w(i, d = i) of each sequence alone (its own g and u), for the queries of the range that see key 0
            seen = torch.arange(lo, min(hi, sums.span))
            key0 = (
                sums.key0[..., seen] - columns[..., seen] / count[seen] - (sums.rows - prefix)[..., seen] / valid[seen]
            )
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
                key0=torch.einsum("nhi,mhi->hnm", key0 * (1 + 1 / seen), key0),
            )
        return Moments(sums, columns, out)

    def magnitudes(self, weights: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every magnitude for each row of `weights` (R, N), each (R, H). The weights must be constant within each
        unit (a resample counts a document's sequences as often as it drew the document)."""
        units = self.sums.units
        of_unit = torch.nn.functional.one_hot(units, int(units.max()) + 1).double()  # (N, C)
        own = self._squares(of_unit.T)  # each document's own squares (C, H), which the pairs leave out
        chunk = max(1, _CHUNK_ELEMENTS // (self.sums.rows.shape[1] * self.sums.seq_len))
        parts = [self._magnitudes(weights[r0 : r0 + chunk], of_unit, own) for r0 in range(0, weights.shape[0], chunk)]
        return {name: torch.cat([part[name] for part in parts]) for name in MAGNITUDES}

    def _squares(self, weights: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per range, the mean over its pairs of w_X² and c_X² (about their mean) and of the count term's square,
        for the weighted mean X of each row of `weights` (R, N): each (R, H), unclipped."""
        scaled = weights / weights.sum(1, keepdim=True)
        own_g = torch.einsum("rn,nhd->rhd", scaled, self.columns) / self.sums.offset_count
        c = row_term(self.sums, weights)[1]
        weighting = _Weighting(scaled, own_g, c, mask_component(own_g, self.sums), self.sums.sigmoid)
        out = {}
        for name, moments in self.ranges.items():
            out |= weighting.range_squares(name, moments)
        return out

    def _magnitudes(
        self, weights: torch.Tensor, of_unit: torch.Tensor, own: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """The magnitudes of R weightings from their squares and the documents' own (`magnitudes`)."""
        squares = self._squares(weights)
        # Σ over ordered pairs of sequences of distinct documents of w^n·w^n' = V²·(w̄·w̄) − Σ_u V_u²·(w̄_u·w̄_u),
        # w̄ the weighted mean (V the weights' total), w̄_u document u's mean (V_u its weight): the noise correction
        unit_weight = weights @ of_unit  # (R, C)
        total = weights.sum(1, keepdim=True) ** 2
        pairs = total - (unit_weight**2).sum(1, keepdim=True)  # 0 where a single document holds every weight

        def across(name: str) -> torch.Tensor:
            return (total * squares[name] - unit_weight**2 @ own[name]) / pairs

        out = {}
        for name in self.ranges:
            resid, key0 = across(f"resid_{name}"), across(f"key0_{name}")
            out[f"resid_{name}"] = signed_root(resid)
            out[f"mask_{name}"] = signed_root(across(f"mask_{name}"))
            out[f"resid_{name}_raw"] = squares[f"resid_{name}"].clamp(min=0).sqrt()  # ≥ 0 but for rounding
            out[f"mask_{name}_raw"] = squares[f"mask_{name}"].clamp(min=0).sqrt()
            out[f"mask_count_{name}"] = squares[f"mask_count_{name}"].clamp(min=0).sqrt()
            if not self.sums.sigmoid:  # sigmoid attention's w is not centred per row: no split (NaN)
                out[f"resid_{name}_key0"], out[f"resid_{name}_rest"] = signed_root(key0), signed_root(resid - key0)
                raw_key0 = squares[f"key0_{name}"]
                out[f"resid_{name}_key0_raw"] = raw_key0.clamp(min=0).sqrt()
                out[f"resid_{name}_rest_raw"] = (squares[f"resid_{name}"] - raw_key0).clamp(min=0).sqrt()
        # a range the layer does not have (no window: no "beyond") is NaN
        missing = torch.full((weights.shape[0], self.sums.rows.shape[1]), float("nan"), dtype=torch.float64)
        return {name: out.get(name, missing) for name in MAGNITUDES}


@dataclass
class _Weighting:
    """R weightings of the sequences: the weights over their total, w / W (R, N), the relative part g, the row term
    c and the count term m_count of each weighting ((R, H, W) and (R, H, T))."""

    scaled: torch.Tensor
    g: torch.Tensor
    c: torch.Tensor
    m_count: torch.Tensor
    sigmoid: bool

    def quadratic(self, matrix: torch.Tensor) -> torch.Tensor:
        """wᵀ M w / W² for M (H, N, N): (R, H)."""
        return torch.einsum("rn,hnk,rk->rh", self.scaled, matrix, self.scaled)

    def range_squares(self, name: str, moments: _RangeMoments) -> dict[str, torch.Tensor]:
        """The mean squares over one query range's pairs (module docstring), each (R, H): of w as `resid_NAME`, of
        c about its mean as `mask_NAME`, of m_count about its mean as `mask_count_NAME`."""
        n = moments.valid.sum()

        def variance(x: torch.Tensor) -> torch.Tensor:  # over the pairs (n_i per query)
            x = x[..., moments.span]
            # centred, not mean square − square of the mean: past a sliding window m_count is constant, its spread 0
            x = x - (moments.valid * x).sum(-1, keepdim=True) / n
            return (moments.valid * x * x).sum(-1) / n

        quadratic = self.quadratic
        within = (
            quadratic(moments.row_row) - 2 * quadratic(moments.row_prefix) + quadratic(moments.prefix_prefix)
        )  # Σ_i n_i u² (sigmoid attention: u ≡ 0)
        within = within * (not self.sigmoid)
        centre = torch.zeros_like(within)
        if self.sigmoid:  # w is not centred per row: take out its mean over the range's pairs (method §3)
            g = torch.where(moments.reaching > 0, self.g, 0.0)  # offsets no pair reaches have no g (NaN)
            total = self.scaled @ moments.row_total - torch.einsum("rhd,d->rh", g, moments.reaching)
            centre = total * total / n
        square = (
            quadratic(moments.gram) - 2 * quadratic(moments.columns) + quadratic(moments.prefix_sq) - within - centre
        )
        return {
            f"resid_{name}": square / n,
            f"key0_{name}": quadratic(moments.key0) / n,
            f"mask_{name}": variance(self.c),
            f"mask_count_{name}": variance(self.m_count),
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
