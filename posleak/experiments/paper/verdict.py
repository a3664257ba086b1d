"""The criteria of claims C1–C6 of arXiv 2606.06160, written before any data are seen, and their verdicts.

Each criterion names the effects it expects, their direction and a minimum size, and is judged on the
bootstrap interval of each effect (evidence.py): a row of evidence *supports* the claim when its whole
interval lies beyond the threshold, *contradicts* it when the whole interval lies on the other side, and
is *unclear* otherwise. A sample's verdict is "consistent" when every deciding row supports the claim,
"not consistent" when any contradicts it, and "inconclusive" otherwise (C5, which asks whether some
replacement of the BOS does what the paper reports, uses "any supports" and "all contradict").

`posleak paper` judges every claim on two disjoint samples of sequences (A and B) and calls a claim
consistent, or not consistent, only where both samples agree (`replicated`); a disagreement is
inconclusive (docs/method.md §13).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pandas as pd

from posleak.experiments.evidence import Direction, Estimate, Says, depth_slope, layer_mean, mean_of, percent_change
from posleak.pipeline.analysis import AnalysisResult
from posleak.report.html import TableBlock, Verdict

EVIDENCE_COLUMNS = ("evidence", "value", "lo", "hi", "threshold", "unit", "says", "deciding")

MIN_MAGNITUDE = 0.05  # nats: C1, C2. A log-attention term of 0.05 nats moves attention weights by about 5%.
MIN_SINK_LOWERING = 1.0  # %: C3, the least lowering of the later layers' residual-stream magnitude that counts
MIN_NTK_LOWERING = 2.0  # %: C4, the least lowering by inference-time NTK scaling that counts as suppression
PAPER_BOS_REMOVED = 40.0  # C5: the paper's "about 40%" of the early residual-stream component
BOS_BAND = (20.0, 60.0)  # C5: the paper's figure ± 20 points
COS_CONSTANT, COS_VARIES = 0.9999, 0.99  # C6: constant with a BOS, varying without


@dataclass
class Judgement:
    """One sample's evidence rows and the verdict they give."""

    verdict: Verdict
    evidence: pd.DataFrame


@dataclass
class Claim:
    claim: str
    statement: str
    criterion: str
    samples: dict[str, Judgement]
    method: str
    paper: str = ""  # one sentence: the measured effect against the paper's
    numbers: dict[str, Any] = field(default_factory=dict)
    figures: list[Path] = field(default_factory=list)
    tables: list[TableBlock] = field(default_factory=list)

    @property
    def verdict(self) -> Verdict:
        return replicated([judgement.verdict for judgement in self.samples.values()])

    def to_json(self) -> dict[str, Any]:
        return {
            "claim": self.claim,
            "verdict": self.verdict,
            "criterion": self.criterion,
            "samples": {
                name: {"verdict": j.verdict, "evidence": j.evidence.to_dict(orient="records")}
                for name, j in self.samples.items()
            },
            "numbers": self.numbers,
        }


def replicated(verdicts: Sequence[Verdict]) -> Verdict:
    """A verdict that every sample gives; where samples disagree, inconclusive."""
    return verdicts[0] if len(set(verdicts)) == 1 else "inconclusive"


def row(
    evidence: str, estimate: Estimate, threshold: float, direction: Direction, unit: str, deciding: bool = True
) -> dict[str, Any]:
    lo, hi = estimate.interval
    says = estimate.judge(threshold, direction)
    bound = f"{'>' if direction == 'above' else '<'} {threshold:g}"
    return dict(zip(EVIDENCE_COLUMNS, (evidence, estimate.value, lo, hi, bound, unit, says, deciding), strict=True))


def fact(evidence: str, value: float, holds: bool, fails: bool, threshold: str, unit: str = "") -> dict[str, Any]:
    """A row without an interval, for a property computed exactly (the closed system, cosines): it supports the
    claim where it `holds`, contradicts it where it clearly `fails`, and is unclear in the band between."""
    says: Says = "supports" if holds else "contradicts" if fails else "unclear"
    nan = float("nan")
    return dict(zip(EVIDENCE_COLUMNS, (evidence, value, nan, nan, threshold, unit, says, True), strict=True))


