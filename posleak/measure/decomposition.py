"""The leakage decomposition of docs/method.md for one run, layer by layer, from the captured q and k.

`measure_layer(capture, spec)` sums one layer's logits (layer_sums.py) and turns the sums into
the magnitudes and their bootstrap resamples (components.py), ΔR² (regression.py) and the profile on the
table grid: a `LayerResult`, small enough to checkpoint. `Decomposition.of(results, spec)` assembles the
layers into the tables of a run.

Every magnitude is over single (i, d) pairs at every length; the table grid (`MeasureSpec.table_grid`) is
only the resolution at which profiles and offset maps are written. Choices made where the method leaves
room (docs/method.md says the same):
- A learned sink logit (gpt-oss) is a position-independent logit of the softmax denominator: it enters
  log Z_i and m_count(i) = −log(Σ_d exp g(d) + exp sink); purely relative logits give w ≡ 0 with a sink too.
- Sigmoid attention does not normalise: log Z ≡ 0, c ≡ m_count ≡ 0, so w(i, d) = mean_n s − g(d), and its
  magnitude is taken about its mean over the range (it is not centred per row).
- The noise correction pairs sequences of distinct documents, and the bootstrap draws documents, where the
  sequences name theirs (bootstrap.py, components.py); with one window per document (or no documents known) each
  sequence is its own. Every resample holds two distinct documents at least, so none is undefined or dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from posleak.capture.masks import MaskSpec
from posleak.capture.query_stats import SINK_THRESHOLD
from posleak.capture.store import LayerCapture
from posleak.measure.bootstrap import MIN_BOOTSTRAP_UNITS, percentile_interval, redrawn_resamples, resample_weights
from posleak.measure.components import (
    KEY0_PARTS,
    MAGNITUDES,
    NOISE_CORRECTION,
    RANGES,
    SHIFTS,
    LayerProfile,
    Moments,
    layer_value,
    profile,
    shifts,
)
from posleak.measure.grid import CellLayout, Grid
from posleak.measure.layer_sums import SumsPath, segment_boundaries, sum_layer
from posleak.measure.regression import DesignMoments, delta_r2, running_sums
from posleak.measure.shift import SHIFT_QUERIES, shift_queries

# the per-layer magnitudes with intervals: c and w over each range, and w's key-0 column and the rest of it
LAYER_MAGNITUDES = tuple(f"{kind}_{name}" for kind in ("mask", "resid") for name in RANGES) + tuple(
    f"resid_{name}_{part}" for part in KEY0_PARTS for name in RANGES
)
# Every per-head measure of a run: the magnitudes (with bootstrap resamples) and the attention shift (without: a
# resample of it would need a pass over the logits).
MEASURES = MAGNITUDES + SHIFTS


def measured_magnitudes(*per_layer: pd.DataFrame) -> list[str]:
    """The layer magnitudes that every one of these per-layer tables has measured (a column with a value):
    the range "beyond" exists only for models with a sliding window shorter than the sequences."""
    return [
        name for name in LAYER_MAGNITUDES if all(name in table and table[name].notna().any() for table in per_layer)
    ]


@dataclass(frozen=True)
class MeasureSpec:
    """What a decomposition measures besides the model: the sequences' shape, the early range 1 ≤ i < K,
    the table grid, the bootstrap (percentile intervals over `resamples` draws of the sequences), and how
    the sums are formed (`path`, layer_sums.py: every path gives the same numbers)."""

    seq_len: int
    num_seqs: int
    table_grid: Grid
    early: int = 32
    resamples: int = 200
    seed: int = 0
    level: float = 0.95
    path: SumsPath = "auto"
    beyond: int | None = None  # the model's sliding window W, where it has one (range "beyond")
    shift_queries: int = SHIFT_QUERIES  # queries per range that the attention shift is formed from (shift.py)
    # the resampling unit of each sequence (bootstrap.resampling_units: its document); None: each sequence its own
    units: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.num_seqs < 1 or self.early < 1 or self.shift_queries < 1:
            raise ValueError("num_seqs, early and shift_queries must be ≥ 1")
        if self.table_grid.seq_len != self.seq_len:
            raise ValueError(f"table grid is for length {self.table_grid.seq_len}, not {self.seq_len}")
        if self.units is not None and len(self.units) != self.num_seqs:
            raise ValueError(f"{len(self.units)} resampling units for {self.num_seqs} sequences")

    @property
    def num_units(self) -> int:
        return self.num_seqs if self.units is None else len(set(self.units))

    @property
    def ranges(self) -> dict[str, tuple[int, int]]:
        """early = 1 ≤ i < K, all = 1 ≤ i < T, and for a model with a sliding window W < T, beyond = W ≤ i < T:
        the queries that see no sink directly, whose absolute position must come through hidden states."""
        ranges = {"early": (1, min(self.early, self.seq_len)), "all": (1, self.seq_len)}
        if self.beyond is not None and 1 <= self.beyond < self.seq_len:
            ranges["beyond"] = (self.beyond, self.seq_len)
        return ranges

    @property
    def bootstrap_note(self) -> str | None:
        """Why there are no intervals, when there are none."""
        if self.resamples < 1:
            return "no interval: --bootstrap 0"
        if self.num_units < MIN_BOOTSTRAP_UNITS:
            what = "documents" if self.units is not None else "sequences"
            return (
                f"no interval: {self.num_units} {what}, and a bootstrap over fewer than {MIN_BOOTSTRAP_UNITS} "
                "collapses or barely moves (docs/method.md §6)"
            )
        return None

    def resampling(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The distinct resampling weights (R', N) and which of them each of the R draws is, (R,); identical
        draws (few sequences give many) have identical magnitudes, so each is computed once."""
        if self.bootstrap_note is not None:
            return None
        weights = resample_weights(self.num_seqs, self.resamples, self.seed, self.units)
        distinct, drawn = weights.unique(dim=0, return_inverse=True)
        return distinct, drawn


