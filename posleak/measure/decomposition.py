"""The leakage decomposition of DESIGN.md §3.1 as a streaming accumulator, and its result.

Per layer and head, each attention call is reduced to per-sequence sums that are small next to T×T:
the sum of the logits s_{i,i−d} over each grid cell's valid pairs, log Z_i per query, and the eight
running sums of ΔR² (regression.py). `DecompositionAccumulator.result()` turns them into
g (relative part), m (causal-mask component), r (residual-stream component), their magnitudes, the
split-half noise correction, bootstrap intervals, ΔR² and the offset-normalised map: per-cell arrays
in components.py, bootstrap resamples from second moments in resampled.py, and on the exact grid
without a bootstrap, row blocks of the dense sums in exact.py.

Definitional choices made here (DESIGN.md is silent on them):
- On a coarse grid, g is known per offset bin (the mean over the bin's valid pairs), and every offset
  of a bin takes the bin's g. m(i) is then −logsumexp over bins of [g_bin + log(#valid offsets of query
  i in the bin)]: exact on the exact grid, an approximation within the bin otherwise. Cell values of m,
  r and the offset map are means over the cell's valid pairs; the identity mean ℓ = g + m + r holds per cell.
- Magnitudes on a coarse grid are over cells (weighted by their number of pairs), not over single pairs,
  and use the query bins lying wholly inside the range (see CellLayout.inside).
- A learned sink logit (gpt-oss) is a position-independent logit in the softmax denominator: it enters
  log Z_i, and it enters m(i) as well, m(i) = −log(Σ_d exp g(d) + exp sink). m is then what −log Z_i
  would be for purely relative logits, and r ≡ 0 for such logits, with or without a sink.
- Sigmoid attention does not normalise: log Z ≡ 0 (as the attention function reports it) and m ≡ 0,
  so r(i, d) = mean_n s − g(d) and the identity still holds with ℓ = s.

Units for the split-half correction and the bootstrap: sums are kept per sequence when that fits the
memory budget, otherwise per unit A (first ⌊N/2⌋ sequences in input order), B (next ⌊N/2⌋) and the rest
(the odd last one; kept only when N is odd); bootstrap intervals are then NaN and the result says why.
The switch is made while the layers first appear (all in the first forward pass), by summing the
per-sequence sums, so it is exact. The budget decides only this: the halves themselves are always kept.

Precision: everything is summed in float64, except the exact grid's per-cell array (one float32 logit
per cell and sequence; in halves mode a float32 sum over a half), which is T × min(T, W) per head and
unit. The exact grid forms its logits in float32 like the model; the coarse grid's sums are float64
throughout (see `reduce_call`), as are the ΔR² sums (regression.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import pandas as pd
import torch
import torch.nn.functional as F

from posleak.capture.masks import MaskSpec
from posleak.capture.session import AttentionCall, soft_cap
from posleak.measure.bootstrap import identity_weights, percentile_interval, resample_weights
from posleak.measure.components import (
    MAGNITUDES,
    Components,
    LayerProfile,
    UnitArrays,
    UnitMode,
    Units,
    components,
    magnitudes,
)
from posleak.measure.exact import exact_profile
from posleak.measure.grid import CellLayout, Grid, GridKind
from posleak.measure.regression import (
    SUM_FIELDS,
    Bilinear,
    DesignMoments,
    KeyRanges,
    RowSums,
    delta_r2,
    kv_heads,
    log_z_of,
)
from posleak.measure.resampled import resampled_magnitudes

CellPath = Literal["auto", "bilinear", "materialised"]
LAYER_MAGNITUDES = ("mask_early", "mask_all", "resid_early", "resid_all")
DEFAULT_MEMORY_BUDGET = 2 * 2**30
# Elements of the largest temporary one call's cell sums form at once (a materialised block of logits):
# small enough that the allocator reuses memory instead of mapping fresh pages for every block.
_BLOCK_ELEMENTS = 1 << 21
# Float64 elements of the queries swept repeatedly in one pass (a few MB: they stay in the cache).
_CACHE_ELEMENTS = 1 << 19


# ---------------------------------------------------------------------------------------- cell sums


def reduce_call(
    call: AttentionCall, layout: CellLayout, target: torch.Tensor, unit: torch.Tensor, path: CellPath = "auto"
) -> RowSums:
    """Add the call's Σ of s_{i,i−d} over each cell's valid pairs into `target` (U, H, *layout.storage_shape),
    batch row b into unit unit[b], and return its row sums for ΔR².

    "bilinear" (no soft-cap): on a coarse grid the near offsets (one bin each) are single logits, read off
    a narrow band of offset-ordered blocks in float64; a far bin's sum is q_i against a difference of
    float64 prefix sums of k; the row sums come from the bilinear form (regression.Bilinear).
    "materialised": offset-ordered logit blocks throughout, reduced to cells and Σ s² in one pass; Σ_j s_ij
    and Σ_j j·s_ij still come from the bilinear form (exact in float64, and cheap) unless soft-capped.
    "auto": materialised on the exact grid (every cell is one logit: matrix products in float32, the
    model's precision, are the cheapest way to all of them) or with a soft-cap, else bilinear. On the exact
    grid every offset is near, so there bilinear means float64 blocks. Soft-capped logits form in float64.
    """
    exact, capped = layout.grid.kind == "exact", call.softcap is not None
    if path == "auto":
        path = "materialised" if exact or capped else "bilinear"
    if path not in ("bilinear", "materialised"):
        raise ValueError(f"unknown cell-sum path {path!r}; use auto, bilinear or materialised")
    bilinear = None if capped and path == "materialised" else Bilinear.of(call)  # refuses soft-capped logits
    if bilinear is not None and path == "bilinear" and not exact:
        target.index_add_(0, unit, _bilinear_dense(call, layout, bilinear).to(target.device))
        return bilinear.row_sums()
    batch, heads, seq_len, _ = call.query.shape
    device = call.query.device
    rows = RowSums(
        total=torch.zeros(batch, heads, seq_len, dtype=torch.float64, device=device),
        position_weighted=torch.zeros(batch, heads, seq_len, dtype=torch.float64, device=device),
        squares=torch.zeros(batch, heads, dtype=torch.float64, device=device),
    )
    dtype = torch.float32 if exact and path == "materialised" and not capped else torch.float64
    dense = None if exact else torch.zeros(batch, heads, *layout.storage_shape, dtype=torch.float64, device=device)
    for block in _offset_blocks(call, dtype):
        if dense is None:
            for row, u in enumerate(unit.tolist()):  # per sequence: a strided in-place add, no gather
                target[u, :, block.q0 : block.q1, : block.offsets] += block.by_offset[row].to(target.device)
        else:
            layout.grid.add_binned(dense, block.by_offset, block.q0)
        # squares of the logits formed and summed in float64 (the norm casts each element, no copy of the block)
        rows.squares += torch.linalg.vector_norm(block.by_offset, dim=(-2, -1), dtype=torch.float64).square()
        if bilinear is None:
            _add_first_moments(rows, block)
    if dense is not None:
        target.index_add_(0, unit, dense.to(target.device))
    if bilinear is not None:
        rows.total, rows.position_weighted = bilinear.first_moments()
    return rows


def cell_sums(call: AttentionCall, layout: CellLayout, path: CellPath = "auto") -> torch.Tensor:
    """Σ of s_{i,i−d} over each cell's valid pairs, per sequence and head of one call: (B, H, C) float64."""
    batch, heads = call.query.shape[:2]
    target = torch.zeros(batch, heads, *layout.storage_shape, dtype=torch.float64)
    reduce_call(call, layout, target, torch.arange(batch), path)
    return target.flatten(2)[..., layout.storage_index]


def _bilinear_dense(call: AttentionCall, layout: CellLayout, bilinear: Bilinear) -> torch.Tensor:
    """Coarse-grid cell sums of one call, (B, H, bins, bins) float64, from the bilinear form."""
    batch, heads, seq_len, _ = call.query.shape
    bins, near, device = layout.grid.num_bins, layout.grid.near_bins, call.query.device
    query_bin = layout.grid.bin_of_position.to(device)
    dense = torch.zeros(batch, heads, bins, bins, dtype=torch.float64, device=device)
    for block in _offset_blocks(call, torch.float64, max_offsets=near):
        dense[..., : block.offsets].index_add_(2, query_bin[block.q0 : block.q1], block.by_offset)
    if bins == near or (layout.mask.window or seq_len) <= near:
        return dense  # no far offsets
    # far bins: with K[p] = Σ_{j<p} k_j, the sum over a far bin's valid offsets is q_i·K[p(i, first)] −
    # q_i·K[p(i, first of the next bin)] where p(i, e) = max(0, i − min(e, W) + 1) clips to query i's first
    # valid key; for each edge e that is q_i against K shifted by min(e, W) − 1 positions (K[0] = 0 below)
    window, far_edges = layout.mask.window or seq_len, layout.grid.edges[near:]
    query, prefix = bilinear.query, bilinear.prefix[:, :, None]
    at_edges = torch.zeros(*query.shape[:-1], len(far_edges), dtype=torch.float64, device=device)
    chunk = max(1, _CACHE_ELEMENTS // (heads * query.shape[-1]))  # queries whose q stay in cache over all edges
    for c0 in range(0, seq_len, chunk):
        c1 = min(seq_len, c0 + chunk)
        for n, edge in enumerate(far_edges):
            shift = min(edge, window) - 1
            lo = max(c0, shift)
            if lo < c1:
                at_edges[..., lo:c1, n] = torch.linalg.vecdot(
                    query[..., lo:c1, :], prefix[..., lo - shift : c1 - shift, :]
                )
    rows = (at_edges[..., :-1] - at_edges[..., 1:]).view(batch, heads, seq_len, bins - near)
    dense[..., near:].index_add_(2, query_bin, rows)
    return dense


@dataclass
class _OffsetBlock:
    """Logits of queries q0..q1−1 against keys in reverse order: raw[b, h, r, m] = s_{q0+r, q1−1−m}
    (0 for key positions below 0). Read along a skewed diagonal, `by_offset[b, h, r, d]` = s_{q0+r, q0+r−d}
    for d < `offsets` = min(q1, span), and 0 where d > i: the block re-indexed by offset, without a copy."""

    q0: int
    q1: int
    offsets: int
    raw: torch.Tensor  # (B, H, q1 − q0, q1 − q0 + offsets − 1), contiguous

    @property
    def by_offset(self) -> torch.Tensor:
        batch, heads, rows, cols = self.raw.shape
        return self.raw.as_strided(
            (batch, heads, rows, self.offsets), (heads * rows * cols, rows * cols, cols - 1, 1), rows - 1
        )


def _offset_blocks(call: AttentionCall, dtype: torch.dtype, max_offsets: int | None = None) -> Iterator[_OffsetBlock]:
    """The call's logits at offsets below `max_offsets` (all by default), block of queries by block,
    each re-indexable by offset (see _OffsetBlock), computed in `dtype`.

    One matrix product per block against the block's keys reversed; a key group's heads share one product.
    Zero-padded keys give logit 0 (also after soft-capping), so entries with d > i vanish with no mask.
    """
    keys, groups = kv_heads(call)
    batch, heads, seq_len, dim = call.query.shape
    query = (call.query.to(dtype) * call.scaling).view(batch, heads // groups, groups, seq_len, dim)
    keys = keys.to(dtype)
    span = min(seq_len, call.mask.window or seq_len, max_offsets or seq_len)
    # a block of n queries forms n × (n + span − 1) logits, about n² of them wasted (keys ahead of the
    # query and the zero padding): n ≤ 128 keeps that small next to n × span at little cost per product
    block = max(1, min(span, 128, _BLOCK_ELEMENTS // (batch * heads * 2 * span)))
    for q0 in range(0, seq_len, block):
        q1 = min(seq_len, q0 + block)
        rows, offsets = q1 - q0, min(q1, span)
        first = q1 - (rows + offsets - 1)
        reversed_keys = keys[:, :, max(0, first) : q1].flip(2)
        reversed_keys = F.pad(reversed_keys, (0, 0, 0, max(0, -first)))
        raw = query[:, :, :, q0:q1].reshape(batch, heads // groups, groups * rows, dim) @ reversed_keys.mT
        if call.softcap is not None:
            raw = soft_cap(raw, call.softcap)
        yield _OffsetBlock(q0, q1, offsets, raw.view(batch, heads, rows, -1))


def _add_first_moments(rows: RowSums, block: _OffsetBlock) -> None:
    """Σ_j s_ij and Σ_j j·s_ij = Σ_d (i − d)·s_{i,i−d} of a block's rows, in float64."""
    logits = block.by_offset.double()  # 0 at invalid pairs
    offset = torch.arange(block.offsets, dtype=torch.float64, device=logits.device)
    query = torch.arange(block.q0, block.q1, dtype=torch.float64, device=logits.device)
    total = logits.sum(-1)
    rows.total[..., block.q0 : block.q1] = total
    rows.position_weighted[..., block.q0 : block.q1] = query * total - logits @ offset


# ----------------------------------------------------------------------------------------- the sums


@dataclass
class LayerSums:
    """One layer's running sums, per unit (see `Units`) where the split-half and bootstrap need them."""

    window: int | None
    sigmoid: bool
    sink: torch.Tensor | None  # (H,) float64 learned sink logits
    cells: torch.Tensor  # (U, H, *CellLayout.storage_shape): Σ s over each cell's valid pairs
    log_z: torch.Tensor  # (U, H, T) float64 Σ log Z_i
    regression: torch.Tensor  # (H, 8) float64, the sums of regression.SUM_FIELDS over all sequences
    seen: torch.Tensor  # (N,) bool: sequences already added

    @property
    def mask(self) -> MaskSpec:
        return MaskSpec(window=self.window)

    def arrays(self, layout: CellLayout) -> UnitArrays:
        """The per-unit sums on the layout's cells, in float64."""
        cells = self.cells.flatten(2)[..., layout.storage_index].double()
        return UnitArrays(cells, layout.to_cells(self.log_z), self.sink, self.sigmoid)


class DecompositionAccumulator:
    """Streams attention calls into the sums of DESIGN.md §3.1–3.2; `result()` gives the decomposition.

    `grid_kind`: "exact", "coarse" or a `Grid` (for custom coarse bins). `early`: K of the early range
    1 ≤ i < K. `memory_budget_bytes`: the most the per-sequence sums may take (else halves, see the module
    docstring). `per_sequence=False` keeps the halves from the start: no bootstrap, and on the exact grid
    a quarter of the memory at N = 8. `path`: how cell sums are formed (see `reduce_call`); every path gives
    the same numbers.
    """

    needs_attended_keys = False

    def __init__(
        self,
        grid_kind: GridKind | Grid,
        seq_len: int,
        num_seqs: int,
        early: int = 32,
        memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET,
        path: CellPath = "auto",
        per_sequence: bool = True,
    ) -> None:
        self.grid = grid_kind if isinstance(grid_kind, Grid) else Grid(seq_len, grid_kind)
        if self.grid.seq_len != seq_len:
            raise ValueError(f"grid is for length {self.grid.seq_len}, not {seq_len}")
        if num_seqs < 1 or early < 1:
            raise ValueError("num_seqs and early must be ≥ 1")
        self.seq_len, self.num_seqs, self.early = seq_len, num_seqs, early
        self.memory_budget_bytes = memory_budget_bytes
        self.path = path
        self.per_sequence = per_sequence
        self.units = Units("sequence" if per_sequence else "halves", num_seqs)
        self.layers: dict[int, LayerSums] = {}

    # ---- streaming

    def update(self, call: AttentionCall) -> None:
        if call.seq_len != self.seq_len:
            raise ValueError(f"the accumulator is for length {self.seq_len}, the call has {call.seq_len}")
        index = call.sequence_index.long().cpu()
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= self.num_seqs):
            raise ValueError(f"sequence index outside 0..{self.num_seqs - 1}: {index.tolist()}")
        layout = self.grid.layout(call.mask)
        sums = self.layers.get(call.layer) or self._new_layer(call, layout)
        if sums.window != call.mask.window:
            raise ValueError(f"layer {call.layer} changed its window from {sums.window} to {call.mask.window}")
        if bool(sums.seen[index].any()) or index.unique().numel() != index.numel():
            raise ValueError(f"layer {call.layer} already holds sequences {sorted(set(index.tolist()))}")
        unit = self.units.of(index)
        rows = reduce_call(call, layout, sums.cells, unit, self.path)
        log_z = log_z_of(call)
        sums.log_z.index_add_(0, unit, log_z.double().cpu())
        sums.regression += rows.running_sums(log_z, KeyRanges.of(call.mask, self.seq_len)).sum(0)
        sums.seen[index] = True
        if call.sink is not None:
            sums.sink = call.sink.double().cpu()

    def _new_layer(self, call: AttentionCall, layout: CellLayout) -> LayerSums:
        heads = call.query.shape[1]
        # exact-grid cells hold one float32 logit per sequence; coarse-grid sums are few and float64
        dtype = torch.float32 if self.grid.kind == "exact" else torch.float64
        cells = layout.storage_shape[0] * layout.storage_shape[1]
        if self.units.mode == "sequence":
            needed = self._unit_bytes() + self.num_seqs * self._layer_unit_bytes(heads, cells, dtype)
            if needed > self.memory_budget_bytes:
                self._collapse_to_halves()
        units = self.units.count
        sums = LayerSums(
            window=call.mask.window,
            sigmoid=call.norm == "sigmoid",
            sink=None,
            cells=torch.zeros(units, heads, *layout.storage_shape, dtype=dtype),
            log_z=torch.zeros(units, heads, self.seq_len, dtype=torch.float64),
            regression=torch.zeros(heads, len(SUM_FIELDS), dtype=torch.float64),
            seen=torch.zeros(self.num_seqs, dtype=torch.bool),
        )
        self.layers[call.layer] = sums
        return sums

    def _layer_unit_bytes(self, heads: int, cells: int, dtype: torch.dtype) -> int:
        return heads * (cells * dtype.itemsize + self.seq_len * 8)

    def _unit_bytes(self) -> int:
        """Bytes of per-unit sums held now."""
        return sum(s.cells.numel() * s.cells.element_size() + s.log_z.numel() * 8 for s in self.layers.values())

    def _collapse_to_halves(self) -> None:
        """Per-sequence sums → units A, B, rest (exact: sums of sums)."""
        halves = Units("halves", self.num_seqs)
        unit = halves.of(torch.arange(self.num_seqs))
        for sums in self.layers.values():
            cells = torch.zeros(halves.count, *sums.cells.shape[1:], dtype=sums.cells.dtype)
            sums.cells = cells.index_add_(0, unit, sums.cells)
            log_z = torch.zeros(halves.count, *sums.log_z.shape[1:], dtype=torch.float64)
            sums.log_z = log_z.index_add_(0, unit, sums.log_z)
        self.units = halves

    # ---- checkpoints

    def state_dict(self) -> dict[str, torch.Tensor | int]:
        """Everything needed to resume: plain tensors and ints (torch.save-able)."""
        state: dict[str, torch.Tensor | int] = {
            "seq_len": self.seq_len,
            "num_seqs": self.num_seqs,
            "grid_exact": int(self.grid.kind == "exact"),
            "linear_until": self.grid.linear_until,
            "bins_per_octave": self.grid.bins_per_octave,
            "halves": int(self.units.mode == "halves"),
            "layers": torch.tensor(sorted(self.layers), dtype=torch.long),
        }
        for layer, sums in self.layers.items():
            state |= {
                f"layer{layer}.window": -1 if sums.window is None else sums.window,
                f"layer{layer}.sigmoid": int(sums.sigmoid),
                f"layer{layer}.cells": sums.cells,
                f"layer{layer}.log_z": sums.log_z,
                f"layer{layer}.regression": sums.regression,
                f"layer{layer}.seen": sums.seen,
            }
            if sums.sink is not None:
                state[f"layer{layer}.sink"] = sums.sink
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor | int]) -> None:
        grid = Grid(
            int(state["seq_len"]),
            "exact" if int(state["grid_exact"]) else "coarse",
            int(state["linear_until"]),
            int(state["bins_per_octave"]),
        )
        if grid != self.grid or int(state["num_seqs"]) != self.num_seqs:
            raise ValueError(
                f"checkpoint is for {grid.describe()} and {int(state['num_seqs'])} sequences, "
                f"this accumulator for {self.grid.describe()} and {self.num_seqs}"
            )
        self.units = Units("halves" if int(state["halves"]) else "sequence", self.num_seqs)
        self.layers = {}
        for layer in torch.as_tensor(state["layers"]).tolist():
            window = int(state[f"layer{layer}.window"])
            sink = state.get(f"layer{layer}.sink")
            self.layers[layer] = LayerSums(
                window=None if window < 0 else window,
                sigmoid=bool(int(state[f"layer{layer}.sigmoid"])),
                sink=None if sink is None else torch.as_tensor(sink).clone(),
                cells=torch.as_tensor(state[f"layer{layer}.cells"]).clone(),
                log_z=torch.as_tensor(state[f"layer{layer}.log_z"]).clone(),
                regression=torch.as_tensor(state[f"layer{layer}.regression"]).clone(),
                seen=torch.as_tensor(state[f"layer{layer}.seen"]).clone(),
            )

    # ---- result

    def result(
        self, resamples: int = 200, seed: int = 0, level: float = 0.95, profile_grid: Grid | None = None
    ) -> Decomposition:
        """g, m, r, magnitudes, ΔR², the offset map and bootstrap intervals over sequences (percentile,
        `resamples` draws, seeded). Every layer must have seen every sequence once. The profiles are kept
        on the cells of `profile_grid` (a coarser grid, for tables of long exact runs; default: the grid)."""
        if not self.layers:
            raise ValueError("the decomposition saw no attention call; was the model switched to posleak attention?")
        for layer, sums in self.layers.items():
            if not bool(sums.seen.all()):
                missing = (~sums.seen).nonzero().flatten().tolist()
                raise ValueError(f"layer {layer} has not seen sequences {missing[:10]} of {self.num_seqs}")
        note = self._bootstrap_note(resamples)
        weights = None if note else resample_weights(self.num_seqs, resamples, seed)
        # identical draws (few sequences give many) have identical magnitudes: compute each once
        distinct, drawn = (None, None) if weights is None else weights.unique(dim=0, return_inverse=True)
        ranges = {"early": (1, min(self.early, self.seq_len)), "all": (1, self.seq_len)}
        profiles, points, boots, dr2 = [], [], [], []
        for layer in sorted(self.layers):
            sums = self.layers[layer]
            layout = self.grid.layout(sums.mask)
            on = layout if profile_grid in (None, self.grid) else profile_grid.layout(sums.mask)
            if self.grid.kind == "exact" and distinct is None:  # the dense sums, row block by row block
                profile, point = exact_profile(
                    layer, sums.cells, sums.log_z, sums.sink, sums.sigmoid, layout, self.units, ranges, on
                )
            else:
                arrays = sums.arrays(layout)
                parts = components(arrays, layout, self.units, identity_weights(self.units.count))
                profile = _profile(layer, layout, parts).on(on.grid)
                point = {name: value[0] for name, value in magnitudes(parts, layout, ranges).items()}
                if distinct is not None:
                    resampled = resampled_magnitudes(arrays, layout, self.units, distinct, ranges, parts)
                    boots.append({name: value[drawn] for name, value in resampled.items()})
            profiles.append(profile)
            points.append(point)
            dr2.append(delta_r2(sums.regression, DesignMoments.of(sums.mask, self.seq_len, self.num_seqs)))
        return Decomposition(
            grid=self.grid,
            layer_profiles=profiles,
            magnitudes={name: torch.stack([p[name] for p in points]) for name in MAGNITUDES},
            dr2=torch.stack(dr2),
            bootstrap={name: torch.stack([b[name] for b in boots], dim=1) for name in MAGNITUDES} if boots else None,
            level=level,
            bootstrap_note=note,
            num_seqs=self.num_seqs,
            units=self.units.mode,
            early=self.early,
            resamples=resamples,
            seed=seed,
        )

    def _bootstrap_note(self, resamples: int) -> str | None:
        if resamples < 1:
            return "bootstrap not requested (resamples = 0)"
        if not self.per_sequence:
            return "per-sequence sums were not kept (per_sequence=False): no bootstrap over sequences"
        if self.units.mode == "halves":
            return (
                "per-sequence sums did not fit the memory budget "
                f"({self.memory_budget_bytes / 2**30:.2f} GiB), so only the halves A and B were kept: "
                "no bootstrap over sequences; raise memory_budget_bytes or use the coarse grid"
            )
        if self.num_seqs < 2:
            return "a bootstrap over sequences needs at least 2 sequences"
        return None


def _profile(layer: int, layout: CellLayout, point: Components) -> LayerProfile:
    g_cell = layout.from_offsets(point.g[0])
    return LayerProfile(
        layer=layer,
        layout=layout,
        g=point.g[0],
        m=point.m[0],
        g_cell=g_cell,
        m_cell=point.m_cell[0],
        r=point.r[0],
        offset_map=(point.mean_s[0] - g_cell).mean(0),
    )


# ------------------------------------------------------------------------------------------- result


@dataclass
class Decomposition:
    """The result: per layer and head magnitudes, ΔR², profiles, bootstrap samples and intervals."""

    grid: Grid
    layer_profiles: list[LayerProfile]
    magnitudes: dict[str, torch.Tensor]  # name → (L, H)
    dr2: torch.Tensor  # (L, H, 2): ΔR² of the logit and of the log-attention
    bootstrap: dict[str, torch.Tensor] | None  # name → (R, L, H) per-resample magnitudes
    level: float
    bootstrap_note: str | None  # why there are no intervals, when there are none
    num_seqs: int
    units: UnitMode
    early: int
    resamples: int
    seed: int

    @property
    def layers(self) -> list[int]:
        return [p.layer for p in self.layer_profiles]

    def layer_means(self, name: str) -> torch.Tensor:
        """Mean over heads of a magnitude, (L,)."""
        return self.magnitudes[name].mean(-1)

    def layer_interval(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Percentile interval of the mean over heads, each (L,); NaN without a bootstrap."""
        if self.bootstrap is None:
            nan = torch.full((len(self.layers),), float("nan"), dtype=torch.float64)
            return nan, nan.clone()
        return percentile_interval(self.bootstrap[name].mean(-1), self.level)

    def per_head(self) -> pd.DataFrame:
        heads = self.magnitudes[MAGNITUDES[0]].shape[1]
        frame = pd.DataFrame(
            {
                "layer": [layer for layer in self.layers for _ in range(heads)],
                "head": [head for _ in self.layers for head in range(heads)],
            }
        )
        for name in MAGNITUDES:
            frame[name] = self.magnitudes[name].flatten().numpy()
        frame["dr2_logit"] = self.dr2[..., 0].flatten().numpy()
        frame["dr2_logattn"] = self.dr2[..., 1].flatten().numpy()
        return frame

    def per_layer(self) -> pd.DataFrame:
        frame = pd.DataFrame({"layer": self.layers})
        for name in LAYER_MAGNITUDES:
            frame[name] = self.layer_means(name).numpy()
        for name in LAYER_MAGNITUDES:
            lo, hi = self.layer_interval(name)
            frame[f"{name}_lo"], frame[f"{name}_hi"] = lo.numpy(), hi.numpy()
        return frame

    def profiles(self, grid: Grid | None = None) -> pd.DataFrame:
        """g, m, r per cell and head; on `grid` (a coarser one) the count-weighted mean over its cells."""
        frames = []
        for p in (p.on(grid) for p in self.layer_profiles):
            heads, cells = p.r.shape[0], p.layout.num_cells
            frames.append(
                pd.DataFrame(
                    {
                        "layer": p.layer,
                        "head": torch.arange(heads).repeat_interleave(cells).numpy(),
                        **_cell_bounds(p.layout, repeat=heads),
                        "cells": p.layout.count.repeat(heads).long().numpy(),
                        "g": p.g_cell.flatten().numpy(),
                        "m": p.m_cell.flatten().numpy(),
                        "r": p.r.flatten().numpy(),
                    }
                )
            )
        return pd.concat(frames, ignore_index=True)

    def offset_map(self, grid: Grid | None = None) -> pd.DataFrame:
        frames = []
        for p in (p.on(grid) for p in self.layer_profiles):
            frames.append(pd.DataFrame({"layer": p.layer, **_cell_bounds(p.layout, repeat=1), "value": p.offset_map}))
        return pd.concat(frames, ignore_index=True)

    def describe(self) -> dict[str, object]:
        """What a manifest records about this measurement."""
        return {
            "grid": self.grid.describe(),
            "num_seqs": self.num_seqs,
            "units": self.units,
            "early": self.early,
            "bootstrap": {"resamples": self.resamples, "seed": self.seed, "level": self.level},
            "bootstrap_note": self.bootstrap_note,
        }


def _cell_bounds(layout: CellLayout, repeat: int) -> dict[str, object]:
    return {name: getattr(layout, name).repeat(repeat).numpy() for name in ("q_lo", "q_hi", "d_lo", "d_hi")}
