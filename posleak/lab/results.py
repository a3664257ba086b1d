"""Gather finished lab trials into one results folder: Parquet tables, figures and one report.

Written by `posleak lab` and `posleak sweep` into their output folder, beside `models/` and `trials/`:
the summary table (`lab.parquet` or `sweep.parquet`, one row per trial), `per_layer.parquet` (the
decomposition per layer), `probe.parquet` (the position probe per layer), `metrics.parquet` (training
curves), `figures/*.png`, `report.html` and `manifest.json`. Everything here is recomputed from the trial
folders on every invocation, so a larger sweep in the same folder simply gathers more trials.
Where a configuration ran with several seeds, the figures show the mean over seeds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from posleak.lab.trial import Trial, read_tables
from posleak.report.figures import lines_by_run
from posleak.report.html import FigureBlock, Section, TableBlock, render_report
from posleak.store import RunFolder, atomic_write, versions

DPI = 150


def write_results(
    root: Path,
    trials: Sequence[Trial],
    table: pd.DataFrame,
    *,
    table_name: str,
    title: str,
    intro: str,
    settings: Mapping[str, Any],
    extra_sections: Sequence[Section] = (),
) -> Path:
    """Write the tables, figures, report and manifest of `trials` (rows in `table`) into `root`; `extra_sections`
    follow the summary (task trials have accuracies instead of perplexities, and no perplexity section)."""
    run = RunFolder(root)
    trials = list(trials)
    per_layer = read_tables(root, trials, "per_layer")
    probe = read_tables(root, trials, "probe")
    metrics = _training_metrics(root, trials)
    for name, frame in ((table_name, table), ("per_layer", per_layer), ("probe", probe), ("metrics", metrics)):
        run.write_table(name, frame)
    names = list(dict.fromkeys(trial.name for trial in trials))
    sections = [
        Section(
            "Summary",
            intro + "\n\n" + _summary_note(table),
            tables=[TableBlock("One row per trial", table, source=f"{table_name}.parquet")],
        ),
        *extra_sections,
        _components_section(run, per_layer, names),
        _probe_section(run, probe, names),
        *([_perplexity_section(run, table, trials)] if any(c.startswith("ppl_") for c in table.columns) else []),
        _training_section(run, metrics, names),
    ]
    manifest = {
        "kind": table_name,
        "settings": dict(settings),
        "trials": [{"key": t.key, "name": t.name, "seed": t.train.seed} for t in trials],
        "versions": versions(),
        "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "status": "complete",
    }
    render_report(run, title, sections, manifest=manifest)
    run.write_manifest(manifest)
    return run.report_path


def _summary_note(table: pd.DataFrame) -> str:
    return (
        "Perplexities are on the validation documents at each multiple of the training length; "
        "`probe_r2_best` is the best held-out R² over layers of the ridge probe to log(1 + i); "
        "`mask_all` / `resid_all` are the causal-mask and residual-stream magnitudes (docs/method.md §3, all "
        "queries), averaged over heads and layers. For sigmoid normalisation log Z := 0, so m ≡ 0."
    )


def _seed_mean(frame: pd.DataFrame, name: str, x: str, column: str) -> pd.DataFrame:
    rows = frame[frame["name"] == name]
    return rows.groupby(x, as_index=False)[column].mean()


def _components_section(run: RunFolder, per_layer: pd.DataFrame, names: list[str]) -> Section:
    if per_layer.empty:
        return Section("Components by layer", "No trial finished its decomposition.")
    paths = [
        lines_by_run(
            {name: _seed_mean(per_layer, name, "layer", column) for name in names},
            column,
            run.figure_path(f"{column}_by_layer"),
            title=title,
            ylabel="magnitude (nats)",
        )
        for column, title in (
            ("mask_all", "Causal-mask component c(i), all queries (noise-corrected)"),
            ("resid_all", "Residual-stream component w(i, d), all queries (noise-corrected)"),
        )
    ]
    return Section(
        "Components by layer",
        "Per attention layer, mean over heads (and over seeds where there are several).",
        figures=[FigureBlock(path) for path in paths],
    )


def _probe_section(run: RunFolder, probe: pd.DataFrame, names: list[str]) -> Section:
    if probe.empty:
        return Section("Position probe", "No trial finished its probe.")
    log_rows = probe[probe["target"] == "log1p"]
    path = lines_by_run(
        {name: _seed_mean(log_rows, name, "layer", "r2") for name in names},
        "r2",
        run.figure_path("probe_r2"),
        title="Position probe: held-out R² of log(1 + i) from h_i^(l)",
        ylabel="held-out R²",
    )
    return Section(
        "Position probe",
        "Ridge regression from the residual stream resid[l] (resid[0]: token embedding; absolute encodings enter "
        "at the input of block 0, so they first show in resid[1]) to log(1 + i), split by sequence. "
        "`r2_shuffled` is the control trained on permuted positions.",
        figures=[FigureBlock(path)],
        tables=[TableBlock("Probe per layer", probe, collapsed=True, source="probe.parquet")],
    )


def _perplexity_section(run: RunFolder, table: pd.DataFrame, trials: list[Trial]) -> Section:
    columns = sorted((c for c in table.columns if c.startswith("ppl_") and c.endswith("x")), key=_multiple)
    if len(columns) < 2:
        return Section("Length generalisation", "Only one evaluation length was measured.")
    multiples = np.array([_multiple(c) for c in columns], dtype=float)
    keys_by_name: dict[str, list[str]] = {}
    for trial in trials:
        keys_by_name.setdefault(trial.name, []).append(trial.key)
    series = {
        name: (multiples, table[table["trial"].isin(keys)][columns].mean().to_numpy())
        for name, keys in keys_by_name.items()
    }
    path = _xy_figure(
        series,
        run.figure_path("perplexity_by_length"),
        title="Validation perplexity against evaluation length",
        xlabel="evaluation length / training length",
        ylabel="perplexity (log scale)",
        log_y=True,
        ticks=multiples,
    )
    return Section(
        "Length generalisation",
        "Every window of the validation documents at each length, so all lengths cover the same text.",
        figures=[FigureBlock(path)],
    )


def _training_section(run: RunFolder, metrics: pd.DataFrame, names: list[str]) -> Section:
    if metrics.empty:
        return Section("Training", "No training metrics.")
    evaluated = metrics.dropna(subset=["val_loss"])
    series = {}
    for name in names:
        curve = _seed_mean(evaluated, name, "step", "val_loss")
        series[name] = (curve["step"].to_numpy(), curve["val_loss"].to_numpy())
    path = _xy_figure(
        series, run.figure_path("val_loss"), title="Validation loss during training", xlabel="step", ylabel="nats"
    )
    return Section("Training", "Held-out next-token loss at each evaluation.", figures=[FigureBlock(path)])


def _multiple(column: str) -> int:
    return int(column.removeprefix("ppl_").removesuffix("x"))


def _training_metrics(root: Path, trials: Sequence[Trial]) -> pd.DataFrame:
    frames, seen = [], set()
    for trial in trials:
        path = root / "models" / trial.train_key / "metrics.parquet"
        if (trial.name, trial.train.seed) in seen or not path.is_file():
            continue
        seen.add((trial.name, trial.train.seed))
        frames.append(pd.read_parquet(path).assign(name=trial.name, seed=trial.train.seed))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _xy_figure(
    series: Mapping[str, tuple[np.ndarray, np.ndarray]],
    path: Path,
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    log_y: bool = False,
    ticks: np.ndarray | None = None,
) -> Path:
    """One line per label; drawn on a bare `Figure` (no pyplot state), written atomically. With `ticks`
    (length multiples) the x axis is base-2 logarithmic, ticked at those values."""
    fig = Figure(figsize=(7.5, 4.2), layout="constrained")
    ax = fig.subplots()
    for label, (x, y) in series.items():
        ax.plot(x, y, marker="o", markersize=3, label=label)
    if log_y:
        ax.set_yscale("log")
    if ticks is not None:
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, labels=[f"{tick:g}×" for tick in ticks])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(frameon=False)
    return atomic_write(path, lambda file: fig.savefig(file, format="png", dpi=DPI))
