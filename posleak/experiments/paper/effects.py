"""Effect sizes first (docs/method.md §13): each claim's deciding rows pooled over the samples of a corpus, and for
an inconclusive claim a power projection of the documents per sample that would decide each row a sample left
unclear; and the tables of them that report.html and the docs pages show.

Neither decides anything. A claim's verdict stays the replication of its samples' verdicts (verdict.py) under the
criterion in its module, with its dated revisions; the pooled row is the effect size a reader sees first, its
interval from both samples' documents, with what each sample's own row says beside it as the replication check. The
projection reads the pooled value and spread: the pooled interval comes from C_A + C_B documents, so a sample of C'
documents has one √((C_A + C_B)/C') times as wide, and `documents_to_decide` on the pooled estimate gives C' per
sample.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import pandas as pd
import torch

from posleak.experiments.evidence import Direction, Estimate, Says, pair_resamples
from posleak.experiments.paper.verdict import Bound, Claim, Judged, Judgement


def pooled(estimates: Sequence[Estimate]) -> Estimate:
    """One quantity estimated on disjoint samples, pooled: the mean of the values weighted by each estimate's units
    (equally where any has none), and resample k the same mean of their k-th resamples. The samples' bootstraps
    are independent draws, so their k-th resamples together are one draw of all of them, and the interval is one
    from every sample's documents. Its units: their sum."""
    for other in estimates[1:]:
        pair_resamples(estimates[0], other)  # refuses resamples that do not pair (another number of them)
    counts = [e.units for e in estimates]
    documented = all(c is not None for c in counts)
    weights = torch.tensor([c if documented else 1 for c in counts], dtype=torch.float64)
    weights = weights / weights.sum()
    samples = torch.stack([e.samples.double() for e in estimates])
    value = float(weights @ torch.tensor([e.value for e in estimates], dtype=torch.float64))
    return Estimate(value, weights.to(samples.device) @ samples, sum(c or 0 for c in counts) if documented else None)


def documents_to_decide(estimate: Estimate, threshold: float, direction: Direction) -> tuple[Says, int] | None:
    """A power projection at the estimate's value and spread, not a measurement: how many units (documents) a
    sample would need for its interval to lie wholly on the value's side of `threshold`, and what it would then
    say. The interval's half-width on the side facing the threshold, h, shrinks as 1/√C with C units, so it
    reaches the gap g = |value − threshold| at C' = ⌈C·(h/g)²⌉. None where the estimate draws no documents, has
    no interval, or sits on the threshold."""
    lo, hi = estimate.interval
    gap = estimate.value - threshold
    if estimate.units is None or math.isnan(lo) or gap == 0:
        return None
    half = max(estimate.value - lo if gap > 0 else hi - estimate.value, 0.0)
    says: Says = "supports" if (gap > 0) == (direction == "above") else "contradicts"
    # rounded first, so that floating-point noise in an exact ratio does not add a document
    return says, max(1, math.ceil(round(estimate.units * (half / gap) ** 2, 9)))


POOLED = "pooled A+B"
POOLED_NOTE = (
    f"{POOLED}: each deciding row estimated from both samples' documents (their means weighted by their documents, "
    "resample by resample), judged by its interval alone. The effect size, not the verdict: the verdict needs each "
    "sample to decide, and what each says stands beside it as the replication check."
)
PROJECTION_NOTE = "a power projection at the observed effect and spread, not a measurement"
# one row of evidence in each sample of a corpus: per sample, its row and its estimate and bounds (None: exact)
Found = Mapping[str, tuple[pd.Series, Judged | None]]


def add_effects(claims: Iterable[Claim]) -> None:
    """Each claim's pooled rows and, where it is inconclusive, its projection, from its samples' judged rows."""
    for claim in claims:
        claim.pooled = pooled_rows(claim)
        claim.projection = projection_rows(claim) if claim.verdict == "inconclusive" else []


def pooled_rows(claim: Claim) -> list[dict[str, Any]]:
    """Per corpus, each row deciding in every sample, with an estimate in each, pooled over the samples (an exact
    row has no resamples to pool)."""
    rows = []
    for corpus, name, found in _deciding(claim):
        judged = _judged(found)
        if judged is None:
            continue
        estimate = pooled([j.estimate for j in judged])
        lo, hi = estimate.interval
        samples = {sample: str(row["says"]) for sample, (row, _) in found.items()}
        rows.append(
            {
                **_described(corpus, name, found, judged),
                "label": POOLED,
                "value": estimate.value,
                "lo": lo,
                "hi": hi,
                "says": _says(estimate, judged[0].bounds),
                "samples": samples,
                "agree": len(set(samples.values())) == 1,
                "weights": "documents" if estimate.units is not None else "equal",
            }
        )
    return rows


def projection_rows(claim: Claim) -> list[dict[str, Any]]:
    """Per corpus, each deciding row that some sample left unclear: the documents per sample at which its
    interval would decide, and what it would say (`documents_to_decide` on the pooled estimate); where there is
    none, why."""
    rows = []
    for corpus, name, found in _deciding(claim):
        if all(row["says"] != "unclear" for row, _ in found.values()):
            continue
        judged = _judged(found)
        entry = {**_described(corpus, name, found, judged), "label": PROJECTION_NOTE}
        if judged is None:
            nothing = dict.fromkeys(("value", "lo", "hi", "would_say", "documents_needed"))
            rows.append({**entry, **nothing, "why_none": "an exact row: no interval for documents to narrow"})
            continue
        estimate = pooled([j.estimate for j in judged])
        lo, hi = estimate.interval
        projected = _projected(estimate, judged[0].bounds)
        would, needed = projected if projected else (None, None)
        why = "" if projected else _why_none(estimate)
        rows.append(
            {**entry, "value": estimate.value, "lo": lo, "hi": hi}
            | {"would_say": would, "documents_needed": needed, "why_none": why}
        )
    return rows


