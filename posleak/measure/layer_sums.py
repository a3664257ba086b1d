"""The sums of one layer's logits that every magnitude, interval and table is made of.

From the captured q and k of N sequences (capture/store.py), exact products in float64:

- R_n(i) = Σ_d s_{i,i−d}, per sequence n and query i, over the query's valid offsets (`rows`);
- C_{n,S}(d) = Σ_{i∈S} s_{i,i−d}, per sequence, segment of queries S and offset d (`columns`);
- G_S[n, n'] = Σ_{i∈S} Σ_d s^n_{i,i−d} s^{n'}_{i,i−d}, per segment and head (`gram`);
- s^n_{i,0}, the logit of every query on key 0 (`key0`): the sink's column, which the magnitudes split out;
- over all sequences, Σ_n Σ_d d·s_{i,i−d} per query (for ΔR²) and Σ_n s over the table grid's cells.

Segments cut the queries at every boundary of the measured ranges (0, 1, K and T for "early" = 1 ≤ i < K and
"all" = 1 ≤ i < T), so a range's sums are sums of segments. log Z_i is the model's own, from the attention
kernel (float32, so exact to ~1e-7 nats: the precision of the model's normaliser).

The sums are formed on the device that holds q and k where it has float64 (the CPU, CUDA; else on the CPU:
posleak.device.sums_device) and come back to the CPU, small (O(N·H·T) and O(H·N²) per segment), for the
magnitudes; `LayerSums.device` records where they were formed.

Two ways give the same sums. "bilinear" (bilinear.py) never forms the T × T logits: O(T·(N·D)² + T log T)
per head. "materialised" forms them one block of queries at a time in offset order: O(N·T²·D) per head,
cheaper for short sequences and the only way for soft-capped logits. "auto" takes the cheaper.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from posleak.capture.masks import MaskSpec
from posleak.capture.session import soft_cap
from posleak.capture.store import CallFacts, LayerCapture
from posleak.device import sums_device
from posleak.measure import bilinear
from posleak.measure.bootstrap import unit_ids
from posleak.measure.grid import Grid
from posleak.measure.offset_blocks import offset_block, reverse_keys
from posleak.measure.shift import SHIFT_STATS, document_halves, shift_rows

SumsPath = Literal["auto", "bilinear", "materialised"]
# Float64 logits per block of the materialised path (N·H·rows·W): a few MB, so the block stays in cache.
_BLOCK_ELEMENTS = 1 << 21


@dataclass
class LayerSums:
    """One layer's sums over N sequences (float64; shapes with H heads, T queries, W = min(T, window))."""

    layer: int
    mask: MaskSpec
    sink: torch.Tensor | None  # (H,) learned sink logits
    sigmoid: bool  # sigmoid attention: no normaliser, log Z ≡ 0 and m ≡ 0
    boundaries: tuple[int, ...]  # segment s holds queries boundaries[s] ≤ i < boundaries[s + 1]
    rows: torch.Tensor  # (N, H, T)
    key0: torch.Tensor  # (N, H, T): s_{i,0}, soft-capped where the model soft-caps (valid or not: i < W)
    log_z: torch.Tensor  # (N, H, T): 0 for sigmoid attention
    columns: torch.Tensor  # (S, N, H, W)
    gram: torch.Tensor  # (S, H, N, N)
    offset_weighted: torch.Tensor  # (H, T): Σ_n Σ_d d·s_{i,i−d}
    table: torch.Tensor  # (H, bins, bins): Σ_n Σ s over each cell of `table_grid`
    table_grid: Grid
    sink_score: torch.Tensor  # (H,): α₀, the mean attention on key 0 over queries i ≥ 1
    shift_queries: torch.Tensor  # (S,): the queries of the attention shift's rows (shift.py)
    shift: torch.Tensor  # (5, H, S): shift.SHIFT_STATS of each of those queries (NaN for sigmoid attention)
    units: torch.Tensor  # (N,): each sequence's unit (its document); the noise correction pairs distinct units
    device: str = "cpu"  # where the float64 products and sums were formed (the tensors here are on the CPU)

    @property
    def num_seqs(self) -> int:
        return self.rows.shape[0]

    @property
    def seq_len(self) -> int:
        return self.rows.shape[2]

    @property
    def span(self) -> int:
        return self.columns.shape[-1]

    @property
    def max_offset(self) -> torch.Tensor:
        """D_i, the largest valid offset of query i: min(i, W − 1), (T,)."""
        return torch.clamp(torch.arange(self.seq_len), max=self.span - 1)

    @property
    def offset_count(self) -> torch.Tensor:
        """Valid queries per offset d < W: T − d, (W,) float64."""
        return self.seq_len - torch.arange(self.span, dtype=torch.float64)

    def segments(self, lo: int, hi: int) -> list[int]:
        """The segments that make up the query range lo ≤ i < hi (which must fall on boundaries)."""
        if lo not in self.boundaries or hi not in self.boundaries:
            raise ValueError(f"range [{lo}, {hi}) does not fall on the segment boundaries {self.boundaries}")
        return [s for s, start in enumerate(self.boundaries[:-1]) if lo <= start < hi]