@dataclass
class LayerResult:
    """One layer's measurements: the profile, each magnitude per head (H,), the same for each distinct
    resample (R', H) when there is a bootstrap, ΔR² of the logit and of the log-attention (H, 2) and the
    sink score α₀ (H,); `device`: where its sums were formed (None for a result read back from a checkpoint)."""

    profile: LayerProfile
    point: dict[str, torch.Tensor]
    resampled: dict[str, torch.Tensor] | None
    dr2: torch.Tensor
    sink_score: torch.Tensor
    device: str | None = None

    def state(self) -> dict[str, torch.Tensor]:
        """Plain tensors, for a checkpoint (`from_state` rebuilds the result)."""
        state = {f"profile.{name}": value for name, value in self.profile.state().items()}
        state |= {f"point.{name}": value for name, value in self.point.items()}
        state |= {f"resampled.{name}": value for name, value in (self.resampled or {}).items()}
        window = self.profile.layout.mask.window
        return state | {
            "dr2": self.dr2,
            "sink_score": self.sink_score,
            "layer": torch.tensor(self.profile.layer),
            "window": torch.tensor(window or 0),
        }

    @staticmethod
    def from_state(state: dict[str, torch.Tensor], spec: MeasureSpec) -> LayerResult:
        window = int(state["window"]) or None
        parts = {
            prefix: {k.split(".", 1)[1]: v for k, v in state.items() if k.startswith(f"{prefix}.")}
            for prefix in ("profile", "point", "resampled")
        }
        layout = spec.table_grid.layout(MaskSpec(window=window))
        return LayerResult(
            profile=LayerProfile(layer=int(state["layer"]), layout=layout, **parts["profile"]),
            point=parts["point"],
            resampled=parts["resampled"] or None,
            dr2=state["dr2"],
            sink_score=state["sink_score"],
        )


