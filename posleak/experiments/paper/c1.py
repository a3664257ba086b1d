"""C1: RoPE-trained models show absolute position in their attention patterns (both components present, the
residual-stream one above what the same model gives on the same sequences with their tokens shuffled)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from posleak.experiments.evidence import Estimate, layer_mean
from posleak.experiments.paper.claim import ClaimModule, quote
from posleak.experiments.paper.reproduction import NULL_KINDS, SampleRuns
from posleak.experiments.paper.verdict import Judgement, judge, row
from posleak.pipeline import AnalysisResult
from posleak.report import figures

MIN_MAGNITUDE = 0.05  # nats: C1, C2. A log-attention term of 0.05 nats moves attention weights by about 5%.
MEASURES = ("resid_all", "mask_all")
# The null a component must exceed (docs/method.md §14): the residual-stream one the shuffle null, which keeps the
# tokens, the mask and every position but no order. The causal-mask component has none: no token null removes
# the mask, so its value on a null is the mask's signal on those tokens, shown beside it, not a floor.
FLOOR_NULL = {"resid_all": "shuffle"}

C1_CRITERION = (
    f"In every model, both components are present: the mean over layers of the noise-corrected residual-stream "
    f"magnitude (all queries) and of the causal-mask magnitude (all queries) each have a 95% interval above "
    f"{MIN_MAGNITUDE} nats, and the residual-stream one's interval lies above the 95% interval of the same "
    f"magnitude on the same sequences with each row's tokens shuffled (its null: the same tokens, mask and "
    f"positions, no order; docs/method.md §14). Not consistent if either interval lies below {MIN_MAGNITUDE} nats "
    f"in some model, or if the residual-stream interval lies wholly below the top of its null's interval. Both "
    f"magnitudes are shown beside their values on the shuffled and on the circularly shifted tokens; the "
    f"causal-mask component is not judged against them, since no token null removes the mask."
)


def claim_c1(
    models: Mapping[str, AnalysisResult], nulls: Mapping[str, Mapping[str, AnalysisResult]] | None = None
) -> Judgement:
    """C1's criterion on the baselines `models` (by label) and, per label, the same model on each null of its
    sequences (`nulls`: by kind; None, or a label without them: judged on the thresholds alone)."""
    rows = []
    for label, result in models.items():
        for measure in MEASURES:
            estimate = layer_mean(result, measure)
            rows.append(row(f"{label}: {measure}", estimate, MIN_MAGNITUDE, "above", "nats"))
            rows += null_rows(label, measure, estimate, (nulls or {}).get(label, {}), FLOOR_NULL.get(measure))
    return judge(rows)


def null_rows(
    label: str, measure: str, estimate: Estimate, nulls: Mapping[str, AnalysisResult], floor: str | None
) -> list[dict[str, Any]]:
    """The magnitude `measure` of each null beside the model's own (`estimate`), not deciding; where `floor` names
    one of them, the deciding row: the model's magnitude against the top of that null's interval."""
    rows = []
    for kind in NULL_KINDS:
        if kind not in nulls:
            continue
        null = layer_mean(nulls[kind], measure)
        rows.append(row(f"{label}: {measure}, {kind} null", null, MIN_MAGNITUDE, "above", "nats", deciding=False))
        if kind == floor:
            rows.append(row(f"{label}: {measure} above its {kind} null", estimate, null.interval[1], "above", "nats"))
    return rows


class C1(ClaimModule):
    name = "C1"
    statement = "RoPE-trained models show absolute position in their attention patterns."
    roles = ("standard", "large-base", "sliding")
    criterion = C1_CRITERION
    method = (
        "The decomposition of each model's log-attention into g, m and r (docs/method.md §2–3); the "
        "magnitudes averaged over layers."
    )

    def judge(self, runs: SampleRuns, sample: str) -> Judgement:
        return claim_c1(runs.baselines(), runs.baseline_nulls())

    def against_paper(self, judgement: Judgement, runs: SampleRuns) -> str:
        model = runs.roles["standard"].label
        return (
            "The paper finds absolute position in the attention of RoPE models; here the residual-stream "
            f"magnitude is {quote(judgement, f'{model}: resid_all')} in {model} and the causal-mask one "
            f"{quote(judgement, f'{model}: mask_all')}; on the same sequences with their tokens shuffled the "
            f"residual-stream magnitude is {quote(judgement, f'{model}: resid_all, shuffle null')}."
        )

    def figures(self, runs: SampleRuns) -> list[Path]:
        models = {label: result.per_layer for label, result in runs.baselines().items()}
        return [
            figures.lines_by_run(
                models,
                measure,
                self.repro.out.figure_path(f"c1_{measure}"),
                title=f"{measure} by relative depth (sample A)",
                ylabel=f"{measure} (nats)",
                relative_depth=True,
            )
            for measure in MEASURES
        ]