def _described(corpus: str, name: str, found: Found, judged: list[Judged] | None) -> dict[str, Any]:
    """What names a row of effects: its corpus, evidence, threshold and unit (the first sample's) and the
    documents each sample's estimate draws (None for an exact row)."""
    first = next(iter(found.values()))[0]
    units = [None] * len(found) if judged is None else [j.estimate.units for j in judged]
    described = {"corpus": corpus, "evidence": name, "threshold": first["threshold"], "unit": first["unit"]}
    return {**described, "documents": dict(zip(found, units, strict=True))}


def _judged(found: Found) -> list[Judged] | None:
    """Each sample's estimate and bounds of the row; None where a sample has none (an exact row)."""
    judged = [j for _, j in found.values() if j is not None]
    return judged if len(judged) == len(found) else None


def _deciding(claim: Claim) -> Iterator[tuple[str, str, Found]]:
    """Per corpus, each row deciding in every one of its samples, in the first sample's order, with its row and
    `Judged` in each (the first of that name). A claim read back from claims.json keeps no `Judged`: none."""
    for corpus, samples in claim.groups().items():
        judgements = {sample: claim.samples[sample] for sample in samples}
        first = judgements[samples[0]].evidence
        for name in dict.fromkeys(first.loc[first["deciding"].astype(bool), "evidence"]):
            found = {sample: _row(judgement, name) for sample, judgement in judgements.items()}
            if all(f is not None and bool(f[0]["deciding"]) for f in found.values()):
                yield corpus, name, {sample: f for sample, f in found.items() if f is not None}


def _row(judgement: Judgement, name: str) -> tuple[pd.Series, Judged | None] | None:
    """The first row named `name` of a sample's evidence with its `Judged`; None where it has none such (a row
    that only one sample could test, or a judgement read back without estimates)."""
    positions = [k for k, evidence in enumerate(judgement.evidence["evidence"]) if evidence == name]
    if not positions or len(judgement.judged) != len(judgement.evidence):
        return None
    return judgement.evidence.iloc[positions[0]], judgement.judged[positions[0]]


def _says(estimate: Estimate, bounds: tuple[Bound, ...]) -> Says:
    """An estimate against one bound, or a band's two: supports where every bound does, contradicts where any
    does (the interval wholly on the wrong side of one end)."""
    says = [estimate.judge(threshold, direction) for threshold, direction in bounds]
    return "contradicts" if "contradicts" in says else "supports" if all(s == "supports" for s in says) else "unclear"


def _projected(estimate: Estimate, bounds: tuple[Bound, ...]) -> tuple[Says, int] | None:
    """The projection against one bound, or a band's two: outside the band, the end it lies beyond decides a
    contradiction; inside, both ends must be cleared, so the larger count."""
    projections = [documents_to_decide(estimate, threshold, direction) for threshold, direction in bounds]
    if any(p is None for p in projections):
        return None
    found = [p for p in projections if p is not None]
    against = [needed for says, needed in found if says == "contradicts"]
    return ("contradicts", min(against)) if against else ("supports", max(needed for _, needed in found))


def _why_none(estimate: Estimate) -> str:
    """Why `documents_to_decide` has no projection for a pooled estimate."""
    if estimate.units is None:
        return "its resamples do not draw documents (the lab line's draw seeds)"
    if pd.isna(estimate.interval[0]):
        return "no interval"
    return "its value lies on the threshold"


def pooled_table(claim: Claim) -> pd.DataFrame:
    """The pooled rows for reading: value and interval to 3 significant digits, what each sample says beside
    the pooled row's own verdict on it, and the documents it pools."""
    corpora = len(claim.groups()) > 1
    return pd.DataFrame(
        [
            {
                **({"corpus": e["corpus"]} if corpora else {}),
                "evidence": e["evidence"],
                POOLED: _value(e),
                "95% interval": _interval(e),
                "threshold": e["threshold"],
                "says": e["says"],
                "samples say (replication)": ", ".join(f"{s} {says}" for s, says in e["samples"].items()),
                "documents": _documents(e["documents"]) + ("" if e["weights"] == "documents" else ", weighted equally"),
            }
            for e in claim.pooled
        ]
    )


def projection_table(claim: Claim) -> pd.DataFrame:
    """The projection rows for reading: the pooled value, the documents per sample now and at which the row
    would decide, and what it would say there."""
    corpora = len(claim.groups()) > 1
    return pd.DataFrame(
        [
            {
                **({"corpus": e["corpus"]} if corpora else {}),
                "evidence": e["evidence"],
                f"{POOLED} (95% interval)": f"{_value(e)} ({_interval(e)})" if e.get("value") is not None else "",
                "threshold": e["threshold"],
                "documents per sample now": _documents(e["documents"]),
                "would decide at (projected)": (
                    f"{e['documents_needed']} documents per sample: {e['would_say']}"
                    if e["documents_needed"] is not None
                    else f"no projection: {e['why_none']}"
                ),
            }
            for e in claim.projection
        ]
    )


def _value(e: Mapping[str, Any]) -> str:
    return f"{e['value']:.4g}{' ' + e['unit'] if e['unit'] else ''}"


def _interval(e: Mapping[str, Any]) -> str:
    return "" if e.get("lo") is None or pd.isna(e["lo"]) else f"{e['lo']:.3g} to {e['hi']:.3g}"


def _documents(documents: Mapping[str, int | None]) -> str:
    return ", ".join(f"{sample} {'?' if count is None else count}" for sample, count in documents.items())