def measure_layer(capture: LayerCapture, spec: MeasureSpec) -> LayerResult:
    """The sums of one layer of N captured sequences, and everything measured from them."""
    if capture.num_seqs != spec.num_seqs or capture.seq_len != spec.seq_len:
        raise ValueError(
            f"layer {capture.layer} holds {capture.num_seqs} × {capture.seq_len} tokens, "
            f"the measurement expects {spec.num_seqs} × {spec.seq_len}"
        )
    ranges = spec.ranges
    boundaries = segment_boundaries(spec.seq_len, ranges)
    rows = shift_queries(ranges, spec.shift_queries)
    sums = sum_layer(capture, boundaries, spec.table_grid, spec.path, rows, spec.units)
    # the point estimate is the weighting of all ones, computed with the distinct resamples in one pass
    weights = torch.ones(1, spec.num_seqs, dtype=torch.float64)
    resampling = spec.resampling()
    if resampling is not None:
        weights = torch.cat([weights, resampling[0]])
    magnitudes = Moments.of(sums, ranges).magnitudes(weights)
    point = {name: value[0] for name, value in magnitudes.items()} | shifts(sums, ranges, spec.shift_queries)
    resampled = None if resampling is None else {name: value[1:] for name, value in magnitudes.items()}
    dr2 = delta_r2(running_sums(sums), DesignMoments.of(sums.mask, spec.seq_len, spec.num_seqs))
    return LayerResult(
        profile=profile(sums),
        point=point,
        resampled=resampled,
        dr2=dr2,
        sink_score=sums.sink_score,
        device=sums.device,
    )


