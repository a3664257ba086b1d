"""C2: the causal mask makes the softmax denominator depend on the query position."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from posleak.experiments.evidence import layer_mean
from posleak.experiments.paper.claim import (
    ACROSS_CORPORA,
    BY_DOCUMENT,
    HOLM_RULE,
    REPLICATED,
    ROWS_ESTIMAND,
    ClaimModule,
    evidence_text,
)
from posleak.experiments.paper.claims.c1.claim import baseline_nulls, baselines, null_requests, null_rows
from posleak.experiments.paper.plan import Plan
from posleak.experiments.paper.reproduction import SampleRuns
from posleak.experiments.paper.requests import Request
from posleak.experiments.paper.thresholds import MIN_MAGNITUDE
from posleak.experiments.paper.verdict import Judgement, Revision, evidence_row, judge
from posleak.pipeline import AnalysisResult
from posleak.report import figures

C2_CRITERION = (
    f"In every model, the causal-mask magnitude over early queries (1 ≤ i < K), averaged over layers, has a 95% "
    f"interval above {MIN_MAGNITUDE} nats. Not consistent if it lies below in some model. (Its count part "
    "m_count(i) never rises with i under a causal mask, by construction, so the direction is not evidence; the "
    "size is.) It is shown beside the same magnitude on the same sequences with their tokens shuffled and "
    "circularly shifted, not judged against them: the mask acts on every null alike (docs/method.md §14)."
)


def claim_c2(
    models: Mapping[str, AnalysisResult], nulls: Mapping[str, Mapping[str, AnalysisResult]] | None = None
) -> Judgement:
    """C2's criterion on the baselines `models` (by label), each shown beside its nulls (`nulls`, by kind)."""
    rows = []
    for label, result in models.items():
        estimate = layer_mean(result, "mask_early")
        rows.append(evidence_row(f"{label}: mask_early", estimate, MIN_MAGNITUDE, "above", "nats"))
        rows += null_rows(label, "mask_early", (nulls or {}).get(label, {}))
    return judge(rows)


class C2(ClaimModule):
    name = "C2"
    statement = "The causal mask makes the softmax denominator depend on the query position."
    roles = ("standard", "large-base", "sliding")
    criterion = C2_CRITERION
    revisions = (
        REPLICATED,
        Revision(
            "2026-12-01",
            "the causal-mask magnitude over early queries, mean over layers, with a 95% interval above 0.05 nats, "
            "not consistent where it lies below in some model (before: its lower bound above 0 in 90% of the "
            "layers and m(i) falling with i in 90% of them): m(i) never rises with i under a causal mask, by "
            "construction, so its direction is no evidence",
        ),
        ROWS_ESTIMAND,
        HOLM_RULE,
        BY_DOCUMENT,
        ACROSS_CORPORA,
    )
    method = (
        "The row term c(i): the mean over query i's valid keys of the mean log-attention minus the relative part "
        "g(d), everything that is one number per query (the softmax normaliser against the row's own logits), "
        "noise-corrected over pairs of documents; its count part m_count(i) = −logsumexp over the offsets the mask "
        "admits of g(d) beside it (docs/method.md §2–3)."
    )

    @classmethod
    def requests(cls, plan: Plan, sample: str) -> list[Request]:
        return null_requests(plan, sample)  # C1's: the same nulls, run once

    def judge(self, runs: SampleRuns, sample: str) -> Judgement:
        return claim_c2(baselines(runs), baseline_nulls(runs))

    def against_paper(self, judgement: Judgement, runs: SampleRuns) -> str:
        model = runs.roles["standard"].label
        return (
            "The paper traces one source to the causal mask's denominator; here its early-query magnitude is "
            f"{evidence_text(judgement, f'{model}: mask_early')} in {model}."
        )

    def figures(self, runs: SampleRuns) -> list[Path]:
        standard, path = runs.baseline("standard"), self.repro.out.figure_path("c2_profiles")
        return [figures.profiles_figure(standard.profiles, standard.per_layer, path)]
