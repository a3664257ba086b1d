"""The last lines `analyze`, `intervene` and `paper` print: the result itself, in a few readable lines.

`analyze`: the mean over layers of each measured magnitude with its bootstrap interval (docs/method.md §3, §6), the
ΔR² of absolute position over the offset (§7) and the closed system (§8). `intervene`: the change of each of those
means and of the model's own next-token loss and accuracy, with their paired intervals (§9, §11). `paper`: each
claim's verdict and the one or two rows of evidence that decided it (`Judgement.decided_by`), in both samples.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from posleak.commands.intervene import OVERALL, InterventionRun
from posleak.experiments.evidence import layer_mean
from posleak.experiments.paper.verdict import SAYS, Claim, estimate_text
from posleak.measure import measured_magnitudes
from posleak.pipeline import AnalysisResult

_NAMES = {"resid": "residual stream", "mask": "causal mask"}
# The attention shift of w (docs/method.md §7): forms across halves of the documents, means over layers, no interval.
_SHIFTS = {
    "shift_kl": "attention moved by w, symmetrised KL (nats)",
    "shift_tv": "attention moved by w, total variation",
}
_RANGES = {"early": "early queries", "all": "all queries", "beyond": "queries beyond the window"}
# w split by its keys (docs/method.md §3): resid² = key0² + rest²
_PARTS = {"key0": "its key-0 column", "rest": "without key 0"}


def _measure_description(measure: str) -> str:
    kind, _, where = measure.partition("_")
    queries, _, part = where.partition("_")
    return f"{_NAMES[kind]}, {_RANGES[queries]}" + (f", {_PARTS[part]}" if part else "")


def _interval_text(lo: float, hi: float, fmt: str, unit: str = "") -> str:
    """The interval as " (lo to hi)", or nothing where the run has none (--bootstrap 0)."""
    return "" if pd.isna(lo) or pd.isna(hi) else f" ({lo:{fmt}}{unit} to {hi:{fmt}}{unit})"


def analysis_lines(result: AnalysisResult) -> list[str]:
    """Each magnitude's mean over layers with its 95% interval, ΔR² and the closed system."""
    measures = measured_magnitudes(result.per_layer)
    has_interval = not result.bootstrap.empty
    measurement = result.manifest.get("measurement", {})
    unit = measurement.get("bootstrap", {}).get("unit", "sequence")
    lines = [
        "headline: mean over layers, nats"
        + (f", 95% bootstrap interval over {unit}s" if has_interval else f" ({measurement.get('bootstrap_note')})")
        + " (docs/method.md §3, §6)"
    ]
    width = max(len(m) for m in measures)
    for measure in measures:
        if has_interval:
            estimate = layer_mean(result, measure)
            value, (lo, hi) = estimate.value, estimate.interval
        else:
            value, lo, hi = float(result.per_layer[measure].mean()), float("nan"), float("nan")
        lines.append(
            f"  {measure:<{width}}  {value:.4g}{_interval_text(lo, hi, '.3g')}  {_measure_description(measure)}"
        )
    for kind, what in _SHIFTS.items():
        values = {
            queries: float(result.per_layer[f"{kind}_{queries}"].mean())
            for queries in _RANGES
            if f"{kind}_{queries}" in result.per_layer and result.per_layer[f"{kind}_{queries}"].notna().any()
        }
        if values:
            shown = ", ".join(f"{_RANGES[queries]} {value:.3g}" for queries, value in values.items())
            lines.append(f"  {what}, mean over layers (§7, no interval): {shown}")
    heads = result.per_head
    lines.append(
        f"  ΔR² of absolute position over the offset (§7), mean over heads: logits {heads['dr2_logit'].mean():.3g}, "
        f"log-attention {heads['dr2_logattn'].mean():.3g}"
    )
    closed = result.manifest["closed_system"]
    lines.append(
        f"  position 0 closed system (§8): {'holds' if closed['holds'] else 'VIOLATED'} "
        f"(largest relative spread of h_0 {closed['max_rel_spread']:.2g})"
    )
    return lines