def judge(rows: list[dict[str, Any]], rule: Literal["all", "any"] = "all") -> Judgement:
    frame = pd.DataFrame(rows, columns=list(EVIDENCE_COLUMNS))
    says = frame.loc[frame["deciding"], "says"]
    if rule == "all":
        verdict: Verdict = (
            "consistent"
            if (says == "supports").all()
            else "not consistent"
            if (says == "contradicts").any()
            else "inconclusive"
        )
    else:
        verdict = (
            "consistent"
            if (says == "supports").any()
            else "not consistent"
            if (says == "contradicts").all()
            else "inconclusive"
        )
    return Judgement(verdict, frame)


# ------------------------------------------------------------------------------------------------ C1, C2

C1_CRITERION = (
    f"In every model, both components are present: the mean over layers of the noise-corrected residual-stream "
    f"magnitude (all queries) and of the causal-mask magnitude (all queries) each have a 95% interval above "
    f"{MIN_MAGNITUDE} nats. Not consistent if either interval lies below {MIN_MAGNITUDE} nats in some model."
)


def claim_c1(models: Mapping[str, AnalysisResult]) -> Judgement:
    rows = []
    for label, result in models.items():
        for measure in ("resid_all", "mask_all"):
            rows.append(row(f"{label}: {measure}", layer_mean(result, measure), MIN_MAGNITUDE, "above", "nats"))
    return judge(rows)


C2_CRITERION = (
    f"In every model, the causal-mask magnitude over early queries (1 ≤ i < K), averaged over layers, has a 95% "
    f"interval above {MIN_MAGNITUDE} nats. Not consistent if it lies below in some model. (m(i) never rises with i "
    "under a causal mask, by construction, so its direction is not evidence; its size is.)"
)


def claim_c2(models: Mapping[str, AnalysisResult]) -> Judgement:
    rows = [
        row(f"{label}: mask_early", layer_mean(result, "mask_early"), MIN_MAGNITUDE, "above", "nats")
        for label, result in models.items()
    ]
    return judge(rows)


# ------------------------------------------------------------------------------------------------------ C3

C3_CRITERION = (
    f"Position 0 is a closed system in every run (h_0 identical across inputs sharing its token: relative spread "
    f"≤ 1e-6; above 1e-3 it fails), and ablating the "
    f"value at key 0 of all sink heads (α₀ > 0.3) jointly lowers the mean residual-stream magnitude (all queries) of "
    f"the layers after the first ablated one by more than {MIN_SINK_LOWERING:g}% (95% interval below "
    f"−{MIN_SINK_LOWERING:g}%), and by more than each control that ablates as many randomly drawn non-sink heads "
    "(paired difference, interval below 0). Not consistent if the closed system fails, the interval of the sink "
    f"ablation lies above −{MIN_SINK_LOWERING:g}%, or a control lowers it more (difference interval above 0). "
    "Patching the position-0 trajectory from another token is reported beside it, not judged."
)


def claim_c3(
    closed: Mapping[str, float],
    joint: Estimate,
    controls: Sequence[Estimate],
    patch: Estimate | None = None,
) -> Judgement:
    """`closed`: the largest relative spread of h_0 per run (0 when identical); `joint`, `controls`, `patch`: %
    change of the later layers' resid_all under the joint sink ablation, each control draw, the patch."""
    spread = max(closed.values())
    rows = [fact("closed system: largest relative spread of h_0", spread, spread <= 1e-6, spread > 1e-3, "≤ 1e-06")]
    rows.append(row("joint sink-head ablation: change", joint, -MIN_SINK_LOWERING, "below", "%"))
    for k, control in enumerate(controls):
        rows.append(row(f"control draw {k}: change", control, -MIN_SINK_LOWERING, "below", "%", deciding=False))
        rows.append(row(f"sink ablation − control draw {k}", joint.minus(control), 0.0, "below", "% points"))
    if patch is not None:
        rows.append(row("position-0 patch: change", patch, -MIN_SINK_LOWERING, "below", "%", deciding=False))
        for k, control in enumerate(controls):
            rows.append(row(f"patch − control draw {k}", patch.minus(control), 0.0, "below", "% points", False))
    return judge(rows)


# ------------------------------------------------------------------------------------------------------ C4

