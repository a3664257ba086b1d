"""`posleak compare`: the architecture comparison (docs/method.md §10) over finished run folders.

For each run: per-layer magnitudes of both components against depth, the slope (per layer, by least
squares) and Spearman ρ of the residual-stream magnitude against layer index (C4's "accumulates with
depth"), and the causal-mask share of the total, mean_l mask / (mean_l mask + mean_l resid).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from posleak.errors import PosleakError
from posleak.measure import measured_magnitudes
from posleak.report import figures
from posleak.report.html import FigureBlock, Section, TableBlock, render_report
from posleak.store import RunFolder
from posleak.validate import Problems, out_folder_problems

KIND = "comparison"  # the manifest's `kind`: an --out that holds one may be written again


@dataclass(frozen=True)
class DepthTrend:
    slope: float  # change of the magnitude per layer (least squares)
    spearman: float  # rank correlation of the magnitude with the layer index


def depth_trend(layers: np.ndarray, values: np.ndarray) -> DepthTrend:
    if len(layers) < 3:
        return DepthTrend(float("nan"), float("nan"))
    slope = float(np.polyfit(layers.astype(float), values.astype(float), 1)[0])
    ranks = pd.DataFrame({"layer": layers, "value": values}).rank()
    return DepthTrend(slope, float(ranks["layer"].corr(ranks["value"])))


def summarise(label: str, per_layer: pd.DataFrame) -> dict[str, float | str]:
    """One row of the comparison table for one run."""
    per_layer = per_layer.sort_values("layer")
    layers = per_layer["layer"].to_numpy()
    row: dict[str, float | str] = {"run": label, "layers": len(layers)}
    for scope in ("early", "all"):
        trend = depth_trend(layers, per_layer[f"resid_{scope}"].to_numpy())
        mask, resid = per_layer[f"mask_{scope}"].mean(), per_layer[f"resid_{scope}"].mean()
        row |= {
            f"mask_{scope}": mask,
            f"resid_{scope}": resid,
            f"resid_{scope}_slope": trend.slope,
            f"resid_{scope}_spearman": trend.spearman,
            f"mask_share_{scope}": mask / (mask + resid),
        }
    return row


def compare_runs(runs: Sequence[Path | str], *, out: Path | str, labels: Sequence[str] | None = None) -> pd.DataFrame:
    """Read finished runs, write `comparison.parquet`, one figure per measure and a report into `out`.

    Every problem with the input (unfinished runs, labels, the output folder) is refused at once, before
    anything is written."""
    folders = [RunFolder(Path(run)) for run in runs]
    target = RunFolder(Path(out))
    _check(folders, target, labels)
    labels = list(labels) if labels else [_label(folder) for folder in folders]
    if len(set(labels)) != len(labels):
        labels = [f"{label} ({folder.path.name})" for label, folder in zip(labels, folders, strict=True)]
    tables = {label: folder.read_table("per_layer") for label, folder in zip(labels, folders, strict=True)}
    summary = pd.DataFrame([summarise(label, table) for label, table in tables.items()])
    target.write_table("comparison", summary)
    paths = [
        figures.lines_by_run(
            tables,
            measure,
            target.figure_path(measure),
            title=f"{measure} against relative depth",
            ylabel=f"{measure} magnitude",
            relative_depth=True,
        )
        for measure in measured_magnitudes(*tables.values())
    ]
    manifest = {
        "status": "complete",
        "kind": KIND,
        "runs": {label: str(f.path) for label, f in zip(labels, folders, strict=True)},
    }
    section = Section(
        "Architecture comparison",
        "Per-layer magnitudes against relative depth (layer / (L − 1)); slope and Spearman ρ of the "
        "residual-stream magnitude against layer index; causal-mask share = mask / (mask + resid), means over layers.",
        figures=[FigureBlock(path) for path in paths],
        tables=[TableBlock("Comparison", summary, source="comparison.parquet")],
    )
    render_report(target, "posleak compare", [section], manifest=manifest)
    target.write_manifest(manifest)
    return summary


def _check(folders: list[RunFolder], target: RunFolder, labels: Sequence[str] | None) -> None:
    problems = Problems()
    for folder in folders:
        with problems.collecting():
            folder.require_complete()
    if labels and len(labels) != len(folders):
        problems.add(f"--labels gives {len(labels)} label(s) for {len(folders)} run(s); give one label per run")
    problems.extend(out_folder_problems(target.path))
    if any(target.path.resolve() == folder.path.resolve() for folder in folders):
        problems.add(f"--out {target.path} is one of the runs being compared; choose another folder")
    elif target.path.is_dir() and any(target.path.iterdir()) and not _is_comparison(target):
        problems.add(
            f"--out {target.path} holds other files (not an earlier comparison); choose another --out or delete it"
        )
    problems.raise_any()


def _is_comparison(folder: RunFolder) -> bool:
    try:
        return folder.read_manifest().get("kind") == KIND
    except PosleakError:
        return False


def _label(folder: RunFolder) -> str:
    manifest = folder.read_manifest()
    label = manifest.get("model", {}).get("id", folder.path.name)
    interventions = manifest.get("interventions") or []
    if interventions:
        label += " " + " ".join(f"{k}={v}" for item in interventions for k, v in item.items())
    return label
