"""`posleak intervene`: a baseline and an intervened run on the same sequences, and the effect.

The effect of an intervention on a magnitude is 100·(intervened/baseline − 1), per layer and overall
(layer −1: the ratio of the means over layers), docs/method.md §9. Its interval is a paired bootstrap:
both runs draw the same resampling weights (they depend only on N, the number of resamples and the
seed), so resample k of the effect is the effect computed on resample k of each run. Beside it, the effect
on the model's own next-token loss and accuracy by position (`behaviour.parquet`, posleak.measure.behaviour).

Every option is checked before the baseline runs (`checked_intervention`): a bad intervention refuses
with nothing written, instead of failing after a finished baseline. The folder is a run folder of its
own (`baseline/` and `intervened/` are two more), finished only when its manifest says so.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd
import torch

from posleak.data.batches import TokenBatch, without_bos
from posleak.interventions import Interventions, ReplaceBos
from posleak.measure import measured_magnitudes, percentile_interval
from posleak.measure.behaviour import behaviour_lines, behaviour_table
from posleak.models.load import LoadedModel
from posleak.pipeline import (
    AnalysisResult,
    AnalyzeConfig,
    Preparation,
    PreparedRun,
    analyze_model,
    finished_here,
    load_for,
    resampled_layers,
    token_file_bos_problems,
)
from posleak.report import figures
from posleak.report.html import FigureBlock, Section, TableBlock, render_report
from posleak.store import COMPLETE, RunFolder

OVERALL = -1  # the `layer` of the row that summarises all layers
COMMAND = "intervene"  # recorded in the folder's arguments: an intervention folder is not an analysis one


@dataclasses.dataclass(frozen=True)
class InterventionRun:
    """The two runs and their comparison."""

    baseline: AnalysisResult
    intervened: AnalysisResult
    effect: pd.DataFrame
    behaviour: pd.DataFrame  # next-token loss and accuracy by position bucket (posleak.measure.behaviour)


def intervene(
    spec: str, config: AnalyzeConfig, *, out: Path | str, trust_remote_code: bool = False, progress: bool = True
) -> InterventionRun:
    """Run `spec` without and with `config.interventions` (and `--bos off` as declared in the recipe's bos).

    Every problem with the input is refused at once (BadInput) before the baseline runs or anything is written."""
    folder = RunFolder(Path(out))
    if finished_here(folder, spec, config, command=COMMAND):
        return _read(folder)  # finished before: skip loading the model
    base_model, batch, args = checked_intervention(spec, config, out, trust_remote_code)
    with folder.claim(args) as state:
        if state == COMPLETE:
            return _read(folder)
        base = baseline_config(config)
        baseline = analyze_model(PreparedRun.of(base_model, batch, base), folder.path / "baseline", progress=progress)
        placement = config.execution.placement
        model = load_for(spec, config.interventions, trust_remote_code, base=base_model, placement=placement)
        intervened_batch = without_bos(batch) if config.recipe.bos == "off" else batch
        prepared = PreparedRun.of(model, intervened_batch, config)
        intervened = analyze_model(prepared, folder.path / "intervened", progress=progress)
        effect = effect_table(baseline, intervened)
        folder.write_table("effect", effect)
        behaviour = behaviour_table(
            baseline,
            intervened,
            early=config.measure.early,
            resamples=config.measure.bootstrap,
            seed=config.measure.seed,
            units=baseline.units,
        )
        folder.write_table("behaviour", behaviour)
        _report(folder, spec, config, baseline, intervened, effect, behaviour)
        return InterventionRun(baseline, intervened, effect, behaviour)


def _read(folder: RunFolder) -> InterventionRun:
    baseline, intervened = (AnalysisResult.read(RunFolder(folder.path / name)) for name in ("baseline", "intervened"))
    return InterventionRun(baseline, intervened, folder.read_table("effect"), folder.read_table("behaviour"))


def baseline_config(config: AnalyzeConfig) -> AnalyzeConfig:
    """The baseline of an intervention: no interventions, and the BOS on where `--bos off` removes it."""
    bos = config.recipe.bos
    return config.replace(interventions=Interventions(), bos="on" if bos == "off" else bos)


def checked_intervention(
    spec: str, config: AnalyzeConfig, out: Path | str, trust_remote_code: bool = False
) -> tuple[LoadedModel, TokenBatch, dict[str, object]]:
    """The baseline model and sequences and the run folder's arguments, once every option has been checked
    against the others, the model and the output folder (the baseline's and intervened run's folders
    included); BadInput lists every problem. Nothing is run on the model and nothing is written."""
    check = Preparation(out)
    problems = check.problems
    interventions, bos_off, tokens = config.interventions, config.recipe.bos == "off", config.recipe.tokens
    if interventions.is_empty and not bos_off:
        problems.add("posleak intervene needs at least one intervention option (see posleak intervene -h)")
    base = baseline_config(config)
    check.refuse_placement(config, with_options=False)
    check.load(spec, trust_remote_code, config.execution.placement)
    loaded = check.loaded
    if bos_off and tokens is None and loaded is not None and loaded.tokenizer.bos_token_id is None:
        problems.add(
            f"--bos off as an intervention removes the BOS at position 0, and {spec}'s tokenizer has none; "
            "drop --bos off"
        )
        base = base.replace(bos="off")  # still check the other options on the sequences it can make
    check.make_sequences(base)
    batch = check.batch
    if bos_off and batch is not None and batch.bos_id is None and tokens is not None:
        problems.add(
            f"--bos off as an intervention removes the BOS at position 0, and the rows of {tokens} do not all "
            "start with the tokenizer's BOS id; put it in the file's first column or drop --bos off"
        )
    elif not bos_off and loaded is not None and batch is not None:
        problems.extend(token_file_bos_problems(loaded, batch, config.recipe))
    bos_at_0 = check.bos_at_0
    if bos_off and interventions.get(ReplaceBos) is not None:
        problems.add("--replace-bos acts on the BOS that --bos off removes; run them as two interventions")
        bos_at_0 = None
    problems.extend(interventions.problems(loaded, bos_at_0))
    args: dict[str, object] = {}
    if check.ready:
        assert loaded is not None and batch is not None  # `ready`
        args = {**PreparedRun.of(loaded, batch, config).fingerprint(), "command": COMMAND}
        intervened = without_bos(batch) if bos_off else batch
        check.check_folders(
            {
                Path(out): args,
                Path(out) / "baseline": PreparedRun.of(loaded, batch, base).fingerprint(),
                Path(out) / "intervened": PreparedRun.of(loaded, intervened, config).fingerprint(),
            }
        )
    loaded, batch = check.done()
    return loaded, batch, args


def effect_table(baseline: AnalysisResult, intervened: AnalysisResult, level: float = 0.95) -> pd.DataFrame:
    """Columns `layer, measure, baseline, intervened, pct_change, pct_lo, pct_hi` (layer −1: overall)."""
    rows = []
    for measure in measured_magnitudes(baseline.per_layer, intervened.per_layer):
        base, new = _by_layer(baseline.per_layer, measure), _by_layer(intervened.per_layer, measure)
        base_boot = resampled_layers(baseline.bootstrap, measure)
        new_boot = resampled_layers(intervened.bootstrap, measure)
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


def _report(
    folder: RunFolder,
    spec: str,
    config: AnalyzeConfig,
    baseline: AnalysisResult,
    intervened: AnalysisResult,
    effect: pd.DataFrame,
    behaviour: pd.DataFrame,
) -> None:
    paths = [
        figures.lines_by_run(
            {"baseline": baseline.per_layer, "intervened": intervened.per_layer},
            measure,
            folder.figure_path(measure),
            title=f"{measure} with and without the intervention",
            ylabel=f"{measure} magnitude",
        )
        for measure in measured_magnitudes(baseline.per_layer, intervened.per_layer)
    ]
    described = config.interventions.describe() | ({"bos": "off"} if config.recipe.bos == "off" else {})
    overall = effect[effect["layer"] == OVERALL]
    lines = [
        f"- **{row.measure}**: {row.pct_change:+.1f}% (95% CI {row.pct_lo:+.1f}% to {row.pct_hi:+.1f}%)"
        for row in overall.itertuples()
    ]
    manifest = {
        "model": {"id": spec},
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
    shift = baseline.manifest["data"]["seq_len"] - intervened.manifest["data"]["seq_len"]
    aligned_note = (
        " The intervened run is one token shorter (its BOS removed): predictions are compared token by token, "
        "positions in the baseline's coordinates, and the BOS's own prediction (query 0) has no counterpart."
        if shift
        else ""
    )
    predictions = Section(
        "Effect on the model's predictions",
        "Next-token loss (nats) and top-1 accuracy of the model itself, by query position (query i predicts "
        "token i + 1; buckets in docs/method.md §11), baseline → intervened on the same sequences, with paired "
        f"95% bootstrap intervals over sequences.{aligned_note}\n\n" + "\n".join(behaviour_lines(behaviour)),
        figures=[FigureBlock(figures.behaviour_figure(behaviour, folder.figure_path("behaviour")))],
        tables=[TableBlock("Loss and accuracy by position", behaviour, source="behaviour.parquet")],
    )
    render_report(folder, f"posleak intervene: {spec}", [section, predictions], manifest=manifest)
    folder.finish(manifest)