C4_CRITERION = (
    "Four lines of evidence, each judged on its interval; consistent only when all support the claim. (1) NTK "
    f"scaling at inference, at the largest factor, lowers the residual-stream magnitude (all queries, mean over "
    f"layers) by more than {MIN_NTK_LOWERING:g}%. (2) Between pretrained models, the slope of the residual-stream "
    "magnitude against relative depth orders sliding window > standard RoPE > NTK-scaled RoPE (both differences "
    "above 0). (3) The controlled lab version: one decoder trained three ways on the same data and budget (full "
    "causal RoPE, sliding window, RoPE with an NTK-scaled base), ≥ 2 seeds, orders its slopes the same way "
    "(seed means, both differences above 0, and every seed pair ordered). (4) In the lab, the NTK-scaled base lowers "
    f"the residual-stream magnitude against the standard base by more than {MIN_NTK_LOWERING:g}%. Not consistent if "
    "any line contradicts the claim."
)


@dataclass(frozen=True)
class LabRuns:
    """The controlled C4 experiment: per variant ("rope", "window", "ntk"), one analysis per seed."""

    runs: dict[str, list[AnalysisResult]]

    def slope(self, variant: str) -> Estimate:
        return mean_of([depth_slope(result, "resid_all") for result in self.runs[variant]])

    def seeds_ordered(self, high: str, low: str) -> bool:
        highs = [depth_slope(r, "resid_all").value for r in self.runs[high]]
        lows = [depth_slope(r, "resid_all").value for r in self.runs[low]]
        return min(highs) > max(lows)

    def level_change(self, variant: str, baseline: str) -> Estimate:
        """% change of the layer-mean resid_all, seed by seed (same seed, same evaluation rows: paired), averaged."""
        pairs = zip(self.runs[baseline], self.runs[variant], strict=True)
        return mean_of([percent_change(base, new, "resid_all") for base, new in pairs])


def claim_c4(
    ntk_change: Estimate,
    slopes: Mapping[str, Estimate],
    lab: LabRuns,
    reported: Mapping[str, Estimate] | None = None,
) -> Judgement:
    """`ntk_change`: % change of resid_all under the largest NTK factor; `slopes`: resid_all slope against relative
    depth of "sliding", "standard" and "ntk" (the latter paired with "standard"); `reported`: further slopes shown
    beside the evidence (a model trained with a large base), not judged."""
    rows = [row("(1) NTK at inference: change of resid_all", ntk_change, -MIN_NTK_LOWERING, "below", "%")]
    unit = "nats per depth"
    rows.append(row("(2) slope: sliding − standard", slopes["sliding"].minus(slopes["standard"]), 0.0, "above", unit))
    rows.append(row("(2) slope: standard − NTK", slopes["standard"].minus(slopes["ntk"]), 0.0, "above", unit))
    for name, estimate in slopes.items():
        rows.append(row(f"slope: {name}", estimate, 0.0, "above", unit, deciding=False))
    for name, estimate in (reported or {}).items():
        rows.append(row(f"slope: {name}", estimate, 0.0, "above", unit, deciding=False))
    for high, low in (("window", "rope"), ("rope", "ntk")):
        difference = row(f"(3) lab slope: {high} − {low}", lab.slope(high).minus(lab.slope(low)), 0.0, "above", unit)
        if difference["says"] == "supports" and not lab.seeds_ordered(high, low):
            difference["says"] = "unclear"  # the seed means agree, single seeds do not
        rows.append(difference)
    for variant in ("rope", "window", "ntk"):
        rows.append(row(f"lab slope: {variant} (seed mean)", lab.slope(variant), 0.0, "above", unit, deciding=False))
    rows.append(
        row(
            "(4) lab: NTK base against standard, resid_all",
            lab.level_change("ntk", "rope"),
            -MIN_NTK_LOWERING,
            "below",
            "%",
        )
    )
    return judge(rows)


# ------------------------------------------------------------------------------------------------------ C5

C5_CRITERION = (
    f"removed = −(% change of the early residual-stream magnitude, mean over layers). Consistent if for at least "
    f"one replacement of the BOS embedding the 95% interval of `removed` lies above 0 and meets "
    f"[{BOS_BAND[0]:g}%, {BOS_BAND[1]:g}%] (the paper's {PAPER_BOS_REMOVED:g}% ± 20); not consistent if every "
    "replacement's interval lies outside that band or includes no reduction; else inconclusive."
)


