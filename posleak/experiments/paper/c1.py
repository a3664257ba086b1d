"""C1: RoPE-trained models show absolute position in their attention patterns (both components present)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from posleak.experiments.evidence import layer_mean
from posleak.experiments.paper.claim import ClaimModule, quote
from posleak.experiments.paper.reproduction import SampleRuns
from posleak.experiments.paper.verdict import Judgement, judge, row
from posleak.pipeline import AnalysisResult
from posleak.report import figures

MIN_MAGNITUDE = 0.05  # nats: C1, C2. A log-attention term of 0.05 nats moves attention weights by about 5%.
MEASURES = ("resid_all", "mask_all")

C1_CRITERION = (
    f"In every model, both components are present: the mean over layers of the noise-corrected residual-stream "
    f"magnitude (all queries) and of the causal-mask magnitude (all queries) each have a 95% interval above "
    f"{MIN_MAGNITUDE} nats. Not consistent if either interval lies below {MIN_MAGNITUDE} nats in some model."
)


def claim_c1(models: Mapping[str, AnalysisResult]) -> Judgement:
    rows = []
    for label, result in models.items():
        for measure in MEASURES:
            rows.append(row(f"{label}: {measure}", layer_mean(result, measure), MIN_MAGNITUDE, "above", "nats"))
    return judge(rows)


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
        return claim_c1(runs.baselines())

    def against_paper(self, judgement: Judgement, runs: SampleRuns) -> str:
        model = runs.roles["standard"].label
        return (
            "The paper finds absolute position in the attention of RoPE models; here the residual-stream "
            f"magnitude is {quote(judgement, f'{model}: resid_all')} in {model} and the causal-mask one "
            f"{quote(judgement, f'{model}: mask_all')}."
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