def intervention_lines(run: InterventionRun) -> list[str]:
    """The change of each magnitude's mean over layers and of the next-token loss and accuracy (all queries)."""
    overall = run.effect[run.effect["layer"] == OVERALL]
    unit = run.baseline.manifest.get("measurement", {}).get("bootstrap", {}).get("unit", "sequence")
    lines = [
        f"headline: intervened against baseline, paired 95% bootstrap intervals over {unit}s; magnitudes: the change "
        "of the mean over layers (docs/method.md §9, §11)"
    ]
    width = max(len(m) for m in overall["measure"])
    for e in overall.itertuples():
        change = f"{e.pct_change:+.3g}%{_interval_text(e.pct_lo, e.pct_hi, '+.3g', '%')}"
        lines.append(f"  {e.measure:<{width}}  {e.baseline:.4g} → {e.intervened:.4g} nats, {change}")
    scores = run.behaviour[run.behaviour["bucket"] == "all"].set_index("measure")
    loss, accuracy = scores.loc["loss"], scores.loc["accuracy"]
    lines.append(
        f"  next-token loss, all queries: {loss['baseline']:.4g} → {loss['intervened']:.4g} nats, "
        f"{loss['change']:+.3g}{_interval_text(loss['change_lo'], loss['change_hi'], '+.3g')}"
    )
    lines.append(
        f"  top-1 accuracy, all queries: {100 * accuracy['baseline']:.1f}% → {100 * accuracy['intervened']:.1f}%, "
        f"{100 * accuracy['change']:+.1f} points"
        f"{_interval_text(100 * accuracy['change_lo'], 100 * accuracy['change_hi'], '+.1f')}"
    )
    return lines


def claim_lines(claim: Claim, limit: int = 2) -> list[str]:
    """The claim's verdict, how many deciding rows gave each sample's verdict, and the rows that decided it
    (at most `limit`, the samples' choices taken in turn) with their value and interval in every sample; where no
    deciding row gave the verdict (C3's closed system may decide while no unit can test), the rows that say which
    units cannot test the claim; then each part the claim needs that cannot test, with its first row."""
    counts = []
    for sample, judgement in claim.samples.items():
        deciding = judgement.evidence[judgement.evidence["deciding"]]
        agreeing = int((deciding["says"] == SAYS[judgement.verdict]).sum())
        counts.append(f"{sample} {judgement.verdict}: {agreeing} of {len(deciding)} {SAYS[judgement.verdict]}")
    counts += claim.once_verdicts()
    lines = [f"{claim.claim} {claim.verdict}: {claim.statement} [{'; '.join(counts)}]"]
    for name in claim.deciding(limit):
        values, thresholds = [], []
        for sample, judgement in claim.samples.items():
            rows = judgement.evidence[judgement.evidence["evidence"] == name]
            if not rows.empty:  # a row that one sample has and the other lacks is shown where it is
                e = rows.iloc[0]
                values.append(
                    f"{sample} {estimate_text(e)}{'' if e['says'] == SAYS[judgement.verdict] else ' ' + e['says']}"
                )
                thresholds.append(e["threshold"])
        lines.append(f"    {name}: {'; '.join(values)}; criterion {thresholds[0]}")
    if len(lines) == 1:  # no row gave the verdict: say why (the units that cannot test the claim)
        untestable = [
            name
            for judgement in claim.samples.values()
            for name in judgement.evidence["evidence"]
            if "untestable" in name
        ]
        lines += [f"    nothing decides: {name}" for name in list(dict.fromkeys(untestable))[:limit]]
    # a part the claim needs that cannot test keeps it from consistent: say why (C4's window line)
    lines += [f"    {line}" for line in claim.untested()]
    return lines


def paper_lines(claims: Sequence[Claim]) -> list[str]:
    """Every claim's lines (`claim_lines`)."""
    return [line for claim in claims for line in claim_lines(claim)]