def claim_c5(changes: Mapping[str, Estimate]) -> Judgement:
    """`changes`: per replacement, the % change of resid_early."""
    rows = []
    low, high = BOS_BAND
    for kind, change in changes.items():
        removed = Estimate(-change.value, -change.samples)
        lo, hi = removed.interval
        says: Says = (
            "supports"
            if lo > 0 and hi >= low and lo <= high
            else "contradicts"
            if hi < low or lo > high or hi <= 0
            else "unclear"
        )
        rows.append(
            dict(
                zip(
                    EVIDENCE_COLUMNS,
                    (f"{kind}: removed", removed.value, lo, hi, f"{low:g}–{high:g}", "%", says, True),
                    strict=True,
                )
            )
        )
    return judge(rows, rule="any")


# ------------------------------------------------------------------------------------------------------ C6

C6_CRITERION = (
    f"In every model, the mean pairwise cosine of h_0 across inputs is ≥ {COS_CONSTANT} in every layer with a BOS at "
    f"position 0 and below {COS_VARIES} in at least one layer without it. Not consistent if in some model it falls "
    "below 0.999 with a BOS, or stays at or above 0.999 in every layer without it; between those bands, inconclusive."
)


def claim_c6(fingerprints: Mapping[str, pd.DataFrame]) -> Judgement:
    rows = []
    for label, table in fingerprints.items():
        with_bos, without = float(table["fingerprint_cos_bos"].min()), float(table["fingerprint_cos_nobos"].min())
        rows.append(
            fact(
                f"{label}: least cosine with BOS",
                with_bos,
                with_bos >= COS_CONSTANT,
                with_bos < 0.999,
                f"≥ {COS_CONSTANT}",
            )
        )
        rows.append(
            fact(
                f"{label}: least cosine without BOS", without, without < COS_VARIES, without >= 0.999, f"< {COS_VARIES}"
            )
        )
    return judge(rows)


CRITERIA = {
    "C1": C1_CRITERION,
    "C2": C2_CRITERION,
    "C3": C3_CRITERION,
    "C4": C4_CRITERION,
    "C5": C5_CRITERION,
    "C6": C6_CRITERION,
}
STATEMENTS = {
    "C1": "RoPE-trained models show absolute position in their attention patterns.",
    "C2": "The causal mask makes the softmax denominator depend on the query position.",
    "C3": "Position 0 is a closed system; later queries read its trajectory through sink-reading heads.",
    "C4": "Both components appear in every architecture, in a different balance: NTK suppresses the "
    "residual-stream component, sliding windows let it accumulate with depth, standard RoPE sits between.",
    "C5": f"Replacing the BOS embedding removes about {PAPER_BOS_REMOVED:g}% of the residual-stream component at "
    "early queries.",
    "C6": "Attention sinks pass forward a deterministic fingerprint of the token at position 0: constant across "
    "inputs with an auto-prepended BOS, varying with the token otherwise.",
}
METHODS = {
    "C1": "The decomposition of each model's log-attention into g, m and r (docs/method.md §2–3); the "
    "magnitudes averaged over layers.",
    "C2": "m(i) = −logsumexp over the offsets the mask admits of the relative part g(d) (docs/method.md §2).",
    "C3": "h_0^(l) compared across inputs sharing the token at position 0, in every run; the value at key 0 of every "
    "sink head of smollm2-135m zeroed for queries i ≥ 1 in one run, of as many random non-sink heads in each "
    "control run, and position 0's trajectory replaced by that of another token in a third (docs/method.md §9, §13).",
    "C4": "Slopes of the residual-stream magnitude against relative depth with bootstrap intervals, between the "
    "pretrained models and in a lab decoder trained three ways (docs/method.md §6, §13).",
    "C5": "The embedding output at position 0 of gemma3-270m replaced by the vocabulary mean, a random vector of "
    "the same norm, or zeros, before the forward pass; same sequences as the baseline (docs/method.md §9).",
    "C6": "Mean pairwise cosine similarity of h_0^(l) across inputs, per residual index l (docs/method.md §8).",
}
