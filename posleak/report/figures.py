"""Figures of a run, drawn from its tables (docs/method.md) and written as PNGs.

Each function takes DataFrames a run stores (`per_layer`, `profiles`, `offset_map`; the columns it needs are
checked) and a target path, and returns that path once the PNG is in place. Figures are
built on `matplotlib.figure.Figure` directly, never through pyplot, so nothing global changes (a notebook's
backend stays as it is) and the Agg renderer draws them; writes are atomic like every run-folder file.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.collections import QuadMesh
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from posleak.store import atomic_write

MASK_COLOR = "#1f5fa8"
RESID_COLOR = "#c8501e"
SLIDING_COLOR = "#8a8a8a"
DIVERGING = "RdBu_r"
DPI = 150
# Heatmap colour limits sit at this percentile of |value|, so that a few noisy cells next to the diagonal
# do not wash out the rest; the colour bar's arrows show that values beyond it exist.
CLIP_PERCENTILE = 99.0


def _require(df: pd.DataFrame, columns: Iterable[str], table: str) -> None:
    missing = [column for column in columns if column not in df.columns]
    if missing or df.empty:
        raise ValueError(f"table {table!r} is empty or lacks columns {missing}")


def _save(fig: Figure, path: Path) -> Path:
    return atomic_write(Path(path), lambda file: fig.savefig(file, format="png", dpi=DPI))


def _is_sliding(per_layer: pd.DataFrame) -> np.ndarray:
    """Sliding-window layers: transformers names them "sliding_attention"; a positive window also counts."""
    named = per_layer["layer_type"].astype(str).str.contains("sliding", case=False)
    window = pd.to_numeric(per_layer["window"], errors="coerce")
    return (named | (window > 0)).to_numpy()


def _mark_sliding(ax: Axes, per_layer: pd.DataFrame) -> None:
    sliding = per_layer.loc[_is_sliding(per_layer)]
    windows = pd.to_numeric(sliding["window"], errors="coerce").dropna().unique()
    label = f"sliding-window layer (W = {int(windows[0])})" if len(windows) == 1 else "sliding-window layer"
    for layer in sliding["layer"]:
        ax.axvspan(layer - 0.5, layer + 0.5, color=SLIDING_COLOR, alpha=0.15, lw=0, label=label)
        label = "_nolegend_"


def _line_with_band(ax: Axes, x: np.ndarray, df: pd.DataFrame, column: str, label: str, **style: object) -> None:
    (line,) = ax.plot(x, df[column], marker="o", markersize=3, label=label, **style)
    if f"{column}_lo" in df.columns and f"{column}_hi" in df.columns:
        ax.fill_between(x, df[f"{column}_lo"], df[f"{column}_hi"], color=line.get_color(), alpha=0.2, lw=0)


def component_magnitudes(
    per_layer: pd.DataFrame,
    path: Path,
    *,
    title: str = "Causal-mask and residual-stream components by layer",
    range_labels: tuple[str, str] = ("early queries", "all queries"),
) -> Path:
    """The causal-mask (c) and residual-stream (w) magnitudes against layer (docs/method.md §3), early and all
    queries side by side, bootstrap bands shaded."""
    columns = ["layer", "layer_type", "window", "mask_early", "mask_all", "resid_early", "resid_all"]
    _require(per_layer, columns, "per_layer")
    per_layer = per_layer.sort_values("layer")
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    x = per_layer["layer"].to_numpy()
    for ax, span, label in zip(axes, ("early", "all"), range_labels, strict=True):
        _mark_sliding(ax, per_layer)
        _line_with_band(ax, x, per_layer, f"mask_{span}", "causal mask c(i), noise-corrected", color=MASK_COLOR)
        _line_with_band(
            ax, x, per_layer, f"resid_{span}", "residual stream w(i, d), noise-corrected", color=RESID_COLOR
        )
        ax.set_title(label)
        ax.set_xlabel("layer")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    # Once, after both panels hold their data: the shared axis autoscales over both. Not clipped at 0: the
    # noise-corrected magnitudes are signed roots, and a component that is 0 gives estimates on both sides of it.
    for ax in axes:
        ax.axhline(0, color="0.5", linewidth=0.8)
    axes[0].set_ylabel("magnitude: signed RMS about the mean (nats)")
    fig.suptitle(title)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=3, frameon=False)
    return _save(fig, path)


def _is_geometric(lo: pd.Series, hi: pd.Series) -> bool:
    """A grid is geometric when its bins are not all one position wide."""
    return bool((hi - lo).max() > 0)


def _edges(lo: pd.Series, hi: pd.Series) -> np.ndarray:
    # Bins hold the inclusive range lo..hi, so a bin spans [lo, hi + 1) on a continuous axis.
    return np.unique(np.concatenate([lo.to_numpy(), hi.to_numpy() + 1]))


def _heatmap(ax: Axes, cells: pd.DataFrame, value: str, norm: Normalize) -> QuadMesh:
    """Draw `value` over query bins (y) × offset bins (x); cells the grid does not hold stay blank."""
    q_edges, d_edges = _edges(cells["q_lo"], cells["q_hi"]), _edges(cells["d_lo"], cells["d_hi"])
    grid = np.full((len(q_edges) - 1, len(d_edges) - 1), np.nan)
    q0, q1 = np.searchsorted(q_edges, cells["q_lo"]), np.searchsorted(q_edges, cells["q_hi"] + 1)
    d0, d1 = np.searchsorted(d_edges, cells["d_lo"]), np.searchsorted(d_edges, cells["d_hi"] + 1)
    for a, b, c, d, v in zip(q0, q1, d0, d1, cells[value], strict=True):
        grid[a:b, c:d] = v
    mesh = ax.pcolormesh(d_edges, q_edges, np.ma.masked_invalid(grid), cmap=DIVERGING, norm=norm)
    for axis, geometric in (
        ("x", _is_geometric(cells["d_lo"], cells["d_hi"])),
        ("y", _is_geometric(cells["q_lo"], cells["q_hi"])),
    ):
        if geometric:
            # symlog, not log: offset 0 and query 0 are real bins and must stay on the axis.
            getattr(ax, f"set_{axis}scale")("symlog", linthresh=1, linscale=0.5)
    ax.set_facecolor("#f4f4f4")
    return mesh


def _symmetric_norm(values: pd.Series) -> Normalize:
    finite = np.abs(values.to_numpy(dtype=float))
    finite = finite[np.isfinite(finite)]
    limit = float(np.percentile(finite, CLIP_PERCENTILE)) if finite.size else 1.0
    limit = limit if limit > 0 else 1.0
    return Normalize(vmin=-limit, vmax=limit)


def _layer_rows(profiles: pd.DataFrame, layer: int) -> pd.DataFrame:
    """One layer's valid grid cells with queries i ≥ 1, the range every magnitude is taken over."""
    return profiles[(profiles["layer"] == layer) & (profiles["cells"] > 0) & (profiles["q_hi"] >= 1)]