def segment_boundaries(seq_len: int, ranges: dict[str, tuple[int, int]]) -> tuple[int, ...]:
    """0, T and every range end, sorted: the segments the sums keep column sums and Gram matrices for."""
    return tuple(sorted({0, seq_len} | {bound for span in ranges.values() for bound in span}))


def choose_path(capture: LayerCapture, path: SumsPath = "auto") -> Literal["bilinear", "materialised"]:
    """The materialised path for soft-capped logits and where it costs less: N·T²·D/2 logits against the
    bilinear path's T·(N·D)² Gram products, so for T ≤ 2·N·D."""
    num_seqs, _, seq_len, dim = capture.query.shape
    if path == "bilinear" and capture.facts.softcap is not None:
        raise ValueError("soft-capped logits are not bilinear in q and k; use the materialised path")
    if path != "auto":
        return path
    materialised = capture.facts.softcap is not None or seq_len <= 2 * num_seqs * dim
    return "materialised" if materialised else "bilinear"


def sum_layer(
    capture: LayerCapture,
    boundaries: Sequence[int],
    table_grid: Grid,
    path: SumsPath = "auto",
    shift_queries: torch.Tensor | None = None,
    units: Sequence[int] | torch.Tensor | None = None,
) -> LayerSums:
    """The sums of one layer's logits (module docstring), and the attention shift's rows of `shift_queries`
    (none when None); `units`: each sequence's document, whose pairs the noise correction takes (default: each
    sequence its own, posleak.measure.bootstrap.unit_ids)."""
    facts = capture.facts
    mask = facts.mask
    if not mask.causal or mask.prefix > 0:
        raise NotImplementedError(
            "the decomposition supports causal masks with an optional sliding window; "
            f"layer {capture.layer}'s mask ({mask}) is not causal or has a bidirectional prefix"
        )
    seq_len = capture.seq_len
    boundaries = tuple(boundaries)
    span = min(seq_len, mask.window or seq_len)
    device = sums_device(capture.query.device)
    query, keys, log_z = (tensor.to(device) for tensor in (capture.query, capture.keys, capture.log_z))
    stacked = bilinear.Stacked.of(query, keys, facts.scaling)  # exact float64 products, on `device`
    if choose_path(capture, path) == "bilinear":
        rows, offset_weighted = bilinear.row_sums(stacked, mask.window)
        columns = bilinear.column_sums(stacked, boundaries, span)
        gram = bilinear.gram(stacked, mask.window, boundaries)
        table = bilinear.table_sums(stacked, mask.window, table_grid)
    else:
        rows, columns, gram, offset_weighted, table = _materialised(
            stacked.query.contiguous(), stacked.keys, span, facts.softcap, boundaries, table_grid
        )
    host = torch.device("cpu")
    shift_at = torch.zeros(0, dtype=torch.long) if shift_queries is None else shift_queries
    units = unit_ids(capture.num_seqs, units)
    shift = _shift(stacked, facts, columns, shift_at, units)
    key0 = soft_cap(bilinear.logits_with_key(stacked, 0), facts.softcap)
    return LayerSums(
        layer=capture.layer,
        mask=mask,
        sink=None if facts.sink is None else torch.tensor(facts.sink, dtype=torch.float64),
        sigmoid=facts.norm == "sigmoid",
        boundaries=boundaries,
        rows=rows.to(host),
        key0=key0.to(host),
        log_z=capture.log_z.double().to(host),
        columns=columns.to(host),
        gram=gram.to(host),
        offset_weighted=offset_weighted.to(host),
        table=table.to(host),
        table_grid=table_grid,
        sink_score=_sink_scores(key0, capture.facts, log_z).to(host),
        shift_queries=shift_at,
        shift=shift.to(host),
        units=units,
        device=str(stacked.stacked_query.device),
    )


