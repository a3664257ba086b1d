"""`posleak intervene`: a baseline and an intervened run on the same sequences, and the effect.

The effect of an intervention on a magnitude is 100·(intervened/baseline − 1), per layer and overall
(layer −1: the ratio of the means over layers), DESIGN.md §3.4. Its interval is a paired bootstrap:
both runs draw the same resampling weights (they depend only on N, the number of resamples and the
seed), so resample k of the effect is the effect computed on resample k of each run.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd
import torch

from posleak.analyze import AnalysisResult, AnalyzeConfig, analyze_model, load_for, sequences_for
from posleak.data.batches import TokenBatch
from posleak.errors import PosleakError
from posleak.intervene.spec import Interventions
from posleak.measure import LAYER_MAGNITUDES, percentile_interval
from posleak.report import figures
from posleak.report.html import FigureBlock, Section, TableBlock, render_report
from posleak.report.runfolder import RunFolder

OVERALL = -1  # the `layer` of the row that summarises all layers


@dataclasses.dataclass(frozen=True)
class InterventionRun:
    """The two runs and their comparison."""

    baseline: AnalysisResult
    intervened: AnalysisResult
    effect: pd.DataFrame


def intervene(
    spec: str, config: AnalyzeConfig, *, out: Path | str, trust_remote_code: bool = False, progress: bool = True
) -> InterventionRun:
    """Run `spec` without and with `config.interventions` (and `--bos off` as declared in config.bos)."""
    folder = RunFolder(Path(out))
    interventions = config.interventions
    bos_off = config.bos == "off"
    if interventions.is_empty and not bos_off:
        raise PosleakError("posleak intervene needs at least one intervention option (see posleak intervene -h)")
    base_config = dataclasses.replace(config, interventions=Interventions(), bos="on" if bos_off else config.bos)
    base_model = load_for(spec, Interventions(), trust_remote_code)
    batch = sequences_for(base_model, base_config)
    baseline = analyze_model(
        base_model.model, batch, base_config, out=folder.path / "baseline", loaded=base_model, progress=progress
    )
    model = load_for(spec, interventions, trust_remote_code) if interventions.rope_scaling else base_model
    intervened_batch = without_bos(batch) if bos_off else batch
    intervened = analyze_model(
        model.model, intervened_batch, config, out=folder.path / "intervened", loaded=model, progress=progress
    )
    effect = effect_table(baseline, intervened)
    folder.write_table("effect", effect)
    _report(folder, spec, config, baseline, intervened, effect)
    return InterventionRun(baseline, intervened, effect)


def without_bos(batch: TokenBatch) -> TokenBatch:
    """The same rows with the BOS at position 0 removed (T − 1 tokens): `--bos off` as an intervention."""
    if batch.bos_id is None:
        raise PosleakError("--bos off as an intervention needs a tokenizer with a BOS token to remove")
    ids = batch.ids[:, 1:]
    return dataclasses.replace(batch, ids=ids, bos_policy="off", bos_id=None, pos0_token_ids=ids[:, 0].clone())


def effect_table(baseline: AnalysisResult, intervened: AnalysisResult, level: float = 0.95) -> pd.DataFrame:
    """Columns `layer, measure, baseline, intervened, pct_change, pct_lo, pct_hi` (layer −1: overall)."""
    rows = []
    for measure in LAYER_MAGNITUDES:
        base, new = _by_layer(baseline.per_layer, measure), _by_layer(intervened.per_layer, measure)
        base_boot, new_boot = _resampled(baseline.bootstrap, measure), _resampled(intervened.bootstrap, measure)
        layers = [*base.index, OVERALL]
        point_base = torch.tensor([*base.to_numpy(), base.mean()])
        point_new = torch.tensor([*new.to_numpy(), new.mean()])
        pct = 100 * (point_new / point_base - 1)
        if base_boot is not None and new_boot is not None and base_boot.shape == new_boot.shape:
            boot_base = torch.cat([base_boot, base_boot.mean(1, keepdim=True)], dim=1)
            boot_new = torch.cat([new_boot, new_boot.mean(1, keepdim=True)], dim=1)
            lo, hi = percentile_interval(100 * (boot_new / boot_base - 1), level)
        else:
            lo = hi = torch.full_like(pct, float("nan"))
        for k, layer in enumerate(layers):
            rows.append(
                {
                    "layer": layer,
                    "measure": measure,
                    "baseline": float(point_base[k]),
                    "intervened": float(point_new[k]),
                    "pct_change": float(pct[k]),
                    "pct_lo": float(lo[k]),
                    "pct_hi": float(hi[k]),
                }
            )
    return pd.DataFrame(rows)


def _by_layer(per_layer: pd.DataFrame, measure: str) -> pd.Series:
    return per_layer.set_index("layer")[measure].sort_index().astype("float64")


def _resampled(bootstrap: pd.DataFrame, measure: str) -> torch.Tensor | None:
    """(R, L) resampled layer magnitudes, or None when the run kept no bootstrap."""
    if bootstrap.empty:
        return None
    table = bootstrap.pivot(index="resample", columns="layer", values=measure).sort_index(axis=1)
    return torch.tensor(table.to_numpy(), dtype=torch.float64)


def _report(
    folder: RunFolder,
    spec: str,
    config: AnalyzeConfig,
    baseline: AnalysisResult,
    intervened: AnalysisResult,
    effect: pd.DataFrame,
) -> None:
    paths = [
        figures.lines_by_run(
            {"baseline": baseline.per_layer, "intervened": intervened.per_layer},
            measure,
            folder.figure_path(measure),
            title=f"{measure} with and without the intervention",
            ylabel=f"{measure} magnitude",
        )
        for measure in LAYER_MAGNITUDES
    ]
    described = config.interventions.describe() | ({"bos": "off"} if config.bos == "off" else {})
    overall = effect[effect["layer"] == OVERALL]
    lines = [
        f"- **{row.measure}**: {row.pct_change:+.1f}% (95% CI {row.pct_lo:+.1f}% to {row.pct_hi:+.1f}%)"
        for row in overall.itertuples()
    ]
    manifest = {
        "model": {"id": spec},
        "status": "complete",
        "interventions": described,
        "baseline": str(baseline.run.path) if baseline.run else None,
        "intervened": str(intervened.run.path) if intervened.run else None,
    }
    section = Section(
        "Effect of the intervention",
        f"Intervention: `{described}`. Overall change (ratio of the means over layers):\n\n" + "\n".join(lines),
        figures=[FigureBlock(path) for path in paths],
        tables=[TableBlock("Effect per layer", effect, source="effect.parquet", max_rows=60)],
    )
    render_report(folder, f"posleak intervene: {spec}", [section], manifest=manifest)
    folder.write_manifest(manifest)