@dataclass
class Decomposition:
    """The result: per layer and head magnitudes, ΔR², profiles, bootstrap samples and intervals."""

    grid: Grid  # the table grid
    layer_profiles: list[LayerProfile]
    magnitudes: dict[str, torch.Tensor]  # name → (L, H), every measure of MEASURES
    dr2: torch.Tensor  # (L, H, 2): ΔR² of the logit and of the log-attention
    sink_score: torch.Tensor  # (L, H): α₀, the mean attention on key 0 over queries i ≥ 1
    bootstrap: dict[str, torch.Tensor] | None  # name → (R, L, H) per-resample magnitudes
    level: float
    bootstrap_note: str | None  # why there are no intervals, when there are none
    num_seqs: int
    early: int
    beyond: int | None
    resamples: int
    seed: int
    units: int | None  # documents the bootstrap draws and the noise correction pairs; None: each sequence its own
    shift_queries: int
    where: dict[str, str]  # where the sums were formed ("device") and how the captures were kept ("captures")

    @staticmethod
    def of(results: list[LayerResult], spec: MeasureSpec, where: dict[str, str] | None = None) -> Decomposition:
        """The run's tables from its layers. `where` is recorded with them; its "device" (where the sums were
        formed) is that of the layers measured in this process, `where`'s only if every layer was read back."""
        if not results:
            raise ValueError("the decomposition saw no attention call; was the model switched to posleak attention?")
        measured_on = ", ".join(sorted({result.device for result in results if result.device}))
        where = dict(where or {}) | {"device": measured_on or (where or {}).get("device", "cpu")}
        resampling = spec.resampling()
        bootstrap = None
        if resampling is not None:
            drawn = resampling[1]
            bootstrap = {
                name: torch.stack([result.resampled[name][drawn] for result in results], dim=1)  # type: ignore[index]
                for name in MAGNITUDES
            }
        return Decomposition(
            grid=spec.table_grid,
            layer_profiles=[result.profile for result in results],
            magnitudes={name: torch.stack([result.point[name] for result in results]) for name in MEASURES},
            dr2=torch.stack([result.dr2 for result in results]),
            sink_score=torch.stack([result.sink_score for result in results]),
            bootstrap=bootstrap,
            level=spec.level,
            bootstrap_note=spec.bootstrap_note,
            num_seqs=spec.num_seqs,
            early=spec.early,
            beyond=spec.beyond if "beyond" in spec.ranges else None,
            resamples=spec.resamples,
            seed=spec.seed,
            units=None if spec.units is None else spec.num_units,
            shift_queries=spec.shift_queries,
            where=where,
        )

    @property
    def layers(self) -> list[int]:
        return [p.layer for p in self.layer_profiles]

    def layer_means(self, name: str) -> torch.Tensor:
        """Each layer's value of a measure from its heads' (components.layer_value), (L,)."""
        return layer_value(name, self.magnitudes[name])

    def layer_interval(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Percentile interval of the layer's value, each (L,); NaN without a bootstrap and for the shift."""
        if self.bootstrap is None or name not in self.bootstrap:
            nan = torch.full((len(self.layers),), float("nan"), dtype=torch.float64)
            return nan, nan.clone()
        return percentile_interval(layer_value(name, self.bootstrap[name]), self.level)

    def per_head(self) -> pd.DataFrame:
        heads = self.magnitudes[MAGNITUDES[0]].shape[1]
        frame = pd.DataFrame(
            {
                "layer": [layer for layer in self.layers for _ in range(heads)],
                "head": [head for _ in self.layers for head in range(heads)],
                "sink_score": self.sink_score.flatten().numpy(),
            }
        )
        for name in MEASURES:
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
        for name in MEASURES:
            if name not in LAYER_MAGNITUDES:
                frame[name] = self.layer_means(name).numpy()
        frame["sink_rate"] = (self.sink_score > SINK_THRESHOLD).double().mean(-1).numpy()
        return frame

    def profiles(self) -> pd.DataFrame:
        """g, c, m_count and w per cell of the table grid and head (means over each cell's valid pairs)."""
        parts = []
        for p in self.layer_profiles:
            heads, cells = p.w.shape[0], p.layout.num_cells
            parts.append(
                {
                    "layer": np.full(heads * cells, p.layer),
                    "head": torch.arange(heads).repeat_interleave(cells).numpy(),
                    **_cell_bounds(p.layout, repeat=heads),
                    "cells": p.layout.count.repeat(heads).long().numpy(),
                    "g": p.g_cell.flatten().numpy(),
                    "c": p.c_cell.flatten().numpy(),
                    "m_count": p.m_count_cell.flatten().numpy(),
                    "w": p.w.flatten().numpy(),
                }
            )
        return _concatenated(parts)

    def offset_map(self) -> pd.DataFrame:
        parts = []
        for p in self.layer_profiles:
            cells = p.layout.num_cells
            parts.append(
                {"layer": np.full(cells, p.layer), **_cell_bounds(p.layout, repeat=1), "value": p.offset_map.numpy()}
            )
        return _concatenated(parts)

    def describe(self) -> dict[str, object]:
        """What a manifest records about this measurement."""
        return {
            "magnitudes": "over single (query, offset) pairs (docs/method.md); the grid is the tables' resolution",
            "shift_queries": f"at most {self.shift_queries} evenly spaced queries per range (docs/method.md §7)",
            "table_grid": self.grid.describe(),
            "num_seqs": self.num_seqs,
            "early": self.early,
            "beyond": self.beyond,
            "bootstrap": {
                "resamples": self.resamples,
                "seed": self.seed,
                "level": self.level,
                # what a resample draws (with replacement) and what the noise correction pairs
                "unit": "sequence" if self.units is None else "document",
                "units": self.num_seqs if self.units is None else self.units,
                # draws of a single document, drawn again (bootstrap.py): none is dropped
                "redrawn": redrawn_resamples(self.units or self.num_seqs, self.resamples, self.seed),
            },
            "noise_correction": NOISE_CORRECTION,
            "bootstrap_note": self.bootstrap_note,
            **self.where,
        }


def _concatenated(parts: list[dict[str, np.ndarray]]) -> pd.DataFrame:
    """One frame of the layers' columns laid end to end (a tenth of pd.concat's time over per-layer frames)."""
    columns = {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}
    return pd.DataFrame(columns, copy=False)  # each column its own block: no second copy


def _cell_bounds(layout: CellLayout, repeat: int) -> dict[str, object]:
    return {name: getattr(layout, name).repeat(repeat).numpy() for name in ("q_lo", "q_hi", "d_lo", "d_hi")}