def _mask_profile(profiles: pd.DataFrame, layer: int) -> pd.DataFrame:
    """c and m_count per head and query bin: each cell holds the mean of c(i) (m_count(i)) over its pairs, so
    weight by `cells`."""
    rows = _layer_rows(profiles, layer)
    rows = rows.assign(c=rows["c"] * rows["cells"], m_count=rows["m_count"] * rows["cells"])
    sums = rows.groupby(["head", "q_lo", "q_hi"], as_index=False)[["c", "m_count", "cells"]].sum()
    return sums.assign(
        c=sums["c"] / sums["cells"], m_count=sums["m_count"] / sums["cells"], i=(sums["q_lo"] + sums["q_hi"]) / 2
    )


def profiles_figure(
    profiles: pd.DataFrame,
    per_layer: pd.DataFrame,
    path: Path,
    *,
    title: str = "Component profiles at the layers where each is largest",
) -> Path:
    """Left: the row term c(i) against query position (each head, and their mean; the count term m_count dashed)
    at the layer of largest mask magnitude. Right: the within-row term w(i, d) over query × offset, mean over
    heads, at the layer of largest residual magnitude."""
    _require(profiles, ["layer", "head", "q_lo", "q_hi", "d_lo", "d_hi", "cells", "c", "m_count", "w"], "profiles")
    _require(per_layer, ["layer", "mask_all", "resid_all"], "per_layer")
    # fillna: with one sequence the noise-corrected magnitudes are all NaN, and then the first layer is shown
    mask_layer = int(per_layer.loc[per_layer["mask_all"].fillna(-np.inf).idxmax(), "layer"])
    resid_layer = int(per_layer.loc[per_layer["resid_all"].fillna(-np.inf).idxmax(), "layer"])
    fig = Figure(figsize=(11, 4.4), layout="constrained")
    left, right = fig.subplots(1, 2)

    m = _mask_profile(profiles, mask_layer)
    label = "each head"
    for _, rows in m.groupby("head"):
        left.plot(rows["i"], rows["c"], color=MASK_COLOR, alpha=0.35, lw=1, label=label)
        label = "_nolegend_"
    mean = m.groupby("i", as_index=False)[["c", "m_count"]].mean()
    left.plot(mean["i"], mean["c"], color="black", lw=2, label="mean over heads")
    left.plot(mean["i"], mean["m_count"], color="black", lw=1, ls="--", label="its count term m_count")
    if _is_geometric(profiles["q_lo"], profiles["q_hi"]):
        left.set_xscale("log")
    left.set_xlabel("query position i")
    left.set_ylabel("row term c(i) (nats)")
    left.set_title(f"causal-mask component, layer {mask_layer}")
    left.legend(frameon=False)
    left.grid(alpha=0.3)

    cells = _layer_rows(profiles, resid_layer).groupby(["q_lo", "q_hi", "d_lo", "d_hi"], as_index=False)["w"].mean()
    mesh = _heatmap(right, cells, "w", _symmetric_norm(cells["w"]))
    right.set_xlabel("offset d = i − j")
    right.set_ylabel("query position i")
    right.set_title(f"residual-stream component w(i, d), layer {resid_layer}")
    fig.colorbar(mesh, ax=right, extend="both", label="w(i, d) (nats, mean over heads)")
    fig.suptitle(title)
    return _save(fig, path)