def _materialised(
    query: torch.Tensor,
    keys: torch.Tensor,
    span: int,
    softcap: float | None,
    boundaries: tuple[int, ...],
    table_grid: Grid,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The sums from offset-ordered blocks of float64 logits, one block of queries at a time."""
    num_seqs, kv, groups, seq_len, _ = query.shape
    heads, segments = kv * groups, len(boundaries) - 1
    f64 = {"dtype": torch.float64, "device": query.device}
    rows = torch.zeros(num_seqs, heads, seq_len, **f64)
    columns = torch.zeros(segments, num_seqs, heads, span, **f64)
    gram = torch.zeros(segments, heads, num_seqs, num_seqs, **f64)
    offset_weighted = torch.zeros(heads, seq_len, **f64)
    table = torch.zeros(heads, table_grid.num_bins, table_grid.num_bins, **f64)
    offsets = torch.arange(span, **f64)
    reversed_keys = reverse_keys(keys, span)
    block = max(1, min(64, _BLOCK_ELEMENTS // (num_seqs * heads * span)))
    for q0 in range(0, seq_len, block):
        q1 = min(seq_len, q0 + block)
        logits = offset_block(query, reversed_keys, q0, q1, span, softcap)  # (N, H, rows, offsets)
        width = logits.shape[-1]
        rows[..., q0:q1] = logits.sum(-1)
        summed = logits.sum(0)
        offset_weighted[:, q0:q1] = summed @ offsets[:width]
        table_grid.add_binned(table, summed, q0)
        for s in range(segments):
            lo, hi = max(boundaries[s], q0), min(boundaries[s + 1], q1)
            if lo < hi:
                part = logits[:, :, lo - q0 : hi - q0]
                columns[s, ..., :width] += part.sum(2)
                flat = part.transpose(0, 1).reshape(heads, num_seqs, -1)
                gram[s] += flat @ flat.mT
    return rows, columns, gram, offset_weighted, table


def _shift(
    stacked: bilinear.Stacked, facts: CallFacts, columns: torch.Tensor, rows: torch.Tensor, units: torch.Tensor
) -> torch.Tensor:
    """The attention shift's statistics of `rows` (shift.py), with g from the column sums over all queries."""
    heads = columns.shape[2]
    if facts.norm == "sigmoid" or not len(rows):  # sigmoid attention is no distribution over keys: no shift
        return torch.full((len(SHIFT_STATS), heads, len(rows)), float("nan"), dtype=torch.float64)
    num_seqs, seq_len, span = columns.shape[1], stacked.stacked_query.shape[2], columns.shape[-1]
    count = seq_len - torch.arange(span, dtype=torch.float64, device=columns.device)
    g = columns.sum((0, 1)) / (num_seqs * count)
    groups = document_halves(units)
    return shift_rows(stacked.stacked_query, stacked.stacked_keys, facts.mask, facts.softcap, g, groups, rows)


def _sink_scores(key0: torch.Tensor, facts: CallFacts, log_z: torch.Tensor) -> torch.Tensor:
    """α₀ per head, (H,): the mean over sequences and queries i ≥ 1 of a_{i,0}, the attention on key 0, from the
    logits on key 0 (0 where a window hides key 0; for sigmoid attention the gate σ(s_{i,0}))."""
    positions = torch.arange(key0.shape[-1], device=key0.device)
    visible = facts.mask.valid(positions, positions.new_zeros(()))
    weight = torch.sigmoid(key0) if facts.norm == "sigmoid" else torch.exp(key0 - log_z.double())
    return (weight * visible)[:, :, 1:].mean(dim=(0, 2))