def offset_map_figure(
    offset_map: pd.DataFrame,
    path: Path,
    *,
    title: str = "Offset-normalised logits s(i, j) − g(i − j), mean over heads",
    ncols: int = 6,
) -> Path:
    """One heatmap per layer (query × offset) on a shared colour scale centred at 0."""
    _require(offset_map, ["layer", "q_lo", "q_hi", "d_lo", "d_hi", "value"], "offset_map")
    layers = sorted(offset_map["layer"].unique())
    ncols = min(ncols, len(layers))
    nrows = math.ceil(len(layers) / ncols)
    width, height = 2.3 * ncols + 1.6, 2.1 * nrows + 0.9
    fig = Figure(figsize=(width, height))
    # Margins fixed in inches, not a constrained layout: every panel has the same labels, and laying out one to
    # three dozen shared symlog axes was half the figure's time (30 layers: 2.8 of 5.8 s under cProfile)
    fig.subplots_adjust(
        left=0.6 / width, right=1 - 1.3 / width, bottom=0.5 / height, top=1 - 0.6 / height, wspace=0.12, hspace=0.3
    )
    axes = fig.subplots(nrows, ncols, sharex=True, sharey=True, squeeze=False).ravel()
    norm = _symmetric_norm(offset_map["value"])
    mesh = None
    for ax, layer in zip(axes, layers, strict=False):
        mesh = _heatmap(ax, offset_map[offset_map["layer"] == layer], "value", norm)
        ax.set_title(f"layer {layer}", fontsize=9)
        ax.tick_params(labelsize=7)
    for ax in axes[len(layers) :]:
        ax.set_axis_off()
    for ax in axes[(nrows - 1) * ncols :]:
        ax.set_xlabel("offset d", fontsize=8)
    for ax in axes[::ncols]:
        ax.set_ylabel("query i", fontsize=8)
    bar = fig.add_axes((1 - 1.05 / width, 0.15, 0.18 / width, 0.7))
    fig.colorbar(mesh, cax=bar, extend="both", label="logit minus relative part (nats)")
    fig.suptitle(title, y=1 - 0.15 / height, va="top")
    return _save(fig, path)


def lines_by_run(
    runs: Mapping[str, pd.DataFrame],
    column: str,
    path: Path,
    *,
    title: str,
    ylabel: str,
    relative_depth: bool = False,
) -> Path:
    """`column` against layer for several runs on one axis (a `{column}_lo`/`_hi` band where present).

    With `relative_depth` the x axis is layer / (number of layers − 1), so that models of different depth
    line up from first to last layer.
    """
    fig = Figure(figsize=(7.5, 4.2), layout="constrained")
    ax = fig.subplots()
    for label, df in runs.items():
        _require(df, ["layer", column], label)
        df = df.sort_values("layer")
        x = df["layer"].to_numpy(dtype=float)
        if relative_depth:
            x = x / max(x.max(), 1.0)
        _line_with_band(ax, x, df, column, label)
    ax.set_xlabel("relative depth (layer / last layer)" if relative_depth else "layer")
    if not relative_depth:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(frameon=False)
    return _save(fig, path)


def behaviour_figure(behaviour: pd.DataFrame, path: Path) -> Path:
    """Next-token loss and top-1 accuracy by position bucket, baseline beside intervened, with their bootstrap
    intervals as error bars (the `behaviour` table of `posleak intervene`)."""
    columns = ["bucket", "measure", "baseline", "baseline_lo", "baseline_hi", "intervened", "intervened_lo"]
    _require(behaviour, [*columns, "intervened_hi"], "behaviour")
    names = list(dict.fromkeys(behaviour["bucket"]))
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    axes = fig.subplots(1, 2)
    x = np.arange(len(names))
    for ax, measure, ylabel in zip(
        axes, ("loss", "accuracy"), ("next-token loss (nats)", "top-1 accuracy"), strict=True
    ):
        rows = behaviour[behaviour["measure"] == measure].set_index("bucket").loc[names]
        for offset, run, color in ((-0.18, "baseline", MASK_COLOR), (0.18, "intervened", RESID_COLOR)):
            value = rows[run].to_numpy()
            # an interval missing (no resamples) draws no bar; a NaN yerr would hide the point
            error = np.nan_to_num(np.abs(np.stack([value - rows[f"{run}_lo"], rows[f"{run}_hi"] - value])))
            ax.errorbar(x + offset, value, yerr=error, fmt="o", color=color, capsize=3, label=run)
        ax.set_xticks(x, labels=names)
        ax.set_xlabel("query positions (bucket)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(frameon=False)
    fig.suptitle("The model's own predictions with and without the intervention")
    return _save(fig, path)
